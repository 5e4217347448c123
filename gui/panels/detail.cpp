// The entry window: the focused entry's record, its files, and a viewer for one file
// (text with line numbers and search, a pretty-printed signature, or a binary as the
// loader's introspection and as hex).

#include <cxxabi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <fmt/core.h>

#include "internal.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/loader/introspect.hpp"

namespace kcache::gui::detail {
namespace {

template <typename T>
bool ready(const std::future<T>& f) {
    return f.valid() && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// Takes the worker's loads once they arrive (never waits).
void receive(UiState& ui) {
    if (ready(ui.detail_loading)) {
        auto loaded = ui.detail_loading.get();
        if (!loaded) {
            ui.detail_error = loaded.error().code == ENOENT
                                  ? "this entry is gone (evicted or removed)"
                                  : loaded.error().message;
            ui.detail.reset();
            ui.view.reset();
        } else {
            ui.detail = std::move(*loaded);
            if (ui.file_index >= static_cast<int>(ui.detail->files().size())) ui.file_index = -1;
        }
    }
    if (ready(ui.view_loading)) {
        auto view = ui.view_loading.get();
        if (view) {
            ui.view = std::move(*view);
        } else {
            ui.view_error = view.error().message;
        }
    }
}

// Asks the worker for the detail when the focused entry or the db changed.
void sync_detail(Model& model, UiState& ui) {
    receive(ui);
    const core::Ino ino = model.focused().value_or(0);
    if (ino == ui.detail_ino && model.txn_id() == ui.detail_txn) return;
    const bool same_entry = ino == ui.detail_ino;
    ui.detail_ino = ino;
    ui.detail_txn = model.txn_id();
    // Same entry, newer db: keep showing the old detail until the new one arrives.
    if (!same_entry) ui.detail.reset();
    ui.detail_error.clear();
    if (!same_entry) {
        ui.file_index = -1;
        ui.view.reset();
        ui.view_loading = {};
        ui.view_error.clear();
        ui.search_line.reset();
    }
    ui.detail_loading = {};
    if (ino == 0) {
        ui.detail.reset();
        return;
    }
    ui.detail_loading = model.load_detail(ino);
}

void open_file(Model& model, UiState& ui, int index) {
    ui.file_index = index;
    ui.view.reset();
    ui.view_error.clear();
    ui.search_line.reset();
    ui.view_loading = model.load_file(ui.detail->files()[static_cast<std::size_t>(index)]);
}

void draw_info(const Model& model, const core::EntryInfo& info) {
    if (!ImGui::BeginTable("info", 4, ImGuiTableFlags_SizingStretchProp)) return;
    const std::int64_t now = model.now_ns();
    auto pair = [&](const char* a, std::string va, const char* b, std::string vb) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::TextDisabled("%s", a);
        ImGui::TableSetColumnIndex(1);
        text(va);
        ImGui::TableSetColumnIndex(2);
        ImGui::TextDisabled("%s", b);
        ImGui::TableSetColumnIndex(3);
        text(vb);
    };
    pair("producer", std::string(core::producer_name(info.producer)), "files",
         std::to_string(info.files));
    pair("bytes", format_bytes(info.bytes), "stored", format_bytes(info.stored_bytes));
    pair("hits", std::to_string(info.hits), "last hit", format_ago(now, info.last_hit_ns));
    pair("created", format_ago(now, info.created_ns), "last access",
         format_ago(now, info.last_access_ns));
    pair("pinned", info.pinned ? "yes" : "no", "populated by",
         info.populated_by_name.empty()
             ? std::string("-")
             : fmt::format("{} (pid {})", info.populated_by_name, info.populated_by_pid));
    ImGui::EndTable();
}

void draw_files(Model& model, UiState& ui) {
    const auto& files = ui.detail->files();
    const float height =
        std::min<float>(static_cast<float>(files.size()) + 1.5f, 7.0f) * ImGui::GetFrameHeight();
    constexpr ImGuiTableFlags kFlags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersOuter |
                                       ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit;
    if (!ImGui::BeginTable("files", 4, kFlags, ImVec2(0, height))) return;
    ImGui::TableSetupColumn("Path", ImGuiTableColumnFlags_WidthStretch);
    ImGui::TableSetupColumn("Role");
    ImGui::TableSetupColumn("Size");
    ImGui::TableSetupColumn("Digest");
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableHeadersRow();
    for (std::size_t i = 0; i < files.size(); ++i) {
        const EntryFile& file = files[i];
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::PushID(static_cast<int>(i));
        const std::string label =
            file.attr.is_symlink() ? file.path + " -> " + file.link_target : file.path;
        if (ImGui::Selectable(label.c_str(), ui.file_index == static_cast<int>(i),
                              ImGuiSelectableFlags_SpanAllColumns)) {
            open_file(model, ui, static_cast<int>(i));
        }
        ImGui::PopID();
        ImGui::TableSetColumnIndex(1);
        text(file.attr.is_symlink() ? "symlink" : core::role_name(file.role));
        ImGui::TableSetColumnIndex(2);
        text(format_bytes(file.attr.size));
        ImGui::TableSetColumnIndex(3);
        ImGui::TextDisabled("%s", file.attr.is_regular() ? file.attr.digest.hex().c_str() : "");
    }
    ImGui::EndTable();
}

// Lines with numbers, drawn through the clipper; the line found by search is marked.
void draw_text(UiState& ui, const TextDocument& doc) {
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
    const bool enter =
        ImGui::InputTextWithHint("##search", "Search", ui.search.data(), ui.search.size(),
                                 ImGuiInputTextFlags_EnterReturnsTrue);
    ImGui::SameLine();
    const bool next = ImGui::Button("Next") || enter;
    ImGui::SameLine();
    const bool prev = ImGui::Button("Prev");
    const std::string_view query(ui.search.data());
    if ((next || prev) && !query.empty()) {
        const std::size_t from = ui.search_line.value_or(next ? doc.line_count() - 1 : 0);
        ui.search_line = doc.find(query, from, next);
        ui.scroll_to_search = ui.search_line.has_value();
    }
    ImGui::SameLine();
    if (!query.empty() && (next || prev) && !ui.search_line) {
        ImGui::TextColored(kWarn, "not found");
    } else if (ui.search_line) {
        ImGui::TextDisabled("line %zu", *ui.search_line + 1);
    } else {
        ImGui::TextDisabled("%zu lines", doc.line_count());
    }

    ImGui::BeginChild("text", ImVec2(0, 0), true, ImGuiWindowFlags_HorizontalScrollbar);
    const float line_height = ImGui::GetTextLineHeightWithSpacing();
    if (ui.scroll_to_search && ui.search_line) {
        const float y = static_cast<float>(*ui.search_line) * line_height;
        ImGui::SetScrollY(std::max(0.0f, y - ImGui::GetWindowHeight() / 3));
        ui.scroll_to_search = false;
    }
    const int digits = std::max(3, static_cast<int>(std::to_string(doc.line_count()).size()));
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(doc.line_count()), line_height);
    while (clipper.Step()) {
        for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
            const auto line = static_cast<std::size_t>(i);
            if (ui.search_line == line) {
                const ImVec2 p = ImGui::GetCursorScreenPos();
                ImGui::GetWindowDrawList()->AddRectFilled(
                    p,
                    ImVec2(p.x + ImGui::GetContentRegionAvail().x + ImGui::GetScrollMaxX() + 4000,
                           p.y + line_height),
                    IM_COL32(90, 80, 20, 160));
            }
            ImGui::TextColored(kDim, "%*d", digits, i + 1);
            ImGui::SameLine();
            text(doc.line(line));
        }
    }
    ImGui::EndChild();
}

// "matmul_tiled<float, 16>(float const*, ...)" for a mangled C++ name; the name
// itself when it is not one (extern "C" kernels, Triton's).
std::string demangle(const std::string& name) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> out(
        abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
    return status == 0 && out ? std::string(out.get()) : name;
}

void draw_kernels(const std::vector<loader::KernelInfo>& kernels) {
    for (const auto& kernel : kernels) {
        const std::string shown = demangle(kernel.name);
        const bool open = ImGui::TreeNodeEx(kernel.name.c_str(), ImGuiTreeNodeFlags_DefaultOpen,
                                            "%s  (%zu params, %u bytes)", shown.c_str(),
                                            kernel.params.size(), kernel.param_bytes);
        if (ImGui::IsItemHovered() && shown != kernel.name) {
            ImGui::SetTooltip("%s", kernel.name.c_str());
        }
        if (!open) continue;
        if (!kernel.params.empty() &&
            ImGui::BeginTable("params", 3,
                              ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg)) {
            ImGui::TableSetupColumn("index");
            ImGui::TableSetupColumn("offset");
            ImGui::TableSetupColumn("size");
            ImGui::TableHeadersRow();
            for (const auto& p : kernel.params) {
                ImGui::TableNextRow();
                ImGui::TableSetColumnIndex(0);
                ImGui::Text("%u", p.index);
                ImGui::TableSetColumnIndex(1);
                ImGui::Text("%u", p.offset);
                ImGui::TableSetColumnIndex(2);
                ImGui::Text("%u", p.size);
            }
            ImGui::EndTable();
        }
        ImGui::TreePop();
    }
}

void draw_introspection(const FileView& view) {
    if (!view.binary) {
        ImGui::TextColored(kDim, "The loader cannot read this binary: %s",
                           view.binary_error.c_str());
        return;
    }
    const loader::BinaryInfo& info = *view.binary;
    ImGui::Text("%s%s%s", std::string(loader::format_name(info.format)).c_str(),
                info.arch.empty() ? "" : ", ", info.arch.c_str());
    if (!info.ptx_version.empty()) {
        ImGui::SameLine();
        ImGui::TextDisabled("(PTX ISA %s)", info.ptx_version.c_str());
    }
    if (!info.host_section.empty()) ImGui::TextDisabled("in %s", info.host_section.c_str());
    draw_kernels(info.kernels);
    for (std::size_t i = 0; i < info.entries.size(); ++i) {
        const loader::FatbinEntry& e = info.entries[i];
        ImGui::PushID(static_cast<int>(i));
        const std::string label = fmt::format(
            "entry {}: {} {}, {}{}{}", i, loader::kind_name(e.kind), e.arch, format_bytes(e.size),
            e.compressed ? fmt::format(" ({})", loader::compression_name(e.compression)) : "",
            e.ptx_version.empty() ? "" : fmt::format(", PTX ISA {}", e.ptx_version));
        if (ImGui::TreeNodeEx("entry", ImGuiTreeNodeFlags_DefaultOpen, "%s", label.c_str())) {
            if (e.kernels) draw_kernels(*e.kernels);
            ImGui::TreePop();
        }
        ImGui::PopID();
    }
}

void draw_hex(const FileView& view) {
    ImGui::BeginChild("hex", ImVec2(0, 0), true, ImGuiWindowFlags_HorizontalScrollbar);
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(hex_line_count(view.bytes.size())),
                  ImGui::GetTextLineHeightWithSpacing());
    while (clipper.Step()) {
        for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
            text(hex_line(view.bytes, static_cast<std::size_t>(i)));
        }
    }
    ImGui::EndChild();
}

void draw_view(UiState& ui) {
    if (!ui.view_error.empty()) {
        ImGui::TextColored(kWarn, "%s", ui.view_error.c_str());
        return;
    }
    if (!ui.view) {
        ImGui::TextDisabled("Select a file to view it.");
        return;
    }
    const FileView& view = *ui.view;
    if (view.truncated) {
        ImGui::TextColored(kWarn, "showing the first %s of %s",
                           format_bytes(view.bytes.size()).c_str(),
                           format_bytes(view.size).c_str());
    }
    if (view.kind != FileView::Kind::binary) {
        draw_text(ui, view.text);
        return;
    }
    if (ImGui::BeginTabBar("binary")) {
        if (ImGui::BeginTabItem("Introspection")) {
            ImGui::BeginChild("intro", ImVec2(0, 0), true);
            draw_introspection(view);
            ImGui::EndChild();
            ImGui::EndTabItem();
        }
        if (ImGui::BeginTabItem("Hex")) {
            draw_hex(view);
            ImGui::EndTabItem();
        }
        ImGui::EndTabBar();
    }
}

}  // namespace

bool open_entry_file(Model& model, UiState& ui, std::string_view file) {
    sync_detail(model, ui);
    if (ui.detail_loading.valid()) ui.detail_loading.wait();  // --select: not a frame
    receive(ui);
    if (!ui.detail) return false;
    const auto& files = ui.detail->files();
    for (std::size_t i = 0; i < files.size(); ++i) {
        if (files[i].path == file) {
            open_file(model, ui, static_cast<int>(i));
            ui.view_loading.wait();
            receive(ui);
            return ui.view.has_value();
        }
    }
    return false;
}

void draw_entry_detail(Model& model, UiState& ui) {
    place_window(0.0f, 0.56f, 0.62f, 0.44f);
    if (!ImGui::Begin("Entry", &ui.show_detail)) {
        ImGui::End();
        return;
    }
    sync_detail(model, ui);
    if (!ui.detail_error.empty()) {
        ImGui::TextColored(kWarn, "%s", ui.detail_error.c_str());
    } else if (!ui.detail) {
        ImGui::TextDisabled("Click an entry to see its files, signature, IR and binary.");
    } else {
        text(ui.detail->info().name);
        draw_info(model, ui.detail->info());
        draw_files(model, ui);
        draw_view(ui);
    }
    ImGui::End();
}

}  // namespace kcache::gui::detail
