#include "kcache/loader/cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "kcache/core/entry_files.hpp"
#include "kcache/core/names.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/store.hpp"

namespace kcache::loader {
namespace {

using core::fail;
namespace fs = std::filesystem;

constexpr std::size_t kMaxFiles = 10000;  // files listed per entry
constexpr int kMaxDepth = 16;             // directory levels below an entry

std::string errno_text(int code) {
    return std::strerror(code);
}

// A key is a relative path (core::check_path); one trailing '/' is allowed.
Status check_key(std::string_view key) {
    if (key.empty()) return fail(EINVAL, "an entry key must not be empty");
    if (key.size() > 1 && key.back() == '/') key.remove_suffix(1);
    if (auto s = core::check_path(key); !s) {
        return tl::unexpected(core::with_context(s.error(), "entry key"));
    }
    return {};
}

// The key without a trailing '/'.
std::string_view trim_key(std::string_view key) {
    while (key.size() > 1 && key.back() == '/') key.remove_suffix(1);
    return key;
}

bool skipped_dir(std::string_view name) {
    return name.starts_with("tmp.");
}

Status too_many(std::string_view key) {
    return fail(E2BIG, fmt::format("entry {} has more than {} files", key, kMaxFiles));
}

// A plain file of an entry, as stat(2) describes it.
EntryFile plain_file(std::string path, const struct stat& st) {
    EntryFile file;
    file.role = core::role_of(fs::path(path).filename().string());
    file.path = std::move(path);
    file.attr.mode = static_cast<std::uint32_t>(st.st_mode);
    file.attr.size = static_cast<std::uint64_t>(st.st_size);
    return file;
}

bool by_path(const EntryFile& a, const EntryFile& b) {
    return a.path < b.path;
}

// ---- plain directory ----------------------------------------------------------------

class DirEntry final : public Entry {
  public:
    DirEntry(std::string key, std::string root, std::vector<EntryFile> files, bool is_file)
        : m_root(std::move(root)), m_is_file(is_file) {
        m_key = std::move(key);
        m_files = std::move(files);
    }

    Result<std::string_view> read(std::string_view name) override {
        if (auto it = m_content.find(name); it != m_content.end())
            return std::string_view(it->second);
        const auto file = std::find_if(m_files.begin(), m_files.end(),
                                       [&](const EntryFile& f) { return f.path == name; });
        if (file == m_files.end()) {
            return fail(ENOENT, fmt::format("entry {} has no file {}", m_key, name));
        }
        const std::string path = m_is_file ? m_root : m_root + "/" + file->path;
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return fail(errno, fmt::format("{}: {}", path, errno_text(errno)));
        std::string bytes;
        struct stat st {};
        if (::fstat(fd, &st) == 0 && st.st_size > 0)
            bytes.reserve(static_cast<std::size_t>(st.st_size));
        char buffer[65536];
        for (;;) {
            const ssize_t n = ::read(fd, buffer, sizeof buffer);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                const int code = errno;
                ::close(fd);
                return fail(code, fmt::format("{}: {}", path, errno_text(code)));
            }
            if (n == 0) break;
            bytes.append(buffer, static_cast<std::size_t>(n));
        }
        ::close(fd);
        auto [it, _] = m_content.emplace(std::string(name), std::move(bytes));
        return std::string_view(it->second);
    }

  private:
    std::string m_root;  // the entry's directory, or the file of a flat entry
    bool m_is_file;
    std::map<std::string, std::string, std::less<>> m_content;
};

// Regular files below `dir` (following symbolic links to files), in name order.
Status list_dir(const std::string& dir, const std::string& prefix, int depth, std::string_view key,
                std::vector<EntryFile>& out) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return fail(errno, fmt::format("{}: {}", dir, errno_text(errno)));
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
        const std::string_view name = e->d_name;
        if (name == "." || name == "..") continue;
        names.emplace_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
        const std::string path = dir + "/" + name;
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) continue;  // removed meanwhile, or a dangling link
        if (S_ISREG(st.st_mode)) {
            if (out.size() >= kMaxFiles) return too_many(key);
            out.push_back(plain_file(prefix + name, st));
        } else if (S_ISDIR(st.st_mode) && !skipped_dir(name) && depth < kMaxDepth) {
            if (auto s = list_dir(path, prefix + name + "/", depth + 1, key, out); !s) return s;
        }
    }
    return {};
}

class DirCache final : public Cache {
  public:
    explicit DirCache(std::string path) {
        m_kind = Kind::directory;
        m_path = std::move(path);
    }

    Result<std::unique_ptr<Entry>> entry(std::string_view raw_key) const override {
        KCACHE_TRY(check_key(raw_key));
        const std::string key(trim_key(raw_key));
        const std::string path = m_path + "/" + key;
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) {
            const int code = errno;
            if (code == ENOENT || code == ENOTDIR) {
                return fail(ENOENT, fmt::format("no entry {} in {}", key, m_path));
            }
            return fail(code, fmt::format("{}: {}", path, errno_text(code)));
        }
        std::vector<EntryFile> files;
        if (S_ISREG(st.st_mode)) {
            files.push_back(plain_file(fs::path(key).filename().string(), st));
            return std::unique_ptr<Entry>(new DirEntry(key, path, std::move(files), true));
        }
        if (!S_ISDIR(st.st_mode)) {
            return fail(ENOENT, fmt::format("{} is neither a file nor a directory", path));
        }
        KCACHE_TRY(list_dir(path, "", 0, key, files));
        std::sort(files.begin(), files.end(), by_path);
        return std::unique_ptr<Entry>(new DirEntry(key, path, std::move(files), false));
    }
};

// ---- LMDB db --------------------------------------------------------------------------

class DbEntry final : public Entry {
  public:
    DbEntry(std::shared_ptr<const Cache> cache, std::string key, core::Txn txn,
            std::vector<EntryFile> files)
        : m_cache(std::move(cache)), m_txn(std::move(txn)) {
        m_key = std::move(key);
        m_files = std::move(files);
    }

    Result<std::string_view> read(std::string_view name) override {
        if (auto it = m_content.find(name); it != m_content.end()) return it->second.bytes();
        const auto file = std::find_if(m_files.begin(), m_files.end(),
                                       [&](const EntryFile& f) { return f.path == name; });
        if (file == m_files.end()) {
            return fail(ENOENT, fmt::format("entry {} has no file {}", m_key, name));
        }
        auto content = m_txn.read(file->attr.ino);
        if (!content) {
            return tl::unexpected(
                core::with_context(content.error(), fmt::format("entry {}: {}", m_key, name)));
        }
        auto [it, _] = m_content.emplace(std::string(name), std::move(*content));
        return it->second.bytes();
    }

  private:
    std::shared_ptr<const Cache> m_cache;  // owns the Store the snapshot is of
    core::Txn m_txn;                       // the snapshot every read comes from
    std::map<std::string, core::Content, std::less<>> m_content;
};

class DbCache final : public Cache {
  public:
    explicit DbCache(std::unique_ptr<core::Store> store) : m_store(std::move(store)) {
        m_kind = Kind::db;
        m_path = m_store->path();
    }

    Result<std::unique_ptr<Entry>> entry(std::string_view raw_key) const override {
        KCACHE_TRY(check_key(raw_key));
        std::string key(trim_key(raw_key));
        auto txn = KCACHE_TRY(m_store->read());
        auto ino = txn.resolve(key);
        if (!ino && ino.error().code == ENOENT && key.find('/') == std::string::npos) {
            // A compiler's cache key alone (Triton's <hash>): the entry of that name
            // wherever the compiler's directory sits in the cache (triton/<hash>).
            const std::string suffix = "/" + key;
            std::string found;
            (void)txn.for_each_entry([&](const core::EntryInfo& e) {
                if (e.kind == core::EntryKind::node && e.name.ends_with(suffix)) found = e.name;
                return found.empty();
            });
            if (!found.empty()) {
                key = std::move(found);
                ino = txn.resolve(key);
            }
        }
        if (!ino) {
            if (ino.error().code == ENOENT || ino.error().code == ENOTDIR) {
                return fail(ENOENT, fmt::format("no entry {} in db {}", key, m_path));
            }
            return tl::unexpected(ino.error());
        }
        auto attr = KCACHE_TRY(txn.getattr(*ino));
        std::vector<EntryFile> files;
        if (attr.is_regular()) {
            const std::string name = fs::path(key).filename().string();
            files.push_back(EntryFile{name, attr, {}, core::role_of(name)});
        } else if (attr.is_dir()) {
            // Regular files (no symlinks) below it, to kMaxDepth levels, tmp.* left out.
            Status listed;
            KCACHE_TRY(core::walk_below(txn, *ino, [&](const EntryFile& file) {
                if (file.attr.is_dir()) {
                    const auto depth = std::count(file.path.begin(), file.path.end(), '/');
                    const std::string_view name =
                        std::string_view(file.path).substr(file.path.rfind('/') + 1);
                    return skipped_dir(name) || depth >= kMaxDepth ? core::Walk::skip
                                                                   : core::Walk::next;
                }
                if (!file.attr.is_regular()) return core::Walk::next;
                if (files.size() >= kMaxFiles) {
                    listed = too_many(key);
                    return core::Walk::stop;
                }
                files.push_back(file);
                return core::Walk::next;
            }));
            KCACHE_TRY(listed);
            std::sort(files.begin(), files.end(), by_path);
        } else {
            return fail(ENOENT,
                        fmt::format("{} in db {} is neither a file nor a directory", key, m_path));
        }
        return std::unique_ptr<Entry>(
            new DbEntry(shared_from_this(), key, std::move(txn), std::move(files)));
    }

  private:
    std::unique_ptr<core::Store> m_store;
};

}  // namespace

std::string_view cache_kind_name(Cache::Kind kind) {
    return kind == Cache::Kind::db ? "db" : "directory";
}

Result<std::shared_ptr<Cache>> Cache::open(const std::string& path) {
    if (path.empty()) return fail(EINVAL, "the cache path must not be empty");
    std::error_code ec;
    const std::string absolute = fs::absolute(path, ec).lexically_normal().string();
    if (ec) return fail(ec.value(), fmt::format("{}: {}", path, ec.message()));
    std::string root = absolute;
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    struct stat st {};
    if (::stat(root.c_str(), &st) != 0) {
        const int code = errno;
        if (code == ENOENT) return fail(ENOENT, fmt::format("no cache at {}", root));
        return fail(code, fmt::format("{}: {}", root, errno_text(code)));
    }
    if (!S_ISDIR(st.st_mode)) return fail(ENOTDIR, fmt::format("{} is not a directory", root));
    if (::access((root + "/data.mdb").c_str(), F_OK) == 0) {
        core::OpenOptions options;
        options.path = root;
        options.create = false;
        options.read_only = true;
        auto store = KCACHE_TRY(core::Store::open(options));
        return std::shared_ptr<Cache>(new DbCache(std::move(store)));
    }
    return std::shared_ptr<Cache>(new DirCache(root));
}

}  // namespace kcache::loader
