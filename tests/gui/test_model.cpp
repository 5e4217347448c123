// The inspector's model: loading, sorting, filtering, selection, refresh from the
// events log, actions, statistics, duplicates, entry detail and the text viewer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "gui_test_util.hpp"
#include "kcache/gui/detail.hpp"
#include "kcache/gui/model.hpp"
#include "kcache/gui/text.hpp"

using namespace kcache;
using namespace kcache::test;
using gui::Column;
using gui::Model;

namespace {

std::unique_ptr<Model> open_model(GuiDb& db) {
    Model::Options options;
    options.db_path = db.path();
    options.clock = db.clock().clock();
    auto model = Model::open(options);
    REQUIRE(model);
    return std::move(*model);
}

std::vector<std::string> visible_keys(const Model& model) {
    std::vector<std::string> keys;
    for (std::size_t i = 0; i < model.visible_count(); ++i) {
        keys.emplace_back(model.key(model.visible(i)));
    }
    return keys;
}

// Three entries with distinct sizes, hits, producers and times.
struct ThreeEntries {
    core::Ino a, b, c;
    explicit ThreeEntries(GuiDb& db) {
        a = db.add_entry("aaa111", {{"kernel.cubin", fake_cubin(1, 100)}});
        db.clock().advance(kSecondNs);
        b = db.add_entry("bbb222", {{"k.ttir", std::string(3000, 't')}, {"k.llir", "ll"}});
        db.clock().advance(kSecondNs);
        c = db.add_entry("ccc333", {{"x.vmfb", fake_cubin(3, 1000)}});
        db.hit(b, 5);
        db.hit(c, 2);
    }
};

}  // namespace

TEST_CASE("model: a missing db is an error naming the path, and nothing is created",
          "[gui][model]") {
    TempDir dir;
    Model::Options options;
    options.db_path = (dir / "nope").string();
    auto model = Model::open(options);
    REQUIRE_FALSE(model);
    CHECK(model.error().code == ENOENT);
    CHECK(model.error().message.find(options.db_path) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir / "nope"));
}

TEST_CASE("model: loads every entry with its figures", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    auto model = open_model(db);
    REQUIRE(model->entry_count() == 3);
    REQUIRE(model->visible_count() == 3);
    const gui::EntryRow* b = model->row(e.b);
    REQUIRE(b);
    CHECK(model->key(*b) == "bbb222");
    CHECK(b->files == 2);
    CHECK(b->bytes == 3002);
    CHECK(b->hits == 5);
    CHECK(b->producer == core::Producer::triton);
    CHECK(model->row(e.c)->producer == core::Producer::wave);
    CHECK(model->row(e.a)->producer == core::Producer::kcache);
    CHECK(model->stats().get(core::Counter::hits) == 7);
    CHECK(model->stats().get(core::Counter::misses) == 3);
    CHECK(model->memory_bytes() >= 3 * sizeof(gui::EntryRow));
}

TEST_CASE("model: sorts by every column, both ways, ties by creation", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    auto model = open_model(db);
    using Keys = std::vector<std::string>;
    const Keys abc = {"aaa111", "bbb222", "ccc333"};
    const Keys cba = {"ccc333", "bbb222", "aaa111"};

    model->set_sort({Column::key, false});

    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == abc);
    model->set_sort({Column::key, true});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == cba);
    model->set_sort({Column::hits, true});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == Keys{"bbb222", "ccc333", "aaa111"});
    model->set_sort({Column::bytes, false});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == Keys{"aaa111", "ccc333", "bbb222"});
    model->set_sort({Column::stored_bytes, true});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model).size() == 3);
    model->set_sort({Column::files, true});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model).front() == "bbb222");
    model->set_sort({Column::created, false});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == abc);
    model->set_sort({Column::last_access, true});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model).back() == "aaa111");
    // Producer names: kcache < triton < wave.
    model->set_sort({Column::producer, false});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == abc);
    db.pin(e.b);
    REQUIRE(model->refresh(true));
    model->set_sort({Column::pinned, true});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == Keys{"bbb222", "aaa111", "ccc333"});
}

TEST_CASE("model: keys sharing a long prefix sort by the whole key", "[gui][model]") {
    GuiDb db;
    for (const char* name : {"prefix00-b", "prefix00-a", "prefix00", "prefix01", "prefix00-c"}) {
        db.add_entry(name, {{"x.ptx", name}});
    }
    auto model = open_model(db);
    model->set_sort({Column::key, false});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == std::vector<std::string>{"prefix00", "prefix00-a", "prefix00-b",
                                                           "prefix00-c", "prefix01"});
    model->set_sort({Column::key, true});
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == std::vector<std::string>{"prefix01", "prefix00-c", "prefix00-b",
                                                           "prefix00-a", "prefix00"});
}

TEST_CASE("model: the filter matches keys and producers, case-insensitively", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    auto model = open_model(db);
    model->set_sort({Column::key, false});
    model->wait_idle();  // the worker orders the rows
    model->set_filter("BBB");
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == std::vector<std::string>{"bbb222"});
    model->set_filter("wave");
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == std::vector<std::string>{"ccc333"});
    model->set_filter("3");
    model->wait_idle();  // the worker orders the rows
    CHECK(visible_keys(*model) == std::vector<std::string>{"ccc333"});
    model->set_filter("zzz");
    model->wait_idle();  // the worker orders the rows
    CHECK(model->visible_count() == 0);
    model->set_filter("");
    model->wait_idle();  // the worker orders the rows
    CHECK(model->visible_count() == 3);
}

TEST_CASE("model: selection survives sorting and filtering", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    auto model = open_model(db);
    model->set_sort({Column::key, false});
    model->wait_idle();  // the worker orders the rows
    model->select_only(0);
    CHECK(model->focused() == e.a);
    model->toggle_selected(2);
    CHECK(model->selected_count() == 2);
    model->set_sort({Column::key, true});
    model->wait_idle();  // the worker orders the rows
    model->set_filter("a1");
    model->wait_idle();  // the worker orders the rows
    CHECK(model->visible_count() == 1);
    CHECK(model->selected_count() == 2);
    CHECK(model->selected_inos() == std::vector<core::Ino>{e.a, e.c});
    model->set_filter("");
    model->wait_idle();  // the worker orders the rows
    model->select_only(1);
    CHECK(model->selected_inos() == std::vector<core::Ino>{e.b});
    model->select_range(2, 0);
    CHECK(model->selected_count() == 3);
    model->toggle_selected(0);
    CHECK(model->selected_count() == 2);
    model->clear_selection();
    CHECK(model->selected_count() == 0);
    model->select_all_visible();
    CHECK(model->selected_bytes() == 100 + 3002 + 1000);
}

TEST_CASE("model: refresh follows changes by other writers", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    auto model = open_model(db);
    const auto loads = model->full_loads();

    SECTION("nothing changed: nothing to do") {
        CHECK_FALSE(*model->refresh(true));
    }
    SECTION("hits, pins and evictions apply from the events log") {
        model->set_sort({Column::hits, true});
        model->wait_idle();  // the worker orders the rows
        db.hit(e.a, 3);
        db.pin(e.c);
        db.evict(e.b);
        REQUIRE(*model->refresh(true));
        CHECK(model->row(e.a)->hits == 3);
        CHECK(model->row(e.c)->pinned());
        CHECK(model->row(e.b) == nullptr);
        CHECK(model->entry_count() == 2);
        CHECK(model->visible_count() == 2);
        CHECK(visible_keys(*model) == std::vector<std::string>{"aaa111", "ccc333"});
        CHECK(model->full_loads() == loads);  // incremental, no rescan
        db.hit(e.c, 2);                       // c moves up to its new place
        REQUIRE(*model->refresh(true));
        CHECK(visible_keys(*model) == std::vector<std::string>{"ccc333", "aaa111"});
    }
    SECTION("new entries appear, and files published into them later count") {
        const core::Ino d = db.add_entry("ddd444", {{"a.ptx", "ptx"}});
        REQUIRE(*model->refresh(true));
        REQUIRE(model->row(d));
        CHECK(model->row(d)->bytes == 3);
        db.add_file("ddd444", "b.cubin", fake_cubin(9, 50));
        REQUIRE(*model->refresh(true));
        CHECK(model->row(d)->files == 2);
        CHECK(model->row(d)->bytes == 53);
        CHECK(model->full_loads() == loads);
    }
    SECTION("files published into an older entry apply from its update events") {
        // aaa111 was populated before the model looked: the feed's update events
        // alone bring its new files, with no reload and no list of entries to watch.
        db.add_file("aaa111", "more.ptx", "extra");
        db.add_file("aaa111", "more2.ptx", "extra");
        REQUIRE(*model->refresh(true));
        CHECK(model->row(e.a)->files == 3);
        CHECK(model->row(e.a)->bytes == 110);
        CHECK(model->full_loads() == loads);
    }
    SECTION("a rewritten file's new size applies from the feed, long after the populate") {
        const core::Ino d = db.add_entry("ddd444", {{"k.cubin", fake_cubin(9, 50)}});
        REQUIRE(*model->refresh(true));
        REQUIRE(model->row(d));
        CHECK(model->row(d)->bytes == 50);
        db.clock().advance(kDayNs);  // far past any window of lately populated entries
        REQUIRE(db.store().update([&](core::WriteTxn& txn) -> core::Status {
            const auto file = KCACHE_TRY(txn.resolve("ddd444/k.cubin"));
            KCACHE_TRY(txn.write(file, fake_cubin(9, 4000), core::Origin{4242, "testcc"}));
            return {};
        }));
        REQUIRE(*model->refresh(true));
        CHECK(model->row(d)->files == 1);
        CHECK(model->row(d)->bytes == 4000);
        CHECK(model->full_loads() == loads);
    }
    SECTION("a file outside every entry changes the gauges only: no reload") {
        const auto bytes = model->stats().get(core::Counter::bytes);
        REQUIRE(db.store().update([&](core::WriteTxn& txn) -> core::Status {
            const auto lock = KCACHE_TRY(txn.create(core::kRootIno, "cache.lock", 0644));
            KCACHE_TRY(txn.write(lock.ino, "12345", core::Origin{4242, "testcc"}));
            return {};
        }));
        REQUIRE(model->refresh(true));
        CHECK(model->stats().get(core::Counter::bytes) == bytes + 5);
        CHECK(model->entry_count() == 3);
        CHECK(model->full_loads() == loads);
    }
    SECTION("selected entries evicted elsewhere leave the selection") {
        model->select_all_visible();
        db.evict(e.a);
        REQUIRE(*model->refresh(true));
        CHECK(model->selected_count() == 2);
    }
}

TEST_CASE("model: evicting the selection removes those entries from the db", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    db.pin(e.c);
    auto model = open_model(db);
    model->set_sort({Column::key, false});
    model->wait_idle();         // the worker orders the rows
    model->select_only(0);      // aaa111
    model->toggle_selected(2);  // ccc333, pinned: kept
    auto report = model->evict_selected();
    REQUIRE(report);
    CHECK(report->entries == 1);
    CHECK(report->skipped == 1);
    CHECK(report->message.find("evicted 1 entry") != std::string::npos);
    CHECK_FALSE(db.exists("aaa111"));
    CHECK(db.exists("ccc333"));
    CHECK(model->row(e.a) == nullptr);
    CHECK(visible_keys(*model) == std::vector<std::string>{"bbb222", "ccc333"});
    CHECK(model->stats().get(core::Counter::evicted_entries) == 1);
}

TEST_CASE("model: pin, unpin, evict older than, clear", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    auto model = open_model(db);
    model->set_sort({Column::key, false});
    model->wait_idle();  // the worker orders the rows
    model->select_only(1);
    REQUIRE(model->set_selected_pinned(true));
    CHECK(model->row(e.b)->pinned());
    {
        auto txn = db.store().read();
        CHECK(txn->entry(e.b)->pinned);
    }

    db.clock().advance(10 * kDayNs);
    db.hit(e.c);  // c is fresh again
    auto older = model->evict_older_than(7 * kDayNs);
    REQUIRE(older);
    CHECK(older->entries == 1);  // a; b is pinned, c was used just now
    CHECK_FALSE(db.exists("aaa111"));
    CHECK(db.exists("ccc333"));

    auto cleared = model->clear();
    REQUIRE(cleared);
    CHECK(cleared->entries == 1);
    CHECK(db.exists("bbb222"));
    CHECK(model->entry_count() == 1);

    model->select_all_visible();
    REQUIRE(model->set_selected_pinned(false));
    CHECK_FALSE(model->row(e.b)->pinned());
}

TEST_CASE("model: a read-only model refuses actions and leaves the db alone", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    Model::Options options;
    options.db_path = db.path();
    options.read_only = true;
    auto model = Model::open(options);
    REQUIRE(model);
    CHECK((*model)->read_only());
    (*model)->select_all_visible();
    CHECK_FALSE((*model)->evict_selected());
    CHECK(db.exists("aaa111"));
}

TEST_CASE("model: statistics: timeline, top entries, bytes by producer", "[gui][model]") {
    GuiDb db;
    ThreeEntries e(db);
    auto model = open_model(db);
    const gui::Timeline& t = model->timeline();
    REQUIRE(t.bucket_ns > 0);
    std::uint32_t hits = 0, populates = 0;
    for (std::size_t i = 0; i < t.hits.size(); ++i) {
        hits += t.hits[i];
        populates += t.populates[i];
    }
    CHECK(hits == 7);
    CHECK(populates == 3);
    const std::size_t last = t.hits.size() - 1;
    CHECK(t.hit_rate(last) == Approx(7.0 / 8.0));  // all of it within one bucket (2 s)

    REQUIRE(model->top_by_hits().size() == 2);  // entries without hits are not "top"
    CHECK(model->row_at(model->top_by_hits()[0]).ino == e.b);
    CHECK(model->row_at(model->top_by_hits()[1]).ino == e.c);
    REQUIRE(model->top_by_size().size() == 3);
    CHECK(model->row_at(model->top_by_size()[0]).ino == e.b);

    const auto& producers = model->by_producer();
    REQUIRE(producers.size() == 3);
    CHECK(producers[0].producer == core::Producer::triton);
    CHECK(producers[0].bytes == 3002);
    CHECK(producers[0].entries == 1);
}

TEST_CASE("model: duplicates group one binary stored under several keys", "[gui][model]") {
    GuiDb db;
    const std::string same = fake_cubin(7, 900);
    const core::Ino a = db.add_entry("key-a", {{"kernel.cubin", same}, {"kernel.json", "{}"}});
    const core::Ino b =
        db.add_entry("key-b", {{"kernel.cubin", same}, {"kernel.json", "{\"x\":1}"}});
    db.add_entry("key-c", {{"kernel.cubin", fake_cubin(8, 900)}});
    // The same binary twice inside one entry is not a key problem.
    db.add_entry("key-d", {{"one.cubin", fake_cubin(9, 300)}, {"two.cubin", fake_cubin(9, 300)}});
    // Identical text (not binary) under two keys is not reported either.
    db.add_entry("key-e", {{"k.ptx", "same"}});
    db.add_entry("key-f", {{"k.ptx", "same"}});
    auto model = open_model(db);
    CHECK_FALSE(model->duplicates().started());
    gui::DuplicateScan scan;  // the worker's scan, driven here on the test's own store
    CHECK_FALSE(scan.started());
    std::vector<core::Ino> inos;
    for (std::size_t i = 0; i < model->visible_count(); ++i) inos.push_back(model->visible(i).ino);
    REQUIRE(scan.start(db.store(), inos));
    CHECK(scan.running());
    REQUIRE(scan.run_to_end());
    CHECK(scan.done());
    CHECK(scan.scanned() == 6);
    REQUIRE(scan.groups().size() == 1);
    const gui::DuplicateGroup& g = scan.groups()[0];
    CHECK(g.entries == std::vector<core::Ino>{a, b});
    CHECK(g.keys == std::vector<std::string>{"key-a", "key-b"});
    CHECK(g.size == 900);
    CHECK(g.file_name == "kernel.cubin");
    CHECK(g.wasted_bytes() == 900);
}

TEST_CASE("model: entry detail lists files and prepares each for viewing", "[gui][model]") {
    GuiDb db;
    const core::Ino ino = db.add_entry(
        "kern",
        {{"kernel.json", R"({"name":"axpy","num_warps":4})"},
         {"kernel.ptx", ".version 8.0\n.target sm_80\n.visible .entry axpy()\n{\n ret;\n}\n"},
         {"kernel.cubin", fake_cubin(1, 100)},
         {"notes.txt", "line one\nline two\n"}});
    auto detail = gui::EntryDetail::load(db.store(), ino);
    REQUIRE(detail);
    CHECK(detail->info().name == "kern");
    REQUIRE(detail->files().size() == 4);
    CHECK(detail->files()[0].path == "kernel.cubin");
    CHECK(detail->files()[0].role == core::Role::binary);
    CHECK(detail->files()[0].attr.size == 100);
    CHECK(detail->files()[1].role == core::Role::signature);
    CHECK(detail->files()[2].role == core::Role::ir);

    auto cubin = gui::load_file_view(db.store(), detail->files()[0]);
    REQUIRE(cubin);
    CHECK(cubin->kind == gui::FileView::Kind::binary);
    CHECK(cubin->bytes.size() == 100);
    CHECK_FALSE(cubin->binary);  // not a real cubin: the loader says why
    CHECK_FALSE(cubin->binary_error.empty());

    auto sig = gui::load_file_view(db.store(), detail->files()[1]);
    REQUIRE(sig);
    CHECK(sig->kind == gui::FileView::Kind::signature);
    CHECK(sig->text.line_count() == 4);  // pretty-printed: {, two members, }
    CHECK(sig->text.line(1) == "  \"name\": \"axpy\",");

    auto ptx = gui::load_file_view(db.store(), detail->files()[2]);
    REQUIRE(ptx);
    CHECK(ptx->kind == gui::FileView::Kind::text);
    CHECK(ptx->text.line_count() == 6);
    CHECK(ptx->binary == std::nullopt);

    auto truncated = gui::load_file_view(db.store(), detail->files()[3], 5);
    REQUIRE(truncated);
    CHECK(truncated->truncated);
    CHECK(truncated->text.text() == "line ");
}

TEST_CASE("model: the loader introspects a real PTX binary view", "[gui][model]") {
    GuiDb db;
    const std::string ptx =
        ".version 8.0\n.target sm_80\n.address_size 64\n"
        ".visible .entry axpy(\n.param .u64 axpy_param_0,\n.param .f32 "
        "axpy_param_1\n)\n{\nret;\n}\n";
    const core::Ino ino = db.add_entry("p", {{"kernel.ptx", ptx}});
    auto detail = gui::EntryDetail::load(db.store(), ino);
    REQUIRE(detail);
    gui::EntryFile file = detail->files()[0];
    file.role = core::Role::binary;  // as the viewer does for "show as binary"
    auto view = gui::load_file_view(db.store(), file);
    REQUIRE(view);
    REQUIRE(view->binary);
    CHECK(view->binary->format == loader::Format::ptx);
    CHECK(view->binary->arch == "sm_80");
    REQUIRE(view->binary->kernels.size() == 1);
    CHECK(view->binary->kernels[0].name == "axpy");
    CHECK(view->binary->kernels[0].params.size() == 2);
}

TEST_CASE("text: lines, search with wrap-around, hex lines", "[gui][model]") {
    gui::TextDocument doc("alpha\nBeta\r\ngamma\nbeta two\n");
    REQUIRE(doc.line_count() == 4);
    CHECK(doc.line(1) == "Beta");
    CHECK(doc.line(3) == "beta two");
    CHECK(doc.find("BETA", 0) == 1u);
    CHECK(doc.find("beta", 1) == 3u);
    CHECK(doc.find("beta", 3) == 1u);  // wraps
    CHECK(doc.find("beta", 1, false) == 3u);
    CHECK(doc.find("delta", 0) == std::nullopt);
    CHECK(doc.find("", 0) == std::nullopt);
    CHECK(doc.count_matching_lines("a") == 4);
    CHECK(gui::TextDocument("").line_count() == 1);
    CHECK(gui::TextDocument("no newline").line(0) == "no newline");

    const std::string bytes(
        "KCACHE\x00\x01\x7f"
        "0123456789",
        19);
    CHECK(gui::hex_line_count(bytes.size()) == 2);
    CHECK(gui::hex_line(bytes, 0) ==
          "00000000  4b 43 41 43 48 45 00 01  7f 30 31 32 33 34 35 36  |KCACHE...0123456|");
    CHECK(gui::hex_line(bytes, 1).rfind("00000010  37 38 39", 0) == 0);
    CHECK(gui::looks_like_text("hello\n"));
    CHECK_FALSE(gui::looks_like_text(std::string("a\0b", 3)));
}
