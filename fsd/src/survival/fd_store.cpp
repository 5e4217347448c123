#include "fd_store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "fd_passing.hpp"
#include "log.hpp"
#include "state.hpp"
#include "uring_area.hpp"

namespace kcache::fsd::fd_store {

namespace {

constexpr unsigned kFuseMajor = 10;  // /dev/fuse: the misc device 10:229
constexpr unsigned kFuseMinor = 229;
constexpr int kListenFdsStart = 3;  // SD_LISTEN_FDS_START

// The address of $NOTIFY_SOCKET ('@' for an abstract socket); false without one.
bool notify_address(sockaddr_un& addr, socklen_t& len) {
    const char* env = std::getenv("NOTIFY_SOCKET");
    if (!env || !*env) return false;
    std::string path(env);
    addr = {};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) {
        log::warning("systemd: NOTIFY_SOCKET is too long: {}", path);
        return false;
    }
    if (path[0] == '@') path[0] = '\0';
    std::memcpy(addr.sun_path, path.data(), path.size());
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
    return true;
}

// /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& field) {
    std::string out;
    for (std::size_t i = 0; i < field.size(); ++i) {
        if (field[i] == '\\' && i + 3 < field.size()) {
            const std::string octal = field.substr(i + 1, 3);
            if (octal.find_first_not_of("01234567") == std::string::npos) {
                out.push_back(static_cast<char>(std::stoi(octal, nullptr, 8)));
                i += 3;
                continue;
            }
        }
        out.push_back(field[i]);
    }
    return out;
}

// The file system type and source of the topmost mount at `mountpoint`, from
// /proc/self/mountinfo (which never asks a FUSE daemon); nullopt if none.
struct MountEntry {
    std::string type;
    std::string source;
};
std::optional<MountEntry> mount_at(const std::string& mountpoint) {
    std::ifstream in("/proc/self/mountinfo");
    std::optional<MountEntry> found;
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string id, parent, dev, root, point;
        fields >> id >> parent >> dev >> root >> point;
        const auto dash = line.find(" - ");
        if (dash == std::string::npos || unescape(point) != mountpoint) continue;
        std::istringstream rest(line.substr(dash + 3));
        MountEntry entry;
        rest >> entry.type >> entry.source;
        entry.source = unescape(entry.source);
        found = entry;  // later lines are mounted over earlier ones
    }
    return found;
}

// Why `fd` is not the mount's live /dev/fuse file; "" when it is.
std::string check_fuse(int fd, const std::string& mountpoint, const std::string& db) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fmt::format("fstat: {}", std::strerror(errno));
    if (!S_ISCHR(st.st_mode) || major(st.st_rdev) != kFuseMajor ||
        minor(st.st_rdev) != kFuseMinor) {
        if (S_ISCHR(st.st_mode))
            return fmt::format("not /dev/fuse (a character device {}:{}, not {}:{})",
                               major(st.st_rdev), minor(st.st_rdev), kFuseMajor, kFuseMinor);
        return "not /dev/fuse (not a character device)";
    }
    // The kernel's fuse_dev_poll: POLLERR for a file attached to no connection, or to
    // one that was aborted or unmounted. Polling takes no request off the queue.
    pollfd p{fd, 0, 0};
    if (::poll(&p, 1, 0) < 0) return fmt::format("poll: {}", std::strerror(errno));
    if (p.revents & (POLLERR | POLLNVAL | POLLHUP))
        return "its FUSE connection is dead (the mount was unmounted or aborted, or it never "
               "had one)";
    const auto mount = mount_at(mountpoint);
    if (!mount) return fmt::format("nothing is mounted at {}", mountpoint);
    if (mount->type != "fuse.kcache")
        return fmt::format("the mount at {} is {} {}, not a kcache mount", mountpoint, mount->type,
                           mount->source);
    if (mount->source != "kcache:" + db)
        return fmt::format("the mount at {} serves the db {}, not {}", mountpoint,
                           mount->source.substr(7), db);
    return "";
}

// Why `fd` is not a keeper's state memfd of this layout; "" when it is.
std::string check_state(int fd) {
    char link[256] = {};
    const std::string self = fmt::format("/proc/self/fd/{}", fd);
    const ssize_t n = ::readlink(self.c_str(), link, sizeof link - 1);
    const std::string target = n > 0 ? std::string(link, static_cast<std::size_t>(n)) : "";
    const std::string want = std::string("/memfd:") + kStateMemfdName;
    if (target.rfind(want, 0) != 0)
        return fmt::format("not kcache-fsd's state memfd (it is {})",
                           target.empty() ? "?" : target);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fmt::format("fstat: {}", std::strerror(errno));
    // An older keeper's memfd may end after the handle records (no hit pairs):
    // StateFile::map grows it. One with io_uring ring entries goes on past them
    // (uring_area.hpp checks its own header).
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const auto largest = static_cast<std::uint64_t>(uring_area::kOffset) + uring_area::kMaxSize;
    if (size < StateFile::kRecordsEnd || size > largest)
        return fmt::format("the state memfd has {} bytes, this kcache-fsd's has {} to {}",
                           st.st_size, StateFile::kRecordsEnd, largest);
    void* map = ::mmap(nullptr, sizeof(StateHeader), PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) return fmt::format("mmap: {}", std::strerror(errno));
    const auto* h = static_cast<const StateHeader*>(map);
    std::string why;
    if (h->magic != kStateMagic)
        why =
            "the state memfd holds no kcache-fsd state (no magic: its first daemon never "
            "started)";
    else if (h->layout != kLayout || h->slots != kHandleSlots)
        why = fmt::format("the state memfd has layout {} ({} slots), this kcache-fsd reads {} ({})",
                          h->layout, h->slots, kLayout, kHandleSlots);
    ::munmap(map, sizeof(StateHeader));
    return why;
}

// Why `fd` is not db/daemon.lock, lockable by this file; "" when it is.
std::string check_lock(int fd, const std::string& db) {
    const std::string path = db + "/daemon.lock";
    struct stat got {
    }, want{};
    if (::fstat(fd, &got) != 0) return fmt::format("fstat: {}", std::strerror(errno));
    if (::stat(path.c_str(), &want) != 0) return fmt::format("{}: {}", path, std::strerror(errno));
    if (!S_ISREG(got.st_mode) || got.st_dev != want.st_dev || got.st_ino != want.st_ino)
        return fmt::format("not {} (another file)", path);
    // Held through this open file (ours, shared with systemd's copy) or by nobody.
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
        return fmt::format("{} is locked by another process (another daemon serves the db)", path);
    return "";
}

std::vector<std::string> split(const std::string& text, char sep) {
    std::vector<std::string> out;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, sep)) out.push_back(item);
    if (!text.empty() && text.back() == sep) out.emplace_back();
    return out;
}

}  // namespace

bool under_systemd() {
    const char* env = std::getenv("NOTIFY_SOCKET");
    return env && *env;
}

bool notify(const std::string& text, const std::vector<int>& fds) {
    sockaddr_un addr{};
    socklen_t len = 0;
    if (!notify_address(addr, len)) return false;
    const int sock = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        log::warning("systemd: socket: {}", std::strerror(errno));
        return false;
    }
    const bool sent =
        send_with_fds(sock, text, fds, reinterpret_cast<const sockaddr*>(&addr), len) >= 0;
    if (!sent) {
        log::warning("systemd: cannot notify {} ({}): {}", std::getenv("NOTIFY_SOCKET"), text,
                     std::strerror(errno));
    }
    ::close(sock);
    return sent;
}

bool store(const char* name, int fd) {
    return notify(fmt::format("FDSTORE=1\nFDNAME={}", name), {fd});
}

void empty(const std::vector<std::string>& extra) {
    if (!under_systemd()) return;
    std::vector<std::string> names{kFuseName, kStateName, kLockName};
    for (const auto& e : extra)
        if (std::find(names.begin(), names.end(), e) == names.end()) names.push_back(e);
    for (const auto& name : names) notify(fmt::format("FDSTOREREMOVE=1\nFDNAME={}", name));
}

core::Result<std::optional<Files>> adopt(const std::string& mountpoint, const std::string& db,
                                         bool read_only) {
    const char* pid_env = std::getenv("LISTEN_PID");
    const char* fds_env = std::getenv("LISTEN_FDS");
    const std::string pid_text = pid_env ? pid_env : "";
    const std::string count_text = fds_env ? fds_env : "";
    const char* names_env = std::getenv("LISTEN_FDNAMES");
    const std::string names_text = names_env ? names_env : "";
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    char* end = nullptr;
    const long pid = std::strtol(pid_text.c_str(), &end, 10);
    if (pid_text.empty() || *end != '\0' || pid != static_cast<long>(getpid())) return std::nullopt;
    const long count = std::strtol(count_text.c_str(), &end, 10);
    if (count_text.empty() || *end != '\0' || count < 0 || count > 64) {
        empty();
        return core::fail(EINVAL, fmt::format("systemd's fd store: LISTEN_FDS={} is not a count "
                                              "of files: emptied the store",
                                              count_text));
    }
    if (count == 0) return std::nullopt;

    std::vector<std::string> names = split(names_text, ':');
    names.resize(static_cast<std::size_t>(count), "unknown");  // unnamed, as systemd says
    Files files;
    std::string why;  // the first refusal
    for (int i = 0; i < static_cast<int>(count); ++i) {
        const int fd = kListenFdsStart + i;
        ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        const std::string& name = names[static_cast<std::size_t>(i)];
        int* slot = name == kFuseName    ? &files.fuse
                    : name == kStateName ? &files.state
                    : name == kLockName  ? &files.lock
                                         : nullptr;
        std::string wrong;
        if (!slot)
            wrong = "a name kcache-fsd does not store";
        else if (*slot >= 0)
            wrong = "stored twice";
        else if (name == kLockName && read_only)
            wrong = "a --read-only mount takes no lock";
        if (slot && *slot < 0) *slot = fd;
        if (wrong.empty() && slot == &files.fuse) wrong = check_fuse(fd, mountpoint, db);
        if (wrong.empty() && slot == &files.state) wrong = check_state(fd);
        if (wrong.empty() && slot == &files.lock) wrong = check_lock(fd, db);
        if (!wrong.empty() && why.empty()) why = fmt::format("fd {} ({}): {}", fd, name, wrong);
    }
    if (why.empty() && files.fuse < 0) why = fmt::format("no {} among the files passed", kFuseName);
    if (why.empty() && files.state < 0)
        why = fmt::format("no {} among the files passed", kStateName);
    if (why.empty() && files.lock < 0 && !read_only)
        why = fmt::format("no {} among the files passed", kLockName);
    if (why.empty()) return std::optional<Files>(files);

    for (int i = 0; i < static_cast<int>(count); ++i) ::close(kListenFdsStart + i);
    empty(names);
    return core::fail(EINVAL, fmt::format("systemd's fd store: {}: emptied the store (the next "
                                          "start mounts afresh)",
                                          why));
}

}  // namespace kcache::fsd::fd_store
