// The Misses window (core/misses.hpp): misses by cause over time, the recent misses,
// and for the selected one the entry and the one it was compared with side by side,
// what differs highlighted. The report is loaded by the worker whenever the db
// changed (UiState::misses_txn), never by the frame.

#include <algorithm>
#include <chrono>

#include <fmt/core.h>

#include "internal.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/units.hpp"

namespace kcache::gui::detail {
namespace {

const ImVec4 kCauseColors[kCauseCount] = {
    {0.45f, 0.62f, 0.85f, 1.0f},  // first: blue, nothing to fix
    {0.95f, 0.70f, 0.30f, 1.0f},  // capacity: amber, raise the bound
    {0.80f, 0.45f, 0.85f, 1.0f},  // changed key: violet
    {0.95f, 0.40f, 0.40f, 1.0f},  // unstable key: red, a wasted compile
};
const char* kCauseLabels[kCauseCount] = {"first", "capacity", "changed key", "unstable key"};

const ImVec4 kBefore{0.95f, 0.55f, 0.55f, 1.0f};
const ImVec4 kAfter{0.50f, 0.85f, 0.50f, 1.0f};

// Asks the worker for a new report once the db changed and none is loading; takes a
// finished one.
void refresh_report(Model& model, UiState& ui) {
    if (ui.misses_loading.valid() &&
        ui.misses_loading.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        auto report = ui.misses_loading.get();
        if (report) {
            ui.misses = std::move(*report);
            ui.misses_error.clear();
            if (ui.miss_selected && *ui.miss_selected >= ui.misses->recent.size())
                ui.miss_selected.reset();
            // --misses: the newest changed key with fields to show, else any comparison.
            const auto& recent = ui.misses->recent;
            for (int pass = 0; pass < 2 && ui.pick_compared_miss; ++pass) {
                for (std::size_t i = 0; i < recent.size() && ui.pick_compared_miss; ++i) {
                    const core::Miss& m = recent[i];
                    const bool fits =
                        pass == 0 ? m.cause == core::MissCause::changed_key && !m.fields.empty()
                                  : !m.compared_name.empty();
                    if (fits) {
                        ui.miss_selected = i;
                        ui.pick_compared_miss = false;
                    }
                }
            }
        } else {
            ui.misses_error = report.error().message;
        }
    }
    // A busy daemon changes the db every few hundred milliseconds (statistics); the
    // report reads every kept miss, so it is asked for at most once a second.
    const std::int64_t now = core::steady_ns();
    if (!ui.misses_loading.valid() && ui.misses_txn != model.txn_id() &&
        (ui.misses_asked_ns == 0 || now - ui.misses_asked_ns >= 1'000'000'000)) {
        ui.misses_txn = model.txn_id();
        ui.misses_asked_ns = now;
        ui.misses_loading = model.load_misses();
    }
}

void draw_chart(const MissesReport& r) {
    const float height = 90.0f;
    const ImVec2 origin = ImGui::GetCursorScreenPos();
    const float width = ImGui::GetContentRegionAvail().x;
    ImDrawList* draw = ImGui::GetWindowDrawList();
    std::uint32_t top = 1;
    for (const auto& b : r.buckets) {
        std::uint32_t sum = 0;
        for (auto n : b.by_cause) sum += n;
        top = std::max(top, sum);
    }
    draw->AddRectFilled(origin, ImVec2(origin.x + width, origin.y + height),
                        ImGui::GetColorU32(ImGuiCol_FrameBg));
    const float slot = r.buckets.empty() ? width : width / static_cast<float>(r.buckets.size());
    for (std::size_t i = 0; i < r.buckets.size(); ++i) {
        float y = origin.y + height;
        const float x0 = origin.x + slot * static_cast<float>(i) + 1;
        const float x1 = x0 + std::max(slot - 2, 1.0f);
        for (std::size_t c = 0; c < kCauseCount; ++c) {
            const float h =
                height * static_cast<float>(r.buckets[i].by_cause[c]) / static_cast<float>(top);
            if (h <= 0) continue;
            draw->AddRectFilled(ImVec2(x0, y - h), ImVec2(x1, y),
                                ImGui::GetColorU32(kCauseColors[c]));
            y -= h;
        }
    }
    ImGui::Dummy(ImVec2(width, height));
    ImGui::TextColored(kDim, "%s per bar, %u at most; the last bar ends now",
                       core::format_age(r.bucket_ns).c_str(), top);
}

void draw_legend(const MissesReport& r) {
    for (std::size_t c = 0; c < kCauseCount; ++c) {
        if (c) ImGui::SameLine(0, 18);
        ImGui::ColorButton(kCauseLabels[c], kCauseColors[c],
                           ImGuiColorEditFlags_NoTooltip | ImGuiColorEditFlags_NoDragDrop,
                           ImVec2(12, 12));
        ImGui::SameLine();
        ImGui::Text("%s %llu", kCauseLabels[c], static_cast<unsigned long long>(r.totals[c]));
    }
    if (r.pending) {
        ImGui::SameLine(0, 18);
        ImGui::TextColored(kDim, "(%llu not classified yet)",
                           static_cast<unsigned long long>(r.pending));
    }
}

std::string evidence(const core::Miss& m, std::int64_t now) {
    if (m.cause == core::MissCause::capacity) {
        return fmt::format("{} {}", m.gone_why.substr(0, m.gone_why.find(' ')),
                           format_ago(now, m.gone_ns));
    }
    if (!m.fields.empty()) {
        return fmt::format("{}: {} -> {}", m.fields[0].field, m.fields[0].before,
                           m.fields[0].after);
    }
    if (!m.same_binary.empty()) return "same " + m.same_binary;
    if (!m.lines.empty()) {
        return m.lines[0].line ? fmt::format("{} line {}", m.lines[0].file, m.lines[0].line)
                               : m.lines[0].file + " differs";
    }
    return {};
}

void draw_recent(Model& model, UiState& ui, const MissesReport& r) {
    ui.miss_rects.clear();
    const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                  ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_Resizable;
    if (!ImGui::BeginTable("recent", 5, flags, ImVec2(0, ImGui::GetContentRegionAvail().y * 0.4f)))
        return;
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("when", ImGuiTableColumnFlags_WidthFixed, 70);
    ImGui::TableSetupColumn("cause", ImGuiTableColumnFlags_WidthFixed, 90);
    ImGui::TableSetupColumn("entry", ImGuiTableColumnFlags_WidthStretch, 3);
    ImGui::TableSetupColumn("family", ImGuiTableColumnFlags_WidthStretch, 1.5f);
    ImGui::TableSetupColumn("evidence", ImGuiTableColumnFlags_WidthStretch, 2);
    ImGui::TableHeadersRow();
    const std::int64_t now = model.now_ns();
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(r.recent.size()));
    while (clipper.Step()) {
        for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
            const core::Miss& m = r.recent[static_cast<std::size_t>(i)];
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::PushID(i);
            const bool selected = ui.miss_selected == static_cast<std::size_t>(i);
            if (ImGui::Selectable(format_ago(now, m.time_ns).c_str(), selected,
                                  ImGuiSelectableFlags_SpanAllColumns)) {
                ui.miss_selected = static_cast<std::size_t>(i);
            }
            ui.miss_rects.push_back(last_item_rect());
            ImGui::PopID();
            ImGui::TableNextColumn();
            ImGui::TextColored(kCauseColors[cause_index(m.cause)], "%s",
                               kCauseLabels[cause_index(m.cause)]);
            ImGui::TableNextColumn();
            text(m.name);
            ImGui::TableNextColumn();
            text(m.family.empty() ? std::string_view("-") : std::string_view(m.family));
            ImGui::TableNextColumn();
            text(evidence(m, now));
        }
    }
    ImGui::EndTable();
}

// Two columns: what the entry compared with holds, and what the missed entry holds.
void draw_side_by_side(Model& model, const core::Miss& m) {
    const std::int64_t now = model.now_ns();
    ImGui::TextColored(kCauseColors[cause_index(m.cause)], "%s",
                       kCauseLabels[cause_index(m.cause)]);
    ImGui::SameLine();
    text(m.name);
    ImGui::TextColored(kDim, "%s, family %s, missed %s", core::producer_name(m.producer).data(),
                       m.family.empty() ? "- (its files name no kernel)" : m.family.c_str(),
                       format_ago(now, m.time_ns).c_str());
    if (m.cause == core::MissCause::capacity) {
        ImGui::Text("This entry was %s %s.", m.gone_why.c_str(),
                    format_ago(now, m.gone_ns).c_str());
        if (m.stack_distance) {
            ImGui::Text("A bound of at least %s would have kept it (LRU stack distance).",
                        format_bytes(m.stack_distance).c_str());
        }
    }
    if (!m.note.empty()) ImGui::TextWrapped("%s", m.note.c_str());
    if (m.compared_name.empty()) return;
    ImGui::Spacing();
    const ImGuiTableFlags flags =
        ImGuiTableFlags_BordersInner | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY;
    if (!ImGui::BeginTable("side by side", 3, flags)) return;
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("", ImGuiTableColumnFlags_WidthFixed, 230);
    // Another node's entry (explained across nodes) names that node in the header.
    const std::string node =
        m.compared_namespace.empty()
            ? std::string()
            : " (node " + (m.compared_host.empty() ? std::string("?") : m.compared_host) +
                  ", shared tier " + m.compared_namespace + ")";
    ImGui::TableSetupColumn(("compared with: " + m.compared_name + node).c_str());
    ImGui::TableSetupColumn(("this entry: " + m.name).c_str());
    ImGui::TableHeadersRow();
    auto row = [](const std::string& label, const std::string& before, const std::string& after,
                  bool differs) {
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        text(label);
        ImGui::TableNextColumn();
        if (differs) ImGui::PushStyleColor(ImGuiCol_Text, kBefore);
        ImGui::TextWrapped("%s", before.c_str());
        if (differs) ImGui::PopStyleColor();
        ImGui::TableNextColumn();
        if (differs) ImGui::PushStyleColor(ImGuiCol_Text, kAfter);
        ImGui::TextWrapped("%s", after.c_str());
        if (differs) ImGui::PopStyleColor();
    };
    if (!m.same_binary.empty()) row(m.same_binary, "identical", "identical", false);
    for (const auto& f : m.fields) row(f.file + " " + f.field, f.before, f.after, true);
    for (const auto& l : m.lines) {
        row(l.line ? fmt::format("{} line {}", l.file, l.line) : l.file, l.before, l.after, true);
    }
    if (m.fields.empty() && m.lines.empty()) {
        row("stored files", "identical but for the key", "identical but for the key", false);
    }
    ImGui::EndTable();
}

}  // namespace

void draw_misses(Model& model, UiState& ui) {
    refresh_report(model, ui);
    place_window(0.08f, 0.06f, 0.84f, 0.86f);
    ImGui::SetNextWindowBgAlpha(1.0f);  // it floats over the other windows: opaque
    if (ui.focus_misses) {
        ImGui::SetNextWindowFocus();
        ui.focus_misses = false;
    }
    if (!ImGui::Begin("Misses", &ui.show_misses)) {
        ImGui::End();
        return;
    }
    if (!ui.misses_error.empty()) ImGui::TextColored(kWarn, "%s", ui.misses_error.c_str());
    if (!ui.misses) {
        ImGui::TextDisabled("loading...");
        ImGui::End();
        return;
    }
    const MissesReport& r = *ui.misses;
    draw_legend(r);
    draw_chart(r);
    if (r.recent.empty()) {
        ImGui::TextWrapped(
            "No classified misses. kcache-fsd classifies each miss in the background once "
            "its entry has settled (docs/misses.md).");
        ImGui::End();
        return;
    }
    draw_recent(model, ui, r);
    ImGui::Separator();
    if (ui.miss_selected) {
        draw_side_by_side(model, r.recent[*ui.miss_selected]);
    } else {
        ImGui::TextDisabled("select a miss to see it beside the entry it was compared with");
    }
    ImGui::End();
}

}  // namespace kcache::gui::detail
