// The statistics window: counters (docs/stats.md), the shared tier's (shared_tier.cpp),
// hit rate and entries stored over time from the events log, top entries by hits and
// by size, bytes by producer.
// Everything drawn here was computed by the model at its last refresh.

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/core.h>

#include "internal.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/units.hpp"

namespace kcache::gui::detail {
namespace {

// A heading with a rule under it (ImGui 1.86 has no SeparatorText).
void section(const char* title) {
    ImGui::Spacing();
    ImGui::TextUnformatted(title);
    ImGui::Separator();
}

void draw_counters(const Model& model) {
    const core::Stats& s = model.stats();
    using core::Counter;
    const std::uint64_t hits = s.get(Counter::hits);
    const std::uint64_t misses = s.get(Counter::misses);
    const std::string rate = hits + misses == 0
                                 ? std::string("-")
                                 : fmt::format("{:.1f}%", 100.0 * static_cast<double>(hits) /
                                                              static_cast<double>(hits + misses));
    if (!ImGui::BeginTable("counters", 4, ImGuiTableFlags_SizingStretchProp)) return;
    auto cell = [](int column, const std::string& name, const std::string& value,
                   std::string_view help) {
        if (column == 0) ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(column);
        ImGui::TextDisabled("%s", name.c_str());
        if (ImGui::IsItemHovered())
            ImGui::SetTooltip("%.*s", static_cast<int>(help.size()), help.data());
        ImGui::TableSetColumnIndex(column + 1);
        text(value);
    };
    // A statistic as the table of statistics (core/statistics.hpp) names, measures and
    // describes it.
    auto statistic = [&](int column, Counter c) {
        const core::StatisticField* f = core::statistic_field(c);
        const std::uint64_t v = s.get(c);
        cell(column, core::counter_label(c),
             core::counts_bytes(c) ? format_bytes(v) : std::to_string(v),
             f ? f->description : std::string_view());
    };
    const std::uint64_t stored = s.get(Counter::stored_bytes);
    statistic(0, Counter::hits);
    statistic(2, Counter::misses);
    cell(0, "hit rate", rate, "hits / (hits + misses)");
    statistic(2, Counter::stores);
    statistic(0, Counter::evicted_entries);
    statistic(2, Counter::evicted_bytes);
    statistic(0, Counter::entries);
    statistic(2, Counter::files);
    statistic(0, Counter::bytes);
    statistic(2, Counter::stored_bytes);
    cell(0, "on disk", format_bytes(model.data_file_bytes()),
         "size of data.mdb: stored bytes plus metadata and free pages");
    const std::uint64_t raw = s.get(Counter::blob_raw_bytes);
    cell(2, "dedup x compr.",
         raw && stored
             ? fmt::format("{:.2f}x x {:.2f}x",
                           static_cast<double>(s.get(Counter::bytes)) / static_cast<double>(raw),
                           static_cast<double>(raw) / static_cast<double>(stored))
             : std::string("-"),
         "bytes / blob_raw_bytes, and blob_raw_bytes / stored_bytes");
    ImGui::EndTable();
    if (s.reset_ns != 0) {
        ImGui::TextDisabled("counters reset %s", format_ago(model.now_ns(), s.reset_ns).c_str());
    }
}

// Bars of entries stored and hits per bucket, and the hit rate as a line over them.
void draw_timeline(const Model& model) {
    const Timeline& t = model.timeline();
    if (t.bucket_ns == 0) {
        ImGui::TextDisabled("No events logged yet.");
        return;
    }
    const std::size_t n = t.hits.size();
    std::uint32_t peak = 1;
    for (std::size_t i = 0; i < n; ++i) peak = std::max({peak, t.hits[i], t.populates[i]});

    const ImVec2 origin = ImGui::GetCursorScreenPos();
    const float width = std::max(100.0f, ImGui::GetContentRegionAvail().x);
    const float height = ImGui::GetFontSize() * 7;
    ImGui::InvisibleButton("timeline", ImVec2(width, height));
    const bool hovered = ImGui::IsItemHovered();
    ImDrawList* draw = ImGui::GetWindowDrawList();
    const ImVec2 end(origin.x + width, origin.y + height);
    draw->AddRectFilled(origin, end, IM_COL32(30, 32, 38, 255));
    const float slot = width / static_cast<float>(n);
    const float bar = std::max(1.0f, slot * 0.42f);
    auto y_of = [&](float fraction) { return end.y - fraction * (height - 4); };
    ImVec2 last_point;
    bool have_last = false;
    for (std::size_t i = 0; i < n; ++i) {
        const float x = origin.x + slot * static_cast<float>(i);
        const float stored = static_cast<float>(t.populates[i]) / static_cast<float>(peak);
        const float hits = static_cast<float>(t.hits[i]) / static_cast<float>(peak);
        if (t.populates[i]) {
            draw->AddRectFilled(ImVec2(x, y_of(stored)), ImVec2(x + bar, end.y),
                                IM_COL32(230, 150, 60, 220));
        }
        if (t.hits[i]) {
            draw->AddRectFilled(ImVec2(x + bar, y_of(hits)), ImVec2(x + 2 * bar, end.y),
                                IM_COL32(90, 170, 240, 220));
        }
        const float rate = t.hit_rate(i);
        if (rate >= 0) {
            const ImVec2 point(x + slot / 2, y_of(rate));
            if (have_last) draw->AddLine(last_point, point, IM_COL32(120, 230, 120, 255), 2.0f);
            draw->AddCircleFilled(point, 2.5f, IM_COL32(120, 230, 120, 255));
            last_point = point;
            have_last = true;
        }
    }
    if (hovered) {
        const float mx = ImGui::GetIO().MousePos.x - origin.x;
        const auto i = std::min(n - 1, static_cast<std::size_t>(std::max(0.0f, mx / slot)));
        const std::int64_t from = t.start_ns + static_cast<std::int64_t>(i) * t.bucket_ns;
        const float rate = t.hit_rate(i);
        ImGui::SetTooltip(
            "%s to %s\nhits %u, entries stored (misses) %u, evictions %u\nhit rate %s",
            format_ago(model.now_ns(), from).c_str(),
            format_ago(model.now_ns(), from + t.bucket_ns).c_str(), t.hits[i], t.populates[i],
            t.evictions[i], rate < 0 ? "-" : fmt::format("{:.0f}%", rate * 100).c_str());
    }
    ImGui::TextColored(ImVec4(0.9f, 0.6f, 0.25f, 1), "entries stored");
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.35f, 0.67f, 0.95f, 1), "hits");
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.47f, 0.9f, 0.47f, 1), "hit rate (0-100%%)");
    ImGui::SameLine();
    ImGui::TextDisabled("| since %s, %s per bar, peak %u",
                        format_ago(model.now_ns(), t.start_ns).c_str(),
                        core::format_age(t.bucket_ns).c_str(), peak);
}

void draw_top(Model& model, UiState& ui, const char* id, const std::vector<std::uint32_t>& top,
              bool by_hits) {
    if (top.empty()) {
        ImGui::TextDisabled(by_hits ? "No hits yet." : "No entries.");
        return;
    }
    if (!ImGui::BeginTable(id, 2, ImGuiTableFlags_SizingStretchProp | ImGuiTableFlags_RowBg))
        return;
    for (std::uint32_t index : top) {
        const EntryRow& row = model.row_at(index);
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        const std::string_view key = model.key(row);
        ImGui::PushID(key.data(), key.data() + key.size());
        const std::string label(key);
        if (ImGui::Selectable(label.c_str(), model.focused() == row.ino,
                              ImGuiSelectableFlags_SpanAllColumns)) {
            focus_entry(model, ui, row.ino);
        }
        ImGui::PopID();
        ImGui::TableSetColumnIndex(1);
        if (by_hits) {
            ImGui::Text("%llu", static_cast<unsigned long long>(row.hits));
        } else {
            text(format_bytes(row.bytes));
        }
    }
    ImGui::EndTable();
}

void draw_producers(const Model& model) {
    std::uint64_t total = 0;
    for (const auto& p : model.by_producer()) total += p.bytes;
    for (const auto& p : model.by_producer()) {
        const float share =
            total ? static_cast<float>(static_cast<double>(p.bytes) / static_cast<double>(total))
                  : 0.0f;
        const std::string overlay = fmt::format(
            "{}: {} in {} {} ({} stored)", core::producer_name(p.producer), format_bytes(p.bytes),
            p.entries, p.entries == 1 ? "entry" : "entries", format_bytes(p.stored_bytes));
        ImGui::ProgressBar(share, ImVec2(-1, 0), overlay.c_str());
    }
}

}  // namespace

void draw_statistics(Model& model, UiState& ui) {
    place_window(0.62f, 0.0f, 0.38f, 0.64f);
    if (!ImGui::Begin("Statistics", &ui.show_statistics)) {
        ImGui::End();
        return;
    }
    draw_counters(model);
    draw_shared_tier(model, ui);
    section("Over time (events log)");
    draw_timeline(model);
    if (ImGui::BeginTable("tops", 2, ImGuiTableFlags_SizingStretchSame)) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        section("Top by hits");
        draw_top(model, ui, "top_hits", model.top_by_hits(), true);
        ImGui::TableSetColumnIndex(1);
        section("Top by size");
        draw_top(model, ui, "top_size", model.top_by_size(), false);
        ImGui::EndTable();
    }
    section("Bytes by producer");
    draw_producers(model);
    ImGui::End();
}

}  // namespace kcache::gui::detail
