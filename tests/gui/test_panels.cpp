// The panels driven through Dear ImGui with no display and no renderer (a "null
// backend": the test feeds mouse and keys, ImGui builds frames nobody draws). The
// test clicks where the last frame drew a widget and checks what the click did to
// the db, not only to the model.
#include <catch2/catch.hpp>

#include <imgui.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gui_test_util.hpp"
#include "kcache/core/misses.hpp"
#include "kcache/core/statistics.hpp"
#include "kcache/gui/model.hpp"
#include "kcache/gui/panels.hpp"

using namespace kcache;
using namespace kcache::test;
using gui::Column;
using gui::Widget;

namespace {

// Keys the test presses, as the backend would index io.KeysDown.
constexpr int kKeyDelete = 300;
constexpr int kKeyEscape = 301;
constexpr int kKeyEnter = 302;
constexpr int kKeyA = 303;
constexpr int kKeyF = 'F';  // what the GLFW backend uses for letters (see panels.cpp)

class NullUi {
  public:
    NullUi(GuiDb& db) {
        gui::Model::Options options;
        options.db_path = db.path();
        options.clock = db.clock().clock();
        auto model = gui::Model::open(options);
        REQUIRE(model);
        m_model = std::move(*model);

        ImGui::CreateContext();
        ImGuiIO& io = ImGui::GetIO();
        io.IniFilename = nullptr;  // nothing written anywhere
        io.DisplaySize = ImVec2(1600, 1000);
        io.DeltaTime = 1.0f / 60.0f;
        io.KeyMap[ImGuiKey_Delete] = kKeyDelete;
        io.KeyMap[ImGuiKey_Escape] = kKeyEscape;
        io.KeyMap[ImGuiKey_Enter] = kKeyEnter;
        io.KeyMap[ImGuiKey_A] = kKeyA;
        unsigned char* pixels = nullptr;
        int w = 0, h = 0;
        io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);  // a font atlas, never uploaded
        frames(3);                                      // tables settle their widths
    }
    ~NullUi() { ImGui::DestroyContext(); }
    NullUi(const NullUi&) = delete;
    NullUi& operator=(const NullUi&) = delete;

    gui::Model& model() { return *m_model; }
    gui::UiState& ui() { return m_ui; }

    void frames(int n = 1) {
        for (int i = 0; i < n; ++i) {
            ImGui::NewFrame();
            gui::draw_inspector(*m_model, m_ui);
            ImGui::Render();
            // What the frame asked the worker for is done before the next frame.
            m_model->wait_idle();
        }
    }

    void click(const gui::Rect& r, bool ctrl = false, bool shift = false) {
        REQUIRE(r.valid);
        ImGuiIO& io = ImGui::GetIO();
        io.MousePos = ImVec2(r.cx(), r.cy());
        frames();
        io.KeyCtrl = ctrl;
        io.KeyShift = shift;
        io.MouseDown[0] = true;
        frames();
        io.MouseDown[0] = false;
        frames();
        io.KeyCtrl = io.KeyShift = false;
        frames();
    }
    void click(Widget w) { click(m_ui.rect(w)); }
    void click_row(std::size_t visible_index, bool ctrl = false, bool shift = false) {
        REQUIRE(visible_index >= m_ui.first_row_drawn);
        REQUIRE(visible_index - m_ui.first_row_drawn < m_ui.row_rects.size());
        click(m_ui.row_rects[visible_index - m_ui.first_row_drawn], ctrl, shift);
    }
    void click_header(Column c) { click(m_ui.header_rects[static_cast<std::size_t>(c)]); }

    void press(int key, bool ctrl = false) {
        ImGuiIO& io = ImGui::GetIO();
        io.KeyCtrl = ctrl;
        io.KeysDown[key] = true;
        frames();
        io.KeysDown[key] = false;
        io.KeyCtrl = false;
        frames();
    }
    void type(const std::string& text) {
        for (char c : text) {
            ImGui::GetIO().AddInputCharacter(static_cast<unsigned char>(c));
            frames();
        }
    }

  private:
    std::unique_ptr<gui::Model> m_model;
    gui::UiState m_ui;
};

struct Entries {
    core::Ino a, b, c;
    explicit Entries(GuiDb& db) {
        a = db.add_entry("aaa111", {{"kernel.cubin", fake_cubin(1, 100)}});
        db.clock().advance(kSecondNs);
        b = db.add_entry("bbb222", {{"kernel.json", R"({"name":"b"})"},
                                    {"kernel.ptx", ".version 8.0\n.target sm_80\n// b\n"}});
        db.clock().advance(kSecondNs);
        c = db.add_entry("ccc333", {{"kernel.cubin", fake_cubin(1, 100)}});  // same as a
        db.hit(b, 4);
        db.hit(c, 1);
    }
};

}  // namespace

TEST_CASE("panels: the evict button evicts the clicked entry, after confirmation",
          "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    // Default order: last access, newest first.
    REQUIRE(ui.model().visible_count() == 3);
    const std::string key(ui.model().key(ui.model().visible(0)));
    ui.click_row(0);
    CHECK(ui.model().selected_count() == 1);
    CHECK(ui.model().focused() == ui.model().visible(0).ino);

    ui.click(Widget::evict_selected);
    CHECK(ui.ui().pending == gui::PendingAction::evict_selected);
    CHECK(db.exists(key));  // nothing happens before the confirmation
    REQUIRE(ui.ui().rect(Widget::confirm).valid);
    ui.click(Widget::confirm);
    CHECK_FALSE(db.exists(key));
    CHECK(ui.model().visible_count() == 2);
    CHECK(ui.ui().status.find("evicted 1 entry") != std::string::npos);
    CHECK_FALSE(ui.ui().rect(Widget::confirm).valid);  // the dialog closed
}

TEST_CASE("panels: Delete asks to evict the selection, Cancel keeps it", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    auto key_at = [&](std::size_t i) { return std::string(ui.model().key(ui.model().visible(i))); };
    const std::string first = key_at(0), middle = key_at(1), last = key_at(2);
    ui.click_row(0);
    ui.click_row(2, /*ctrl=*/true);
    CHECK(ui.model().selected_count() == 2);
    ui.press(kKeyDelete);
    REQUIRE(ui.ui().rect(Widget::cancel).valid);
    ui.click(Widget::cancel);
    CHECK(ui.model().entry_count() == 3);
    CHECK(db.exists(first));
    CHECK(db.exists(last));

    ui.press(kKeyDelete);
    ui.press(kKeyEnter);  // confirms, as the button does
    CHECK_FALSE(db.exists(first));
    CHECK_FALSE(db.exists(last));
    CHECK(db.exists(middle));
}

TEST_CASE("panels: Ctrl+F focuses the filter and typing filters the table", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    ui.press(kKeyF, /*ctrl=*/true);
    ui.type("bbb");
    CHECK(ui.model().filter() == "bbb");
    REQUIRE(ui.model().visible_count() == 1);
    CHECK(ui.model().key(ui.model().visible(0)) == "bbb222");
    // Delete while typing edits the text; it never evicts.
    ui.click_row(0);
    ui.press(kKeyF, true);
    ui.press(kKeyDelete);
    CHECK(ui.ui().pending == gui::PendingAction::none);
    CHECK(db.exists("bbb222"));
}

TEST_CASE("panels: clicking a header sorts by that column, again reverses", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    ui.click_header(Column::hits);
    CHECK(ui.model().sort() == gui::SortSpec{Column::hits, true});
    CHECK(ui.model().key(ui.model().visible(0)) == "bbb222");
    ui.click_header(Column::hits);
    CHECK(ui.model().sort() == gui::SortSpec{Column::hits, false});
    CHECK(ui.model().key(ui.model().visible(0)) == "aaa111");
    ui.click_header(Column::key);
    CHECK(ui.model().sort().column == Column::key);
    CHECK(ui.model().key(ui.model().visible(0)) == "aaa111");
}

TEST_CASE("panels: shift-click selects a range, pin and unpin are confirmed", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    ui.click_row(0);
    ui.click_row(2, false, /*shift=*/true);
    CHECK(ui.model().selected_count() == 3);
    ui.click(Widget::pin);
    ui.click(Widget::confirm);
    {
        auto txn = db.store().read();
        CHECK(txn->entry(e.a)->pinned);
        CHECK(txn->entry(e.b)->pinned);
    }
    // Pinned entries survive Clear.
    ui.click(Widget::clear);
    ui.click(Widget::confirm);
    CHECK(db.exists("aaa111"));
    ui.click(Widget::unpin);
    ui.click(Widget::confirm);
    CHECK_FALSE(db.store().read()->entry(e.a)->pinned);
    ui.click(Widget::clear);
    ui.click(Widget::confirm);
    CHECK(ui.model().entry_count() == 0);
    CHECK_FALSE(db.exists("bbb222"));
}

TEST_CASE("panels: evict older than evicts only idle entries", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    db.clock().advance(8 * kDayNs);
    db.hit(e.b);
    NullUi ui(db);
    ui.click(Widget::evict_older);  // the default: 7 days
    ui.click(Widget::confirm);
    CHECK_FALSE(db.exists("aaa111"));
    CHECK_FALSE(db.exists("ccc333"));
    CHECK(db.exists("bbb222"));
}

TEST_CASE("panels: the entry window shows files, and a file's text", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    REQUIRE(gui::show_entry(ui.model(), ui.ui(), "bbb", "kernel.ptx"));
    ui.frames(2);
    REQUIRE(ui.ui().detail);
    CHECK(ui.ui().detail->files().size() == 2);
    REQUIRE(ui.ui().view);
    CHECK(ui.ui().view->text.line(2) == "// b");
    CHECK(ui.model().selected_count() == 1);

    // The entry is evicted by someone else: the window says so.
    db.evict(e.b);
    REQUIRE(ui.model().refresh(true));
    ui.frames(2);
    CHECK_FALSE(ui.ui().detail);
}

TEST_CASE("panels: Find duplicates groups the shared binary", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    ui.click(Widget::find_duplicates);
    for (int i = 0; i < 100 && !ui.model().duplicates().done(); ++i) ui.frames();
    REQUIRE(ui.model().duplicates().done());
    REQUIRE(ui.model().duplicates().groups().size() == 1);
    CHECK(ui.model().duplicates().groups()[0].keys == std::vector<std::string>{"aaa111", "ccc333"});
}

TEST_CASE("panels: a change by another process shows without a click", "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    db.add_entry("ddd444", {{"kernel.ptx", "new"}});
    REQUIRE(ui.model().refresh(true));  // the frame would poll within 250 ms
    ui.frames();
    CHECK(ui.model().visible_count() == 4);
}

TEST_CASE("panels: the Shared tier section shows the remote statistics once a remote ran",
          "[gui][panels]") {
    GuiDb db;
    Entries e(db);
    NullUi ui(db);
    // No remote tier has run on this db: no section.
    CHECK_FALSE(ui.ui().rect(Widget::shared_tier).valid);
    CHECK(ui.ui().shared_tier_drawn.empty());

    // What kcache-fsd --remote records: counters and the servers gauge.
    REQUIRE(db.store().update([](core::WriteTxn& txn) -> core::Status {
        KCACHE_TRY(txn.add(core::Counter::remote_hits, 3));
        KCACHE_TRY(txn.add(core::Counter::remote_bytes_down, 5000));
        KCACHE_TRY(txn.add(core::Counter::remote_upload_queued, 2));
        return txn.add(core::Counter::remote_servers, 2);
    }));
    REQUIRE(ui.model().refresh(true));
    ui.frames();
    CHECK(ui.ui().rect(Widget::shared_tier).valid);
    // Every statistic the table says is the shared tier's, each once, grouped: the
    // section keeps no list of its own.
    std::vector<core::Counter> expected;
    for (const core::StatisticField& f : core::kStatistics) {
        if (f.counted_by & core::by_remote) expected.push_back(f.id);
    }
    REQUIRE(expected.size() >= 19);
    auto drawn = ui.ui().shared_tier_drawn;
    REQUIRE(drawn.size() == expected.size());
    // Grouped: each group's statistics are drawn together.
    for (std::size_t i = 1; i < drawn.size(); ++i) {
        const auto* prev = core::statistic_field(drawn[i - 1]);
        const auto* at = core::statistic_field(drawn[i]);
        if (prev->group == at->group) continue;
        for (std::size_t j = 0; j < i; ++j) {
            CHECK(core::statistic_field(drawn[j])->group != at->group);
        }
    }
    std::sort(drawn.begin(), drawn.end());
    CHECK(drawn == expected);

    SECTION("hidden with the Statistics window") {
        ui.ui().show_statistics = false;
        ui.frames();
        CHECK(ui.ui().shared_tier_drawn.empty());
        CHECK_FALSE(ui.ui().rect(Widget::shared_tier).valid);
    }
    SECTION("a counter reset leaves it while the servers gauge says a remote is configured") {
        REQUIRE(db.store().update([](core::WriteTxn& txn) { return txn.reset_stats(); }));
        REQUIRE(ui.model().refresh(true));
        ui.frames();
        CHECK(ui.model().stats().get(core::Counter::remote_hits) == 0);
        CHECK(ui.ui().rect(Widget::shared_tier).valid);
    }
}

TEST_CASE("panels: the Misses window shows misses by cause and a miss beside its compared entry",
          "[gui][panels]") {
    GuiDb db;
    // Two Triton entries of one kernel (num_warps 4, then 8), classified as kcache-fsd's
    // background thread does.
    const std::string a(52, 'A'), b = std::string(51, 'A') + 'B';
    auto triton = [&](const std::string& key, int warps) {
        db.add_entry(key, {{"add_kernel.json",
                            "{\"name\": \"add_kernel\", \"triton_version\": \"3.9.0\", "
                            "\"num_warps\": " +
                                std::to_string(warps) + "}"},
                           {"add_kernel.cubin", fake_cubin(warps)}});
        db.clock().advance(2 * kSecondNs);
        REQUIRE(core::classify_pending(db.store()));
    };
    triton(a, 4);
    triton(b, 8);
    NullUi ui(db);
    ui.ui().show_misses = true;
    ui.frames(3);  // the report is loaded by the worker, then drawn
    REQUIRE(ui.ui().misses);
    const gui::MissesReport& r = *ui.ui().misses;
    REQUIRE(r.recent.size() == 2);
    CHECK(r.recent[0].name == b);  // newest first
    CHECK(r.totals[gui::cause_index(core::MissCause::first)] == 1);
    CHECK(r.totals[gui::cause_index(core::MissCause::changed_key)] == 1);
    std::uint32_t charted = 0;
    for (const auto& bucket : r.buckets)
        for (auto n : bucket.by_cause) charted += n;
    CHECK(charted == 2);
    REQUIRE(ui.ui().miss_rects.size() == 2);
    CHECK_FALSE(ui.ui().miss_selected);
    ui.click(ui.ui().miss_rects[0]);
    REQUIRE(ui.ui().miss_selected == 0u);
    const core::Miss& m = r.recent[*ui.ui().miss_selected];
    CHECK(m.compared_name == a);
    REQUIRE(m.fields.size() == 1);
    CHECK(m.fields[0].before == "4");
    CHECK(m.fields[0].after == "8");
}
