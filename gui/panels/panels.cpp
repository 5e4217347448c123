// The frame: refresh, shortcuts, the menu bar, every window, the confirmation dialog.

#include <chrono>

#include <fmt/core.h>

#include "internal.hpp"
#include "kcache/core/units.hpp"

namespace kcache::gui {
namespace detail {

void note(UiState& ui, Widget w) {
    ui.rects[static_cast<std::size_t>(w)] = last_item_rect();
}

Rect last_item_rect() {
    const ImVec2 a = ImGui::GetItemRectMin();
    const ImVec2 b = ImGui::GetItemRectMax();
    return Rect{a.x, a.y, b.x, b.y, true};
}

void set_status(UiState& ui, std::string message, bool error) {
    ui.status = std::move(message);
    ui.status_error = error;
}

void request(UiState& ui, PendingAction action) {
    ui.pending = action;
    ui.open_confirm = true;
}

void focus_entry(Model& model, UiState& ui, core::Ino ino) {
    model.set_focused(ino);
    if (auto index = model.visible_index(ino)) {
        model.select_only(*index);
        ui.anchor = *index;
    }
}

}  // namespace detail

namespace {

using namespace detail;

struct AgeUnit {
    const char* name;
    std::int64_t ns;
};
constexpr AgeUnit kAgeUnits[] = {
    {"hours", 3'600'000'000'000},
    {"days", 86'400'000'000'000},
    {"weeks", 604'800'000'000'000},
};

std::int64_t older_than_ns(const UiState& ui) {
    return static_cast<std::int64_t>(ui.older_than) * kAgeUnits[ui.older_unit].ns;
}

std::string describe(const Model& model, const UiState& ui) {
    const std::size_t n = model.selected_count();
    const std::string entries = fmt::format("{} {}", n, n == 1 ? "entry" : "entries");
    switch (ui.pending) {
        case PendingAction::evict_selected:
            return fmt::format(
                "Evict {} ({})?\nPinned entries are kept. Evicted entries are "
                "gone from the cache and from a mount at once.",
                entries, format_bytes(model.selected_bytes()));
        case PendingAction::evict_older:
            return fmt::format("Evict every unpinned entry not used for {} {}?", ui.older_than,
                               kAgeUnits[ui.older_unit].name);
        case PendingAction::pin:
            return fmt::format("Pin {}? Pinned entries are never evicted.", entries);
        case PendingAction::unpin:
            return fmt::format("Unpin {}? They can be evicted again.", entries);
        case PendingAction::clear:
            return fmt::format("Evict all {} entries? Pinned entries are kept.",
                               model.entry_count());
        case PendingAction::none:
            break;
    }
    return {};
}

const char* confirm_label(PendingAction action) {
    switch (action) {
        case PendingAction::pin:
            return "Pin";
        case PendingAction::unpin:
            return "Unpin";
        case PendingAction::clear:
            return "Clear";
        default:
            return "Evict";
    }
}

void draw_confirm(Model& model, UiState& ui) {
    ui.rects[static_cast<std::size_t>(Widget::confirm)].valid = false;
    ui.rects[static_cast<std::size_t>(Widget::cancel)].valid = false;
    if (ui.open_confirm) {
        ImGui::OpenPopup("Confirm");
        ui.open_confirm = false;
    }
    ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing,
                            ImVec2(0.5f, 0.5f));
    if (!ImGui::BeginPopupModal("Confirm", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) return;
    text(describe(model, ui));
    ImGui::Spacing();
    const bool confirm = ImGui::Button(confirm_label(ui.pending), ImVec2(120, 0)) ||
                         ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Enter), false);
    note(ui, Widget::confirm);
    ImGui::SetItemDefaultFocus();
    ImGui::SameLine();
    const bool cancel = ImGui::Button("Cancel", ImVec2(120, 0)) ||
                        ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape));
    note(ui, Widget::cancel);
    if (confirm) run_pending(model, ui);
    if (confirm || cancel) {
        ui.pending = PendingAction::none;
        ImGui::CloseCurrentPopup();
    }
    ImGui::EndPopup();
}

void draw_menu(Model& model, UiState& ui) {
    if (!ImGui::BeginMainMenuBar()) return;
    if (ImGui::BeginMenu("View")) {
        ImGui::MenuItem("Entries", nullptr, &ui.show_entries);
        ImGui::MenuItem("Entry", nullptr, &ui.show_detail);
        ImGui::MenuItem("Statistics", nullptr, &ui.show_statistics);
        ImGui::MenuItem("Duplicates", nullptr, &ui.show_duplicates);
        ImGui::MenuItem("Misses", nullptr, &ui.show_misses);
        ImGui::EndMenu();
    }
    if (ImGui::BeginMenu("Actions")) {
        const bool any = model.selected_count() > 0 && !model.read_only();
        if (ImGui::MenuItem("Evict selected", "Del", false, any)) {
            request(ui, PendingAction::evict_selected);
        }
        if (ImGui::MenuItem("Pin selected", nullptr, false, any)) request(ui, PendingAction::pin);
        if (ImGui::MenuItem("Unpin selected", nullptr, false, any)) {
            request(ui, PendingAction::unpin);
        }
        ImGui::Separator();
        if (ImGui::MenuItem("Clear...", nullptr, false, !model.read_only())) {
            request(ui, PendingAction::clear);
        }
        ImGui::EndMenu();
    }
    ImGui::TextDisabled("|");
    text(model.db_path());
    ImGui::TextDisabled("%s", model.read_only() ? "(read-only)" : "");
    if (!ui.status.empty()) {
        ImGui::TextDisabled("|");
        ImGui::PushStyleColor(ImGuiCol_Text, ui.status_error ? kWarn : kGood);
        text(ui.status);
        ImGui::PopStyleColor();
    }
    ImGui::EndMainMenuBar();
}

}  // namespace

void run_pending(Model& model, UiState& ui) {
    switch (ui.pending) {
        case PendingAction::evict_selected:
            ui.action = model.request(Action::evict);
            break;
        case PendingAction::evict_older:
            ui.action = model.request(Action::evict_older, older_than_ns(ui));
            break;
        case PendingAction::pin:
            ui.action = model.request(Action::pin);
            break;
        case PendingAction::unpin:
            ui.action = model.request(Action::unpin);
            break;
        case PendingAction::clear:
            ui.action = model.request(Action::clear);
            break;
        case PendingAction::none:
            return;
    }
    set_status(ui, "working...");
    ui.pending = PendingAction::none;
}

void handle_shortcuts(Model& model, UiState& ui) {
    const ImGuiIO& io = ImGui::GetIO();
    // ImGui 1.86 names no letter keys but A, C, V, X, Y, Z; the GLFW backend indexes
    // KeysDown by GLFW key codes, which are the upper-case ASCII letters.
    constexpr int kKeyF = 'F';
    if (io.KeyCtrl && ImGui::IsKeyPressed(kKeyF, false)) ui.focus_filter = true;
    if (io.WantTextInput || ImGui::IsPopupOpen("Confirm")) return;
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Delete), false) &&
        model.selected_count() > 0 && !model.read_only()) {
        request(ui, PendingAction::evict_selected);
    }
    if (io.KeyCtrl && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_A), false)) {
        model.select_all_visible();
    }
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape), false)) {
        model.clear_selection();
    }
}

bool show_entry(Model& model, UiState& ui, std::string_view key, std::string_view file) {
    std::optional<core::Ino> found;
    for (std::size_t i = 0; i < model.visible_count() && !found; ++i) {
        if (model.key(model.visible(i)).starts_with(key)) found = model.visible(i).ino;
    }
    if (!found) return false;
    focus_entry(model, ui, *found);
    return file.empty() || open_entry_file(model, ui, file);
}

void draw_inspector(Model& model, UiState& ui) {
    if (auto refreshed = model.refresh(); !refreshed) {
        set_status(ui, refreshed.error().message, true);  // "refresh: ...", "duplicates: ..."
    }
    if (ui.action.valid() &&
        ui.action.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        auto report = ui.action.get();
        if (report) {
            set_status(ui, report->message);
        } else {
            set_status(ui, report.error().message, true);
        }
    }
    handle_shortcuts(model, ui);
    draw_menu(model, ui);
    if (ui.show_entries) draw_entries(model, ui);
    if (ui.show_detail) draw_entry_detail(model, ui);
    ui.shared_tier_drawn.clear();  // drawn again below, if shown
    ui.rects[static_cast<std::size_t>(Widget::shared_tier)].valid = false;
    if (ui.show_statistics) draw_statistics(model, ui);
    if (ui.show_duplicates) draw_duplicates(model, ui);
    if (ui.show_misses) draw_misses(model, ui);
    draw_confirm(model, ui);
}

namespace detail {

const char* age_unit_names() {
    return "hours\0days\0weeks\0";
}

void place_window(float x, float y, float w, float h) {
    // Below the main menu bar. Its height is counted here: the viewport's work area
    // leaves it out only from the frame after it was first drawn.
    const ImGuiViewport* vp = ImGui::GetMainViewport();
    const float menu = ImGui::GetFrameHeight();
    const ImVec2 size(vp->Size.x, vp->Size.y - menu);
    ImGui::SetNextWindowPos(ImVec2(vp->Pos.x + x * size.x, vp->Pos.y + menu + y * size.y),
                            ImGuiCond_FirstUseEver);
    ImGui::SetNextWindowSize(ImVec2(w * size.x, h * size.y), ImGuiCond_FirstUseEver);
}

}  // namespace detail

}  // namespace kcache::gui
