// The inspector's panels: Dear ImGui drawing over a Model. They never reach the db:
// whatever needs it (an action, an entry's files, a file's content) is a request to
// the model's worker whose future the panels poll once per frame. What they remember
// between frames (the filter text, a pending confirmation, the file being viewed,
// those futures) is in UiState.
//
// Contract: call draw_inspector() once per frame between ImGui::NewFrame() and
// ImGui::Render(), on the thread that owns the Model and the ImGui context. Each call
// first takes the worker's newest catalog (a pointer swap; it never waits), then
// draws. Errors (a failed action or refresh) are shown in the status line, never
// thrown.
#pragma once

#include <array>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "kcache/gui/detail.hpp"
#include "kcache/gui/misses.hpp"
#include "kcache/gui/model.hpp"

namespace kcache::gui {

// Widgets whose place on screen the last frame recorded, so a test can click them
// (ImGui 1.86 has no test engine). Costs a few stores per frame.
enum class Widget : std::uint8_t {
    filter,
    evict_selected,
    pin,
    unpin,
    evict_older,
    clear,
    confirm,  // the confirmation dialog's button that does it
    cancel,
    find_duplicates,
    shared_tier,  // the Statistics window's "Shared tier" heading
    count,
};

struct Rect {
    float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    bool valid = false;  // drawn in the last frame
    float cx() const { return (x0 + x1) / 2; }
    float cy() const { return (y0 + y1) / 2; }
};

// An action waiting for the person's confirmation.
enum class PendingAction : std::uint8_t { none, evict_selected, evict_older, pin, unpin, clear };

struct UiState {
    // Windows shown (View menu).
    bool show_entries = true;
    bool show_detail = true;
    bool show_statistics = true;
    bool show_duplicates = true;
    bool show_misses = false;   // View > Misses, or kcache-inspector --misses
    bool focus_misses = false;  // bring the Misses window to the front at the next frame

    // Entries: the filter as typed, Ctrl+F's request for focus, shift-click's anchor.
    std::array<char, 256> filter{};
    bool focus_filter = false;
    std::optional<std::size_t> anchor;
    int older_than = 7;  // evict older than this many units
    int older_unit = 1;  // 0 hours, 1 days, 2 weeks

    PendingAction pending = PendingAction::none;
    bool open_confirm = false;  // open the dialog at the next chance
    std::string status;         // result of the last action, or an error
    bool status_error = false;
    std::future<Result<ActionReport>> action;  // the action the worker runs now

    // Entry detail: loaded (by the worker) for the focused entry at the model's
    // transaction; the loads in flight.
    std::future<Result<EntryDetail>> detail_loading;
    std::future<Result<FileView>> view_loading;
    std::optional<EntryDetail> detail;
    std::string detail_error;
    core::Ino detail_ino = 0;
    std::uint64_t detail_txn = 0;
    int file_index = -1;
    std::optional<FileView> view;
    std::string view_error;
    std::array<char, 128> search{};
    std::optional<std::size_t> search_line;  // the line found last
    bool scroll_to_search = false;

    // Misses: the report the worker loaded at the db's transaction misses_txn, the one
    // loading, and the miss selected in it (an index into recent).
    std::future<Result<MissesReport>> misses_loading;
    std::optional<MissesReport> misses;
    std::string misses_error;
    std::uint64_t misses_txn = 0;
    std::int64_t misses_asked_ns = 0;  // steady clock: when the last report was asked for
    std::optional<std::size_t> miss_selected;
    bool pick_compared_miss = false;  // select the newest miss with a comparison once loaded
    std::vector<Rect> miss_rects;     // rows of the recent misses drawn last frame

    // Where test-clickable widgets and table parts were drawn in the last frame.
    std::array<Rect, static_cast<std::size_t>(Widget::count)> rects{};
    std::array<Rect, kColumnCount> header_rects{};
    std::size_t first_row_drawn = 0;  // visible index of row_rects[0]
    std::vector<Rect> row_rects;      // rows of the entries table drawn last frame
    // The shared tier's statistics the Statistics window drew last frame, in order
    // (empty: the section was hidden, as when no remote tier has run on this db).
    std::vector<core::Counter> shared_tier_drawn;

    const Rect& rect(Widget w) const { return rects[static_cast<std::size_t>(w)]; }
};

// Draws the whole inspector (menu bar and every window) for one frame.
void draw_inspector(Model& model, UiState& ui);

// Keyboard habits: Ctrl+F focuses the filter, Delete asks to evict the selection,
// Ctrl+A selects every visible entry, Escape clears the selection. Part of
// draw_inspector; exposed for tests.
void handle_shortcuts(Model& model, UiState& ui);

// Asks the worker to run the pending action now, as the dialog's confirm button does;
// its result shows in the status line at the frame after it arrives.
void run_pending(Model& model, UiState& ui);

// Shows the entry whose key is `key` (or starts with it) and, when `file` is not
// empty, opens that file of it in the viewer. False when there is no such entry or
// file. Used by --select / --file (screenshots of a chosen entry): it waits for the
// worker to load them, so it is not for the frame loop.
bool show_entry(Model& model, UiState& ui, std::string_view key, std::string_view file);

}  // namespace kcache::gui
