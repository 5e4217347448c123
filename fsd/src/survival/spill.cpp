#include "spill.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "log.hpp"

namespace kcache::fsd {
namespace {

core::Status errno_status(const std::string& what) {
    return core::fail(errno, fmt::format("{}: {}", what, std::strerror(errno)));
}

core::Status pwrite_all(int fd, std::string_view data, std::uint64_t offset,
                        const std::string& path) {
    while (!data.empty()) {
        const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno_status("cannot write " + path);
        data.remove_prefix(static_cast<std::size_t>(n));
        offset += static_cast<std::uint64_t>(n);
    }
    return {};
}

class SpillFile final : public core::StagedMirror {
  public:
    SpillFile(Spills& spills, core::Ino ino, std::uint32_t id, int fd = -1)
        : m_spills(spills), m_ino(ino), m_id(id), m_path(spills.path(ino, id)), m_fd(fd) {}
    ~SpillFile() override {
        if (m_fd >= 0) ::close(m_fd);
    }
    SpillFile(const SpillFile&) = delete;
    SpillFile& operator=(const SpillFile&) = delete;

    core::Status reset(std::string_view content) override {
        const std::string fresh = m_path + ".new";
        int fd = -1;
        for (const bool again : {false, true}) {  // again: the directory was removed
            if (!m_spills.make_dir(again)) return errno_status("cannot make the spill directory");
            fd = ::open(fresh.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd >= 0 || errno != ENOENT) break;
        }
        if (fd < 0) return errno_status("cannot create " + fresh);
        auto s = pwrite_all(fd, content, 0, fresh);
        if (s && ::rename(fresh.c_str(), m_path.c_str()) != 0)
            s = errno_status("cannot rename " + fresh);
        if (!s) {
            ::close(fd);
            ::unlink(fresh.c_str());
            return s;
        }
        if (m_fd >= 0) ::close(m_fd);
        m_fd = fd;
        return {};
    }
    core::Status write(std::uint64_t offset, std::string_view data) override {
        return pwrite_all(m_fd, data, offset, m_path);
    }
    core::Status resize(std::uint64_t size) override {
        if (::ftruncate(m_fd, static_cast<off_t>(size)) != 0)
            return errno_status("cannot truncate " + m_path);
        return {};
    }
    void drop(const core::Error& why) override {
        log::error(
            "inode {}: a writer's bytes are no longer kept for a successor ({}): a crash "
            "of this daemon before its close loses them",
            m_ino, why.message);
        if (m_fd >= 0) ::close(m_fd);
        m_fd = -1;
        m_spills.remove(m_ino, m_id);
    }

  private:
    Spills& m_spills;
    const core::Ino m_ino;
    const std::uint32_t m_id;
    const std::string m_path;
    int m_fd = -1;
};

}  // namespace

Spills::Spills(std::string dir, std::uint32_t daemon)
    : m_dir(std::move(dir)), m_next(((daemon & 0x7ff) << 20) | 1) {}

std::uint32_t Spills::next_id() {
    for (;;) {
        const std::uint32_t id = m_next.fetch_add(1) & ~kRewrite;
        if (id != 0) return id;
    }
}

std::string Spills::path(core::Ino ino, std::uint32_t id) const {
    return fmt::format("{}/{}.{}", m_dir, ino, id);
}

bool Spills::make_dir(bool again) {
    if (!again && m_dir_made.load(std::memory_order_relaxed)) return true;
    if (::mkdir(m_dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
    m_dir_made.store(true, std::memory_order_relaxed);
    return true;
}

std::shared_ptr<core::StagedMirror> Spills::mirror(core::Ino ino, std::uint32_t id) {
    if (m_dir.empty()) return nullptr;
    return std::make_shared<SpillFile>(*this, ino, id);
}

std::optional<Spills::Spilled> Spills::load(core::Ino ino, std::uint32_t id) {
    if (m_dir.empty()) return std::nullopt;
    const std::string file = path(ino, id);
    const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) log::error("cannot open {}: {}", file, std::strerror(errno));
        return std::nullopt;
    }
    Spilled spilled;
    struct stat st {};
    bool ok = ::fstat(fd, &st) == 0;
    if (ok) {
        try {
            spilled.content.resize(static_cast<std::size_t>(st.st_size));
        } catch (const std::bad_alloc&) {
            errno = ENOMEM;
            ok = false;
        }
    }
    for (std::size_t at = 0; ok && at < spilled.content.size();) {
        const ssize_t n = ::pread(fd, spilled.content.data() + at, spilled.content.size() - at,
                                  static_cast<off_t>(at));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;  // shorter than it was a moment ago: not ours
            ok = false;
            break;
        }
        at += static_cast<std::size_t>(n);
    }
    if (!ok) {
        log::error("cannot read {}: {}", file, std::strerror(errno));
        ::close(fd);
        return std::nullopt;
    }
    spilled.mirror = std::make_shared<SpillFile>(*this, ino, id, fd);
    return spilled;
}

bool Spills::exists(core::Ino ino, std::uint32_t id) const {
    return !m_dir.empty() && ::access(path(ino, id).c_str(), F_OK) == 0;
}

void Spills::remove(core::Ino ino, std::uint32_t id) {
    const std::string file = path(ino, id);
    if (::unlink(file.c_str()) != 0 && errno != ENOENT)
        log::error("cannot remove {}: {}", file, std::strerror(errno));
}

void Spills::sweep(const std::set<std::pair<core::Ino, std::uint32_t>>& keep) {
    if (m_dir.empty()) return;
    DIR* dir = ::opendir(m_dir.c_str());
    if (!dir) return;  // none yet
    std::size_t removed = 0;
    while (const dirent* d = ::readdir(dir)) {
        unsigned long long ino = 0;
        unsigned id = 0;
        char rest = 0;
        // "<ino>.<id>" is kept when named; anything else (a ".new" left by a crash) goes.
        const bool named = std::sscanf(d->d_name, "%llu.%u%c", &ino, &id, &rest) == 2 &&
                           keep.count({static_cast<core::Ino>(ino), id}) > 0;
        if (named || std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0)
            continue;
        if (::unlinkat(::dirfd(dir), d->d_name, 0) == 0) ++removed;
    }
    ::closedir(dir);
    if (removed)
        log::info("removed {} spill file{} no open file needs ({})", removed,
                  removed == 1 ? "" : "s", m_dir);
}

}  // namespace kcache::fsd
