// Export and import of entries as a bundle file.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/bundle.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::kRootIno;
namespace fs = std::filesystem;

namespace {

const std::int64_t kMtime = 1'650'000'000'123'456'789;
const std::string kJson = "{\"name\": \"add_kernel\", \"num_warps\": 4}";

// Three entries covering what a bundle must carry.
void populate_source(TestStore& ts) {
    ts.put("k1/kernel.cubin", all_byte_values());
    ts.put("k1/kernel.json", kJson);
    ts.put("k1/empty", "");
    ts.put("k1/sub/deep.ptx", compressible_text(200 << 10));
    ts.put("k2/launcher.so", random_bytes(300 << 10, 9));
    ts.put("jax-flat-entry", random_bytes(1000, 10));
    auto txn = ts.write();
    KC_MUST(txn.symlink(KC_MUST(txn.resolve("k1")), "link", "kernel.cubin"));
    KC_MUST(txn.setattr(KC_MUST(txn.resolve("k2/launcher.so")), set_mode(0755)));
    KC_MUST(txn.setattr(KC_MUST(txn.resolve("k1/kernel.json")), set_mtime(kMtime)));
    KC_MUST(txn.commit());
}

std::uint64_t source_bytes() {
    return 512 + kJson.size() + 0 + (200 << 10) + (300 << 10) + 1000;
}

std::vector<std::string> dir_listing(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

struct DbState {
    std::map<std::string, Node> tree;
    std::uint64_t entries = 0;
    std::uint64_t bytes = 0;
    std::uint64_t blobs = 0;
};

DbState state_of(TestStore& ts) {
    return {tree_snapshot(ts.read()), ts.counter(Counter::entries), ts.counter(Counter::bytes),
            ts.counter(Counter::blobs)};
}

void check_unchanged(TestStore& ts, const DbState& before) {
    auto after = state_of(ts);
    INFO("before:\n" << describe_tree(before.tree) << "after:\n" << describe_tree(after.tree));
    CHECK(after.tree == before.tree);
    CHECK(after.entries == before.entries);
    CHECK(after.bytes == before.bytes);
    CHECK(after.blobs == before.blobs);
}

std::size_t replace_all(std::string& bytes, const std::string& from, const std::string& to) {
    REQUIRE(from.size() == to.size());
    std::size_t count = 0;
    for (auto pos = bytes.find(from); pos != std::string::npos; pos = bytes.find(from, pos + 1)) {
        bytes.replace(pos, from.size(), to);
        ++count;
    }
    return count;
}

}  // namespace

TEST_CASE("bundle: export then import into a fresh db is byte-exact", "[bundle]") {
    TestStore src;
    populate_source(src);
    TempDir out;
    const auto bundle = (out / "all.kcb").string();

    auto exported = KC_MUST(core::export_bundle(src.store(), {}, bundle));
    CHECK(exported.entries == 3);
    CHECK(exported.bytes == source_bytes());
    CHECK((exported.files == 6 || exported.files == 7));  // with or without the symlink
    CHECK(exported.bundle_bytes == fs::file_size(bundle));
    CHECK(dir_listing(out.path()) == std::vector<std::string>{"all.kcb"});

    TestStore dst;
    auto imported = KC_MUST(core::import_bundle(dst.store(), bundle));
    CHECK(imported.entries_added == 3);
    CHECK(imported.entries_replaced == 0);
    CHECK(imported.entries_skipped == 0);
    CHECK(imported.bytes == source_bytes());
    CHECK(imported.files == exported.files);

    auto want = tree_snapshot(src.read());
    auto got = tree_snapshot(dst.read());
    INFO("source:\n" << describe_tree(want) << "imported:\n" << describe_tree(got));
    CHECK(got == want);
    CHECK(dst.get("k1/kernel.cubin") == all_byte_values());
    CHECK(dst.get("k1/empty").empty());
    CHECK(dst.attr("k1/link").is_symlink());
    CHECK(dst.attr("k2/launcher.so").mode == (S_IFREG | 0755));
    CHECK(dst.attr("k1/kernel.json").mtime_ns == kMtime);
    CHECK(dst.counter(Counter::imported_entries) == 3);
    CHECK(dst.counter(Counter::entries) == 3);
    CHECK(dst.entry_names().size() == 3);
    check_consistent(dst.store());

    SECTION("importing again skips present entries unless asked to replace") {
        auto again = KC_MUST(core::import_bundle(dst.store(), bundle));
        CHECK(again.entries_added == 0);
        CHECK(again.entries_skipped == 3);
        CHECK(tree_snapshot(dst.read()) == want);

        dst.put("k1/kernel.cubin", "locally changed");
        dst.put("k1/local-only", "local");
        auto skipped = KC_MUST(core::import_bundle(dst.store(), bundle));
        CHECK(skipped.entries_skipped == 3);
        CHECK(dst.get("k1/kernel.cubin") == "locally changed");

        auto replaced = KC_MUST(core::import_bundle(dst.store(), bundle, true));
        CHECK(replaced.entries_replaced == 3);
        CHECK(replaced.entries_added == 0);
        CHECK(tree_snapshot(dst.read()) == want);  // the local-only file is gone too
        check_consistent(dst.store());
    }
    SECTION("an import appends import events") {
        std::size_t imports = 0;
        auto txn = dst.read();
        KC_MUST(txn.for_each_event(0, [&](const core::Event& e) {
            if (e.kind == core::EventKind::import) ++imports;
            return true;
        }));
        CHECK(imports >= 1);
    }
}

TEST_CASE("bundle: exporting named entries exports only those", "[bundle]") {
    TestStore src;
    populate_source(src);
    TempDir out;
    const auto bundle = (out / "some.kcb").string();
    auto exported = KC_MUST(core::export_bundle(src.store(), {"k2", "jax-flat-entry"}, bundle));
    CHECK(exported.entries == 2);
    CHECK(exported.bytes == (300 << 10) + 1000);

    TestStore dst;
    KC_MUST(core::import_bundle(dst.store(), bundle));
    CHECK(dst.entry_names() == std::vector<std::string>{"k2", "jax-flat-entry"});
    CHECK(dst.get("k2/launcher.so") == src.get("k2/launcher.so"));
    CHECK(dst.get("jax-flat-entry") == src.get("jax-flat-entry"));
    check_consistent(dst.store());
}

TEST_CASE("bundle: an empty db exports an empty bundle that imports as nothing", "[bundle]") {
    TestStore src;
    TempDir out;
    const auto bundle = (out / "empty.kcb").string();
    auto exported = KC_MUST(core::export_bundle(src.store(), {}, bundle));
    CHECK(exported.entries == 0);
    TestStore dst;
    auto imported = KC_MUST(core::import_bundle(dst.store(), bundle));
    CHECK(imported.entries_added == 0);
    CHECK(dst.counter(Counter::entries) == 0);
}

TEST_CASE("bundle: a failed export leaves no file behind", "[bundle]") {
    TestStore src;
    populate_source(src);
    TempDir out;
    SECTION("an unknown entry name") {
        auto r =
            core::export_bundle(src.store(), {"k1", "no-such-entry"}, (out / "x.kcb").string());
        CHECK(err(r) == ENOENT);
        CHECK(dir_listing(out.path()).empty());
    }
    SECTION("a missing output directory") {
        auto r = core::export_bundle(src.store(), {}, (out / "missing" / "x.kcb").string());
        REQUIRE_FALSE(r.has_value());
        CHECK_FALSE(r.error().message.empty());
        CHECK(dir_listing(out.path()).empty());
    }
}

TEST_CASE("bundle: a damaged bundle is refused and changes nothing", "[bundle]") {
    TestStore src;
    populate_source(src);
    TempDir out;
    const auto good = (out / "good.kcb").string();
    KC_MUST(core::export_bundle(src.store(), {}, good));
    const auto bytes = read_file(good);
    REQUIRE(bytes.size() > 100);

    TestStore dst;
    dst.put("k1/kernel.cubin", "pre-existing");
    dst.put("mine/file", "mine");
    const auto before = state_of(dst);
    const auto bad = (out / "bad.kcb").string();

    SECTION("truncated") {
        for (std::size_t size :
             {std::size_t{0}, std::size_t{8}, bytes.size() / 2, bytes.size() - 1}) {
            INFO("truncated to " << size << " of " << bytes.size() << " bytes");
            write_file(bad, bytes.substr(0, size));
            auto r = core::import_bundle(dst.store(), bad, true);
            REQUIRE_FALSE(r.has_value());
            CHECK(r.error().code != 0);
            CHECK_FALSE(r.error().message.empty());
            check_unchanged(dst, before);
        }
    }
    SECTION("one byte flipped in the middle") {
        auto damaged = bytes;
        damaged[damaged.size() / 2] = static_cast<char>(damaged[damaged.size() / 2] ^ 0x20);
        write_file(bad, damaged);
        CHECK_FALSE(core::import_bundle(dst.store(), bad, true).has_value());
        check_unchanged(dst, before);
    }
    SECTION("not a bundle at all") {
        write_file(bad, random_bytes(4096, 77));
        CHECK_FALSE(core::import_bundle(dst.store(), bad, true).has_value());
        check_unchanged(dst, before);
    }
    SECTION("a missing file: ENOENT") {
        CHECK(err(core::import_bundle(dst.store(), (out / "nope.kcb").string())) == ENOENT);
        check_unchanged(dst, before);
    }
    CHECK(dst.counter(Counter::imported_entries) == 0);
    check_consistent(dst.store());
}

TEST_CASE("bundle: names that could escape the cache are refused", "[bundle]") {
    TestStore src;
    src.put("EVILNAMEXX/Q7", "hello");
    src.put("EVILNAMEXX/ok", "world");
    TempDir out;
    const auto path = (out / "evil.kcb").string();
    KC_MUST(core::export_bundle(src.store(), {}, path));
    const auto bytes = read_file(path);

    TestStore dst;
    dst.put("mine/file", "mine");
    const auto before = state_of(dst);
    // /tmp/x may be anyone's: only its appearance would be this import's doing.
    const bool outside_x_before = fs::exists(out.path().parent_path() / "x");

    struct Case {
        const char* what;
        std::string from;
        std::string to;
    };
    for (const auto& c :
         {Case{"'..' components in the entry name", "EVILNAMEXX", "../../../x"},
          Case{"an absolute entry name", "EVILNAMEXX", "/etc/passw"},
          Case{"an empty component in the entry name", "EVILNAMEXX", "aa//bbbbbb"},
          Case{"a file named '..'", "Q7", ".."},
          Case{"an entry named '..'", "EVILNAMEXX", std::string("..\0\0\0\0\0\0\0\0", 10)}}) {
        INFO(c.what);
        auto crafted = bytes;
        REQUIRE(replace_all(crafted, c.from, c.to) >= 1);  // names are stored as plain bytes
        const auto bad = (out / "crafted.kcb").string();
        write_file(bad, crafted);
        auto r = core::import_bundle(dst.store(), bad, true);
        REQUIRE_FALSE(r.has_value());
        CHECK_FALSE(r.error().message.empty());
        check_unchanged(dst, before);
    }
    CHECK_FALSE(fs::exists(dst.dir() / "x"));
    if (!outside_x_before) CHECK_FALSE(fs::exists(out.path().parent_path() / "x"));
}

TEST_CASE("bundle: entries replaced by an import are not counted as evictions", "[bundle][stats]") {
    // evicted_entries counts "entries removed by eviction (automatic or kcache evict)"
    // (docs/stats.md); an import that replaces an entry is neither.
    TestStore src;
    populate_source(src);
    TempDir out;
    const auto bundle = (out / "all.kcb").string();
    KC_MUST(core::export_bundle(src.store(), {}, bundle));
    TestStore dst;
    KC_MUST(core::import_bundle(dst.store(), bundle));
    auto replaced = KC_MUST(core::import_bundle(dst.store(), bundle, true));
    REQUIRE(replaced.entries_replaced == 3);
    CHECK(dst.counter(Counter::evicted_entries) == 0);
    CHECK(dst.counter(Counter::evicted_bytes) == 0);
}
