// The inspector's worker and view: requests while a reload runs, the catalog swap
// the view sees, an action from the view reaching the db, and that the UI thread
// never uses the db (the worker's store counts uses from any other thread).
#include <catch2/catch.hpp>

#include <imgui.h>

#include <string>
#include <vector>

#include "gui_test_util.hpp"
#include "kcache/gui/model.hpp"
#include "kcache/gui/panels.hpp"

using namespace kcache;
using namespace kcache::test;
using gui::Column;
using gui::Model;

namespace {

std::unique_ptr<Model> open_model(GuiDb& db) {
    Model::Options options;
    options.db_path = db.path();
    options.clock = db.clock().clock();
    options.poll_interval_ns = 3600 * kSecondNs;  // only the looks a test asks for
    auto model = Model::open(options);
    REQUIRE(model);
    return std::move(*model);
}

}  // namespace

TEST_CASE("worker: a request posted while a reload runs is done after it, on its catalog",
          "[gui][worker]") {
    GuiDb db;
    for (int i = 0; i < 200; ++i) {
        db.add_entry("k" + std::to_string(1000 + i), {{"kernel.cubin", fake_cubin(i, 64)}});
    }
    auto model = open_model(db);
    model->set_sort({Column::key, false});
    model->wait_idle();
    model->select_only(0);  // k1000
    const core::Ino first = model->visible(0).ino;
    db.add_entry("k0999", {{"kernel.ptx", "x"}});  // sorts first

    // Queued behind the reload: the sort, then the eviction of k1000.
    auto reload = model->worker().reload_now();
    model->set_sort({Column::key, true});
    auto evicted = model->request(gui::Action::evict);
    REQUIRE(reload.get());
    auto report = evicted.get();
    REQUIRE(report);
    CHECK(report->entries == 1);
    model->wait_idle();
    CHECK(model->entry_count() == 200);  // 200 + k0999 - k1000
    CHECK(model->row(first) == nullptr);
    CHECK(model->key(model->visible(0)) == "k1199");  // descending, on the new catalog
    CHECK(model->key(model->visible(model->visible_count() - 1)) == "k0999");
    CHECK(model->selected_count() == 0);  // the evicted entry left the selection
}

TEST_CASE("worker: the view sees a new catalog only at refresh, and keeps its selection",
          "[gui][worker]") {
    GuiDb db;
    const core::Ino a = db.add_entry("aaa", {{"kernel.cubin", fake_cubin(1, 64)}});
    db.add_entry("bbb", {{"kernel.cubin", fake_cubin(2, 64)}});
    auto model = open_model(db);
    model->set_sort({Column::key, false});
    model->wait_idle();
    model->select_only(0);
    const std::uint64_t txn = model->txn_id();

    db.hit(a, 3);
    REQUIRE(model->worker().look_now().get());
    // Published, not yet taken: the frame still shows the old catalog, unchanged.
    CHECK(model->txn_id() == txn);
    CHECK(model->row(a)->hits == 0);
    REQUIRE(*model->refresh());
    CHECK(model->txn_id() != txn);
    CHECK(model->row(a)->hits == 3);
    CHECK(model->selected_inos() == std::vector<core::Ino>{a});
    CHECK_FALSE(*model->refresh());  // nothing newer
}

TEST_CASE("worker: evict from the view reaches the db", "[gui][worker]") {
    GuiDb db;
    db.add_entry("aaa", {{"kernel.cubin", fake_cubin(1, 64)}});
    const core::Ino b = db.add_entry("bbb", {{"kernel.cubin", fake_cubin(2, 64)}});
    auto model = open_model(db);
    REQUIRE(model->visible_index(b));
    model->select_only(*model->visible_index(b));
    auto report = model->request(gui::Action::evict).get();
    REQUIRE(report);
    CHECK(report->entries == 1);
    CHECK_FALSE(db.exists("bbb"));  // the test's own store sees it: committed
    CHECK(db.exists("aaa"));
    REQUIRE(*model->refresh());
    CHECK(model->row(b) == nullptr);
    CHECK(model->entry_count() == 1);
}

TEST_CASE("worker: the UI thread never uses the db, through every panel and action",
          "[gui][worker]") {
    GuiDb db;
    const core::Ino a = db.add_entry("aaa111", {{"kernel.cubin", fake_cubin(1, 100)}});
    db.add_entry("bbb222", {{"kernel.ptx", ".version 8.0\n"}});
    db.add_entry("ccc333", {{"kernel.cubin", fake_cubin(1, 100)}});
    auto model = open_model(db);

    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(1600, 1000);
    io.DeltaTime = 1.0f / 60.0f;
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
    gui::UiState ui;
    auto frames = [&](int n) {
        for (int i = 0; i < n; ++i) {
            ImGui::NewFrame();
            gui::draw_inspector(*model, ui);
            ImGui::Render();
            model->wait_idle();
        }
    };
    frames(2);
    REQUIRE(gui::show_entry(*model, ui, "bbb", "kernel.ptx"));
    frames(2);
    CHECK(ui.view);
    REQUIRE(model->start_duplicate_scan());
    frames(2);
    CHECK(model->duplicates().groups().size() == 1);
    model->set_sort({Column::hits, true});
    model->set_filter("a");
    frames(2);
    REQUIRE(model->visible_index(a));
    model->select_only(*model->visible_index(a));
    ui.pending = gui::PendingAction::pin;
    gui::run_pending(*model, ui);
    frames(2);
    CHECK(model->row(a)->pinned());
    db.hit(a);
    REQUIRE(model->refresh(true));
    frames(1);
    ImGui::DestroyContext();

    CHECK(model->worker().foreign_store_uses() == 0);
    // And the count does see a use from this thread.
    (void)model->worker().store_for_test();
    CHECK(model->worker().foreign_store_uses() == 1);
}
