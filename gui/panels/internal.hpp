// What the panel files share. Drawing only; nothing here touches the db except
// through the Model.
#pragma once

#include <imgui.h>

#include <string>
#include <string_view>

#include "kcache/gui/panels.hpp"

namespace kcache::gui::detail {

void draw_entries(Model& model, UiState& ui);
void draw_entry_detail(Model& model, UiState& ui);
void draw_statistics(Model& model, UiState& ui);
void draw_duplicates(Model& model, UiState& ui);
void draw_misses(Model& model, UiState& ui);
// The Statistics window's "Shared tier" section (shared_tier.cpp): drawn only while
// shared_tier_in_use(), i.e. any of the remote tier's statistics is not zero.
void draw_shared_tier(const Model& model, UiState& ui);
bool shared_tier_in_use(const core::Stats& stats);

// Loads the focused entry's detail if needed and opens `file` (a path in it).
bool open_entry_file(Model& model, UiState& ui, std::string_view file);

// Records where the last item was drawn (for tests that click).
void note(UiState& ui, Widget w);
Rect last_item_rect();

// Text of a string_view without a copy.
inline void text(std::string_view s) {
    ImGui::TextUnformatted(s.data(), s.data() + s.size());
}
void set_status(UiState& ui, std::string message, bool error = false);
// Asks for confirmation of `action` (opens the dialog).
void request(UiState& ui, PendingAction action);
// Focuses an entry: the detail panel shows it, the table selects it.
void focus_entry(Model& model, UiState& ui, core::Ino ino);

// "hours\0days\0weeks\0" for ImGui::Combo, matching UiState::older_unit.
const char* age_unit_names();
// Places the next window at a share of the main viewport's work area, the first time
// only (afterwards the saved layout decides).
void place_window(float x, float y, float w, float h);

inline const ImVec4 kDim{0.55f, 0.58f, 0.62f, 1.0f};
inline const ImVec4 kWarn{0.95f, 0.55f, 0.35f, 1.0f};
inline const ImVec4 kGood{0.45f, 0.80f, 0.45f, 1.0f};

}  // namespace kcache::gui::detail
