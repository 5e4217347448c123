// The Statistics window's "Shared tier" section: the remote tier's statistics
// (kcache-fsd --remote, `kcache remote ...`; docs/operations.md), as `kcache stats`
// lists them. Which statistics and under which headings comes from the table of
// statistics (core/statistics.hpp: the by_remote rows and their group), so a new
// remote statistic shows here without a change to this file.

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "internal.hpp"
#include "kcache/core/statistics.hpp"

namespace kcache::gui::detail {
namespace {

bool of_shared_tier(const core::StatisticField& f) {
    return (f.counted_by & core::by_remote) != 0;
}

// The groups of the shared tier's statistics, in the order they first appear.
std::vector<std::string_view> shared_tier_groups() {
    std::vector<std::string_view> groups;
    for (const core::StatisticField& f : core::kStatistics) {
        if (!of_shared_tier(f)) continue;
        bool seen = false;
        for (std::string_view g : groups) seen = seen || g == f.group;
        if (!seen) groups.push_back(f.group);
    }
    return groups;
}

}  // namespace

bool shared_tier_in_use(const core::Stats& stats) {
    for (const core::StatisticField& f : core::kStatistics) {
        if (of_shared_tier(f) && stats.get(f.id) != 0) return true;
    }
    return false;
}

void draw_shared_tier(const Model& model, UiState& ui) {
    const core::Stats& s = model.stats();
    if (!shared_tier_in_use(s)) return;  // no remote tier has run on this db
    ImGui::Spacing();
    ImGui::TextUnformatted("Shared tier");
    note(ui, Widget::shared_tier);
    ImGui::Separator();
    const std::uint64_t hits = s.get(core::Counter::remote_hits);
    const std::uint64_t asked = hits + s.get(core::Counter::remote_misses);
    if (asked != 0) {
        ImGui::TextDisabled("remote hit rate");
        ImGui::SameLine();
        text(fmt::format("{:.1f}% of {} entries asked for",
                         100.0 * static_cast<double>(hits) / static_cast<double>(asked), asked));
    }
    if (s.get(core::Counter::remote_breakers_open) != 0) {
        ImGui::TextColored(
            kWarn, "%llu of %llu servers failing: circuit breaker open",
            static_cast<unsigned long long>(s.get(core::Counter::remote_breakers_open)),
            static_cast<unsigned long long>(s.get(core::Counter::remote_servers)));
    }
    // The groups side by side, three to a row: each a heading over its statistics.
    const auto groups = shared_tier_groups();
    const int columns = static_cast<int>(std::min<std::size_t>(3, groups.size()));
    if (columns == 0 ||
        !ImGui::BeginTable("shared_tier", columns,
                           ImGuiTableFlags_SizingStretchSame | ImGuiTableFlags_BordersInnerV))
        return;
    for (std::size_t i = 0; i < groups.size(); ++i) {
        ImGui::TableNextColumn();
        const std::string_view group = groups[i];
        ImGui::TextColored(kDim, "%.*s", static_cast<int>(group.size()), group.data());
        for (const core::StatisticField& f : core::kStatistics) {
            if (!of_shared_tier(f) || f.group != group) continue;
            const std::uint64_t v = s.get(f.id);
            std::string label = core::counter_label(f.id);
            if (label.rfind("remote ", 0) == 0) label.erase(0, 7);  // the heading says it
            text(fmt::format(
                "{} {}", f.unit == core::Unit::bytes ? format_bytes(v) : std::to_string(v), label));
            if (ImGui::IsItemHovered()) {
                ImGui::SetTooltip("%.*s: %.*s", static_cast<int>(f.name.size()), f.name.data(),
                                  static_cast<int>(f.description.size()), f.description.data());
            }
            ui.shared_tier_drawn.push_back(f.id);
        }
    }
    ImGui::EndTable();
}

}  // namespace kcache::gui::detail
