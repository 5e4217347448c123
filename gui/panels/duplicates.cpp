// The duplicates window: one binary stored under several entry keys, grouped. A group
// is what an unstable cache key looks like: the compiler hashed something that does
// not change the code. The scan runs a few milliseconds per frame (draw_inspector).

#include <fmt/core.h>

#include "internal.hpp"

namespace kcache::gui::detail {

void draw_duplicates(Model& model, UiState& ui) {
    place_window(0.62f, 0.64f, 0.38f, 0.36f);
    if (!ImGui::Begin("Duplicates", &ui.show_duplicates)) {
        ImGui::End();
        return;
    }
    const DuplicateReport& scan = model.duplicates();
    const bool running = scan.running();
    ImGui::BeginDisabled(running);
    if (ImGui::Button(scan.started() ? "Scan again" : "Find duplicates")) {
        if (auto started = model.start_duplicate_scan(); !started) {
            set_status(ui, "duplicates: " + started.error().message, true);
        }
    }
    note(ui, Widget::find_duplicates);
    ImGui::EndDisabled();
    ImGui::SameLine();
    if (!scan.started()) {
        ImGui::TextDisabled("binaries stored under more than one entry key");
        ImGui::TextWrapped(
            "The same binary under several keys means the cache key changes when the code "
            "does not (a timestamp, a path or an unused flag in the hash): every such key "
            "is a miss that recompiled for nothing.");
        ImGui::End();
        return;
    }
    if (running) {
        const float done =
            scan.total() ? static_cast<float>(scan.scanned()) / static_cast<float>(scan.total())
                         : 1.0f;
        ImGui::ProgressBar(done, ImVec2(-1, 0),
                           fmt::format("{} / {} entries", scan.scanned(), scan.total()).c_str());
        ImGui::End();
        return;
    }
    const auto& groups = scan.groups();
    std::size_t extra_keys = 0;
    for (const auto& g : groups) extra_keys += g.entries.size() - 1;
    ImGui::Text("%zu %s under more than one key: %zu %s compiled again", groups.size(),
                groups.size() == 1 ? "binary" : "binaries", extra_keys,
                extra_keys == 1 ? "key" : "keys");
    if (scan.txn_id() != model.txn_id()) {
        ImGui::SameLine();
        ImGui::TextColored(kDim, "(the db changed since)");
    }
    ImGui::BeginChild("groups");
    for (std::size_t i = 0; i < groups.size(); ++i) {
        const DuplicateGroup& g = groups[i];
        ImGui::PushID(static_cast<int>(i));
        const bool open = ImGui::TreeNodeEx("group", i < 3 ? ImGuiTreeNodeFlags_DefaultOpen : 0,
                                            "%s, %s, under %zu keys", g.file_name.c_str(),
                                            format_bytes(g.size).c_str(), g.entries.size());
        if (ImGui::IsItemHovered()) ImGui::SetTooltip("digest %s", g.digest.hex().c_str());
        if (open) {
            for (std::size_t k = 0; k < g.entries.size(); ++k) {
                ImGui::PushID(static_cast<int>(k));
                const bool exists = model.row(g.entries[k]) != nullptr;
                if (!exists) ImGui::BeginDisabled();
                if (ImGui::Selectable(g.keys[k].c_str(), model.focused() == g.entries[k])) {
                    focus_entry(model, ui, g.entries[k]);
                }
                if (!exists) ImGui::EndDisabled();
                ImGui::PopID();
            }
            ImGui::TreePop();
        }
        ImGui::PopID();
    }
    ImGui::EndChild();
    ImGui::End();
}

}  // namespace kcache::gui::detail
