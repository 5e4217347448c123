// Entry images (entry_image.hpp): the one reader, validator and writer.
#include "kcache/core/entry_image.hpp"

#include <unistd.h>

#include <cerrno>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "kcache/core/names.hpp"
#include "store_impl.hpp"

namespace kcache::core {

namespace {

std::string dir_of(std::string_view path) {
    const std::size_t slash = path.rfind('/');
    return slash == std::string_view::npos ? std::string() : std::string(path.substr(0, slash));
}

Status checked_path(std::string_view path, std::string_view what) {
    if (auto s = check_path(path, kMaxImagePath); !s) {
        return fail(EINVAL, fmt::format("refused {}: {}", what, s.error().message));
    }
    return {};
}

}  // namespace

std::string image_dir(const EntryImage& image) {
    return dir_of(image.name);
}

std::string image_path(const EntryImage& image, const ImageFile& file) {
    if (image.kind == EntryKind::node && !image.single) return image.name + "/" + file.path;
    const std::string dir = image_dir(image);
    return dir.empty() ? file.path : dir + "/" + file.path;
}

Status check_image(const EntryImage& image) {
    if (auto s = checked_path(image.name, "entry"); !s) return s;
    const std::string dir = image_dir(image);
    if (image.kind == EntryKind::stem) {
        if (image.stem.empty() ||
            image.name != (dir.empty() ? image.stem : dir + "/" + image.stem)) {
            return fail(EINVAL, fmt::format("stem entry '{}': its name must be its directory and "
                                            "its stem",
                                            image.name));
        }
    } else if (image.kind != EntryKind::node) {
        return fail(EINVAL, fmt::format("entry '{}': unknown entry kind", image.name));
    }
    if (image.single) {
        const std::string base = image.name.substr(dir.empty() ? 0 : dir.size() + 1);
        if (image.kind != EntryKind::node || image.files.size() != 1 ||
            image.files[0].path != base || image.files[0].type == FileType::directory) {
            return fail(EINVAL, fmt::format("entry '{}': a single-file entry must be one file "
                                            "named by the entry",
                                            image.name));
        }
    }
    std::map<std::string, FileType, std::less<>> seen;
    for (const ImageFile& f : image.files) {
        if (auto s = checked_path(f.path, "file"); !s) return s;
        if (image_path(image, f).size() > kMaxImagePath) {
            return fail(EINVAL,
                        fmt::format("refused file '{}...': path too long", f.path.substr(0, 64)));
        }
        if (seen.count(f.path))
            return fail(EINVAL,
                        fmt::format("'{}' appears twice in entry '{}'", f.path, image.name));
        if (image.kind == EntryKind::stem) {
            if (f.path.find('/') != std::string::npos || !f.path.starts_with(image.stem) ||
                f.type == FileType::directory) {
                return fail(EINVAL, fmt::format("node '{}' is not a file of stem entry '{}'",
                                                f.path, image.name));
            }
        } else if (const std::string parent = dir_of(f.path); !parent.empty()) {
            auto it = seen.find(parent);
            if (it == seen.end() || it->second != FileType::directory) {
                return fail(EINVAL, fmt::format("node '{}' is not under a directory of entry '{}'",
                                                f.path, image.name));
            }
        }
        switch (f.type) {
            case FileType::regular:
                if (f.has_content && f.content.size() != f.size) {
                    return fail(EINVAL, fmt::format("'{}' holds {} bytes, not its size {}", f.path,
                                                    f.content.size(), f.size));
                }
                break;
            case FileType::symlink:
                if (auto s = check_link_target(image_path(image, f), f.target); !s)
                    return fail(EINVAL, "refused " + s.error().message);
                break;
            case FileType::directory:
                break;
            default:
                return fail(EINVAL, fmt::format("'{}': unknown node type", f.path));
        }
        seen.emplace(f.path, f.type);
    }
    return {};
}

Result<EntryImage> read_image(const Txn& txn, const EntryInfo& entry, bool contents) {
    EntryImage image;
    image.name = entry.name;
    image.kind = entry.kind;
    image.stem = entry.stem;
    image.producer = entry.producer;
    image.created_ns = entry.created_ns;
    if (entry.kind == EntryKind::node) {
        const Attr dir = KCACHE_TRY(txn.getattr(entry.ino));
        image.single = !dir.is_dir();
        if (!image.single) {
            image.dir_mode = dir.mode & 07777;
            image.dir_mtime_ns = dir.mtime_ns;
        }
    }
    std::vector<EntryFile> files;
    KCACHE_TRY(txn.for_each_entry_file(entry, [&](const EntryFile& f) {
        files.push_back(f);
        return true;
    }));
    for (EntryFile& f : files) {
        ImageFile out;
        out.path = std::move(f.path);
        out.type = f.attr.type();
        out.mode = f.attr.mode & 07777;
        out.mtime_ns = f.attr.mtime_ns;
        if (f.attr.is_symlink()) out.target = std::move(f.link_target);
        if (f.attr.is_regular()) {
            out.size = f.attr.size;
            out.digest = f.attr.digest;
            if (contents) {
                auto content = txn.read(f.attr.ino);
                if (!content) return tl::unexpected(with_context(content.error(), out.path));
                out.content = std::string(content->bytes());
                out.size = out.content.size();
                out.has_content = true;
            }
        }
        image.files.push_back(std::move(out));
    }
    return image;
}

Status write_image(WriteTxn& txn, const EntryImage& image, const ImageWrite& how) {
    const Origin origin = how.origin ? *how.origin : Origin::current();
    std::unordered_map<std::string, Ino> made;  // relative path -> ino
    const Ino parent_of_entry = KCACHE_TRY(txn.mkdirs(image_dir(image)));
    auto logged = [&](const Attr& attr, std::string_view name) -> Status {
        if (!how.log_import) return {};
        Tx tx = TxnAccess::tx(txn);
        return tx.log(EventKind::import, attr.entry ? attr.entry : attr.ino, parent_of_entry, name);
    };
    Ino top = parent_of_entry;
    if (image.kind == EntryKind::node && !image.single) {
        const std::string base = image.name.substr(image.name.rfind('/') + 1);
        auto existing = txn.lookup(parent_of_entry, base);  // an empty entry directory is filled
        auto dir = existing && existing->is_dir()
                       ? existing
                       : txn.mkdir(parent_of_entry, base, image.dir_mode, getuid(), getgid());
        if (!dir) return tl::unexpected(with_context(dir.error(), image.name));
        top = dir->ino;
        if (image.dir_mtime_ns) {
            SetAttr times;
            times.mtime_ns = *image.dir_mtime_ns;
            KCACHE_TRY(txn.setattr(top, times));
        }
        KCACHE_TRY(logged(*dir, base));
    }
    for (const ImageFile& f : image.files) {
        const std::string parent_path =
            image.kind == EntryKind::node && !image.single ? dir_of(f.path) : std::string();
        const Ino parent = parent_path.empty() ? top : made.at(parent_path);
        const std::string name = f.path.substr(f.path.rfind('/') + 1);
        Result<Attr> attr = fail(EINVAL, "unknown node type");
        switch (f.type) {
            case FileType::directory:
                attr = txn.mkdir(parent, name, f.mode, getuid(), getgid());
                break;
            case FileType::symlink:
                attr = txn.symlink(parent, name, f.target, getuid(), getgid());
                break;
            case FileType::regular: {
                attr = txn.create(parent, name, f.mode, getuid(), getgid(), true);
                std::optional<std::string_view> content;
                if (f.has_content || f.size == 0) {
                    content = f.content;
                } else if (how.content) {
                    content = how.content(f);
                }
                if (!content) {
                    return fail(EIO, fmt::format("{}: the content of {} is missing", f.path,
                                                 f.digest.hex()));
                }
                if (attr && !content->empty()) attr = txn.write(attr->ino, *content, origin);
                break;
            }
            case FileType::special:  // never read into an image; check_image refuses it
                break;
        }
        if (!attr) return tl::unexpected(with_context(attr.error(), f.path));
        SetAttr times;
        times.mtime_ns = f.mtime_ns;
        KCACHE_TRY(txn.setattr(attr->ino, times));
        if (top == parent_of_entry) {  // a stem entry's file, or a single entry's node
            KCACHE_TRY(logged(*attr, name));
            if (image.single) top = attr->ino;
        }
        made[f.path] = attr->ino;
    }
    if (!how.same_entry) return {};
    auto formed = txn.find_entry(image.name);
    if (!formed || formed->kind != image.kind ||
        (image.kind == EntryKind::node && formed->ino != top)) {
        return fail(EINVAL,
                    fmt::format("'{}' would not form the same entry here (the layout rules differ)",
                                image.name));
    }
    return {};
}

}  // namespace kcache::core
