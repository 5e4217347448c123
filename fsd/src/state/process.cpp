#include "process.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "lock_order.hpp"

namespace kcache::fsd {

namespace {

// The whole of a small /proc file in one read (ifstream costs more than the read).
std::string read_proc(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    char buf[1024];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// /proc/<id>/stat split into fields, f[n - 1] being field n of proc(5): f[1] the
// command name (it may hold spaces and ')'), f[3] the parent, f[21] the start time.
std::vector<std::string> stat_fields(std::uint32_t id) {
    const std::string line = read_proc("/proc/" + std::to_string(id) + "/stat");
    const auto open = line.find('(');
    const auto close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open) return {};
    std::vector<std::string> f{line.substr(0, open - 1), line.substr(open + 1, close - open - 1)};
    std::istringstream rest(line.substr(close + 1));
    for (std::string field; rest >> field;) f.push_back(field);
    return f;
}

// The process behind a thread, cached: thread ids are reused only after the thread
// is gone, and a reused id has another start time (field 22 of /proc/<tid>/stat),
// so one read of that short file validates an entry instead of reading
// /proc/<tid>/status and /proc/<pid>/comm on every request.
struct Known {
    std::string start_time;
    Caller caller;
};
Mutex g_known_mutex KCACHE_LEVEL(8);  // a leaf
std::unordered_map<pid_t, Known> g_known GUARDED_BY(g_known_mutex);
constexpr std::size_t kMaxKnown = 1 << 14;

std::uint32_t tgid_from_status(pid_t tid) {
    const std::string status = read_proc("/proc/" + std::to_string(tid) + "/status");
    const auto at = status.find("\nTgid:");
    if (at == std::string::npos) return 0;
    return static_cast<std::uint32_t>(std::strtoul(status.c_str() + at + 6, nullptr, 10));
}

}  // namespace

mode_t umask_of(pid_t tid, mode_t fallback) {
    const std::string status = read_proc("/proc/" + std::to_string(tid) + "/status");
    const auto at = status.find("\nUmask:");
    if (at == std::string::npos) return fallback;
    char* end = nullptr;
    const unsigned long mask = std::strtoul(status.c_str() + at + 7, &end, 8);
    if (end == status.c_str() + at + 7 || mask > 0777) return fallback;
    return static_cast<mode_t>(mask);
}

Caller caller_of(pid_t tid) {
    const auto fields = stat_fields(static_cast<std::uint32_t>(tid));
    if (fields.size() <= 22) return Caller{static_cast<std::uint32_t>(tid), {}};  // gone already
    const std::string& start_time = fields[21];
    {
        MutexLock lock(g_known_mutex);
        if (auto it = g_known.find(tid);
            it != g_known.end() && it->second.start_time == start_time) {
            return it->second.caller;
        }
    }
    Caller caller;
    caller.pid = tgid_from_status(tid);
    if (caller.pid == 0) return Caller{static_cast<std::uint32_t>(tid), {}};
    // The process's name (its main thread's): a worker thread may have named itself.
    const auto process =
        caller.pid == static_cast<std::uint32_t>(tid) ? fields : stat_fields(caller.pid);
    if (process.size() > 1) caller.name = process[1];
    MutexLock lock(g_known_mutex);
    if (g_known.size() >= kMaxKnown) g_known.clear();  // bounded: re-read after this
    g_known[tid] = Known{start_time, caller};
    return caller;
}

std::uint32_t process_of(pid_t tid) {
    return caller_of(tid).pid;
}

namespace {

// The parent of `pid`, 0 when /proc cannot tell.
std::uint32_t parent_of(std::uint32_t pid) {
    const auto fields = stat_fields(pid);
    if (fields.size() <= 3) return 0;
    return static_cast<std::uint32_t>(std::strtoul(fields[3].c_str(), nullptr, 10));
}

bool is_ancestor(std::uint32_t ancestor, std::uint32_t pid) {
    for (int hops = 0; pid > 1 && hops < 64; ++hops) {  // bounded: /proc may change under us
        pid = parent_of(pid);
        if (pid == ancestor) return true;
    }
    return false;
}

}  // namespace

bool same_compile(std::uint32_t a, std::uint32_t b) {
    if (a == 0 || b == 0) return false;
    return a == b || is_ancestor(a, b) || is_ancestor(b, a);
}

bool killed_by_signal(pid_t tid) {
    const auto f = stat_fields(static_cast<std::uint32_t>(tid));
    if (f.size() <= 51) return false;  // gone, or a kernel before 3.5 (no exit_code)
    constexpr unsigned long kPfExiting = 0x4;
    const unsigned long flags = std::strtoul(f[8].c_str(), nullptr, 10);  // field 9
    const long exit_code = std::strtol(f[51].c_str(), nullptr, 10);       // field 52
    return (flags & kPfExiting) && (exit_code & 0x7f) != 0;
}

}  // namespace kcache::fsd
