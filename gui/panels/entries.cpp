// The entries window: filter, actions toolbar, and the table of every entry.
//
// The table draws only the rows on screen (ImGuiListClipper with an explicit row
// height), so a frame costs the same with ten entries or a million.

#include <cstdio>

#include <fmt/core.h>

#include "internal.hpp"
#include "kcache/core/roles.hpp"

namespace kcache::gui::detail {
namespace {

void draw_toolbar(Model& model, UiState& ui) {
    if (ui.focus_filter) {
        ImGui::SetKeyboardFocusHere();
        ui.focus_filter = false;
    }
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 18);
    if (ImGui::InputTextWithHint("##filter", "Filter keys, producers (Ctrl+F)", ui.filter.data(),
                                 ui.filter.size())) {
        model.set_filter(ui.filter.data());
        ui.anchor.reset();
    }
    note(ui, Widget::filter);
    ImGui::SameLine();
    ImGui::TextDisabled("%zu of %zu entries", model.visible_count(), model.entry_count());
    if (model.selected_count() > 0) {
        ImGui::SameLine();
        ImGui::Text("| %zu selected (%s)", model.selected_count(),
                    format_bytes(model.selected_bytes()).c_str());
    }

    const bool writable = !model.read_only();
    const bool any = model.selected_count() > 0 && writable;
    ImGui::BeginDisabled(!any);
    if (ImGui::Button("Evict selected")) request(ui, PendingAction::evict_selected);
    note(ui, Widget::evict_selected);
    if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) {
        ImGui::SetTooltip("Delete: evict the selected entries (pinned ones are kept)");
    }
    ImGui::SameLine();
    if (ImGui::Button("Pin")) request(ui, PendingAction::pin);
    note(ui, Widget::pin);
    ImGui::SameLine();
    if (ImGui::Button("Unpin")) request(ui, PendingAction::unpin);
    note(ui, Widget::unpin);
    ImGui::EndDisabled();

    ImGui::SameLine();
    ImGui::TextDisabled("|");
    ImGui::SameLine();
    ImGui::BeginDisabled(!writable);
    if (ImGui::Button("Evict older than")) request(ui, PendingAction::evict_older);
    note(ui, Widget::evict_older);
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 5);
    if (ImGui::InputInt("##age", &ui.older_than)) ui.older_than = std::max(1, ui.older_than);
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 5);
    ImGui::Combo("##unit", &ui.older_unit, age_unit_names());
    ImGui::SameLine();
    ImGui::TextDisabled("|");
    ImGui::SameLine();
    if (ImGui::Button("Clear...")) request(ui, PendingAction::clear);
    note(ui, Widget::clear);
    ImGui::EndDisabled();
    if (model.read_only()) {
        ImGui::SameLine();
        ImGui::TextColored(kWarn, "read-only: actions are off");
    }
}

void on_row_click(Model& model, UiState& ui, std::size_t index) {
    const ImGuiIO& io = ImGui::GetIO();
    if (io.KeyShift && ui.anchor && *ui.anchor < model.visible_count()) {
        if (!io.KeyCtrl) model.clear_selection();
        model.select_range(*ui.anchor, index);
        model.set_focused(model.visible(index).ino);
        return;
    }
    if (io.KeyCtrl) {
        model.toggle_selected(index);
        model.set_focused(model.visible(index).ino);
    } else {
        model.select_only(index);
    }
    ui.anchor = index;
}

void draw_cells(const Model& model, const EntryRow& row, std::int64_t now) {
    char buf[64];
    ImGui::TableSetColumnIndex(1);
    text(core::producer_name(row.producer));
    ImGui::TableSetColumnIndex(2);
    std::snprintf(buf, sizeof buf, "%u", row.files);
    text(buf);
    ImGui::TableSetColumnIndex(3);
    text(format_bytes(row.bytes));
    ImGui::TableSetColumnIndex(4);
    text(format_bytes(row.stored_bytes));
    ImGui::TableSetColumnIndex(5);
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(row.hits));
    text(buf);
    ImGui::TableSetColumnIndex(6);
    text(format_ago(now, row.created_ns));
    ImGui::TableSetColumnIndex(7);
    text(format_ago(now, row.last_access_ns));
    ImGui::TableSetColumnIndex(8);
    if (row.pinned()) ImGui::TextColored(kGood, "pinned");
    (void)model;
}

void draw_table(Model& model, UiState& ui) {
    constexpr ImGuiTableFlags kFlags = ImGuiTableFlags_Sortable | ImGuiTableFlags_ScrollY |
                                       ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersOuter |
                                       ImGuiTableFlags_BordersV | ImGuiTableFlags_Resizable |
                                       ImGuiTableFlags_Hideable | ImGuiTableFlags_SizingFixedFit;
    if (!ImGui::BeginTable("entries", static_cast<int>(kColumnCount), kFlags)) return;

    const float em = ImGui::GetFontSize();
    auto column = [&](Column c, ImGuiTableColumnFlags flags, float width) {
        ImGui::TableSetupColumn(column_name(c).data(), flags, width, static_cast<ImGuiID>(c));
    };
    constexpr auto kDesc = ImGuiTableColumnFlags_PreferSortDescending;
    column(Column::key, ImGuiTableColumnFlags_WidthStretch | ImGuiTableColumnFlags_NoHide, 0);
    column(Column::producer, 0, em * 5);
    column(Column::files, kDesc, em * 3);
    column(Column::bytes, kDesc, em * 5.5f);
    column(Column::stored_bytes, kDesc, em * 5.5f);
    column(Column::hits, kDesc, em * 4);
    column(Column::created, kDesc, em * 6);
    column(Column::last_access, ImGuiTableColumnFlags_DefaultSort | kDesc, em * 6);
    column(Column::pinned, kDesc, em * 3.5f);
    ImGui::TableSetupScrollFreeze(0, 1);

    // The header row drawn by hand so that each header's place can be recorded.
    ImGui::TableNextRow(ImGuiTableRowFlags_Headers);
    for (std::size_t i = 0; i < kColumnCount; ++i) {
        if (!ImGui::TableSetColumnIndex(static_cast<int>(i))) continue;
        ImGui::TableHeader(ImGui::TableGetColumnName(static_cast<int>(i)));
        ui.header_rects[i] = last_item_rect();
    }

    if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs(); specs && specs->SpecsDirty) {
        if (specs->SpecsCount > 0) {
            const ImGuiTableColumnSortSpecs& s = specs->Specs[0];
            model.set_sort({static_cast<Column>(s.ColumnUserID),
                            s.SortDirection == ImGuiSortDirection_Descending});
            ui.anchor.reset();
        }
        specs->SpecsDirty = false;
    }

    const float row_height = ImGui::GetTextLineHeight() + 2 * ImGui::GetStyle().CellPadding.y;
    const std::int64_t now = model.now_ns();
    ui.row_rects.clear();
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(model.visible_count()), row_height);
    bool first = true;
    while (clipper.Step()) {
        if (first) {
            ui.first_row_drawn = static_cast<std::size_t>(clipper.DisplayStart);
            first = false;
        }
        for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
            const auto index = static_cast<std::size_t>(i);
            const EntryRow& row = model.visible(index);
            ImGui::TableNextRow(ImGuiTableRowFlags_None, row_height);
            ImGui::TableSetColumnIndex(0);
            const std::string_view key = model.key(row);
            ImGui::PushID(key.data(), key.data() + key.size());
            const bool focused = model.focused() == row.ino;
            if (focused) ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.9f, 0.5f, 1.0f));
            if (ImGui::Selectable(
                    "##row", model.is_selected(index),
                    ImGuiSelectableFlags_SpanAllColumns | ImGuiSelectableFlags_AllowItemOverlap,
                    ImVec2(0, row_height - 2 * ImGui::GetStyle().CellPadding.y))) {
                on_row_click(model, ui, index);
            }
            if (ui.row_rects.size() == index - ui.first_row_drawn) {
                ui.row_rects.push_back(last_item_rect());
            }
            ImGui::SameLine(0, 0);
            text(key);
            if (focused) ImGui::PopStyleColor();
            draw_cells(model, model.visible(index), now);
            ImGui::PopID();
        }
    }
    ImGui::EndTable();
}

}  // namespace

void draw_entries(Model& model, UiState& ui) {
    place_window(0.0f, 0.0f, 0.62f, 0.56f);
    if (!ImGui::Begin("Entries", &ui.show_entries)) {
        ImGui::End();
        return;
    }
    draw_toolbar(model, ui);
    draw_table(model, ui);
    ImGui::End();
}

}  // namespace kcache::gui::detail
