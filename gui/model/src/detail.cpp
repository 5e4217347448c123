#include "kcache/gui/detail.hpp"

#include <algorithm>
#include <cerrno>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "kcache/core/entry_files.hpp"

namespace kcache::gui {

core::Result<EntryDetail> EntryDetail::load(const core::Store& store, core::Ino entry) {
    auto txn = KCACHE_TRY(store.read());
    auto info = KCACHE_TRY(txn.entry(entry));
    EntryDetail detail;
    detail.m_info = std::move(info);
    detail.m_txn_id = txn.id();
    detail.m_files = KCACHE_TRY(core::entry_files(txn, detail.m_info));
    return detail;
}

bool looks_like_text(std::string_view bytes) {
    const std::size_t n = std::min<std::size_t>(bytes.size(), 4096);
    std::size_t control = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const auto c = static_cast<unsigned char>(bytes[i]);
        if (c == 0) return false;
        if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') ++control;
    }
    return control * 32 <= n;
}

core::Result<FileView> load_file_view(const core::Store& store, const EntryFile& file,
                                      std::size_t max_bytes) {
    FileView view;
    view.ino = file.attr.ino;
    view.path = file.path;
    view.size = file.attr.size;
    if (file.attr.is_symlink()) {
        view.text.assign(fmt::format("symbolic link to {}", file.link_target));
        return view;
    }
    if (!file.attr.is_regular()) {
        return core::fail(EISDIR, fmt::format("{} is not a regular file", file.path));
    }
    {
        auto txn = KCACHE_TRY(store.read());
        view.bytes.reserve(std::min<std::uint64_t>(file.attr.size, max_bytes));
        KCACHE_TRY(txn.read_pieces(file.attr.ino, [&](std::string_view piece) {
            const std::size_t room = max_bytes - view.bytes.size();
            if (piece.size() > room) view.truncated = true;
            view.bytes.append(piece.substr(0, room));
        }));
        view.size = std::max<std::uint64_t>(view.size, view.bytes.size());
    }

    const bool text = looks_like_text(view.bytes);
    if (file.role == core::Role::binary || !text) {
        view.kind = FileView::Kind::binary;
        if (!view.truncated) {
            auto info = loader::inspect(view.bytes);
            if (info) {
                view.binary = std::move(*info);
            } else {
                view.binary_error = info.error().message;
            }
        } else {
            view.binary_error = "too large to introspect here";
        }
        return view;
    }
    if (file.role == core::Role::signature) {
        view.kind = FileView::Kind::signature;
        const auto json = nlohmann::json::parse(view.bytes, nullptr, /*allow_exceptions=*/false);
        if (!json.is_discarded()) {
            view.text.assign(json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
            return view;
        }
    }
    view.text.assign(view.bytes);
    return view;
}

}  // namespace kcache::gui
