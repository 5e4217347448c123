#include "process.hpp"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kcache::fsd {

std::uint32_t process_of(pid_t tid) {
    std::ifstream status("/proc/" + std::to_string(tid) + "/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("Tgid:", 0) == 0) return static_cast<std::uint32_t>(std::stoul(line.substr(5)));
    }
    return static_cast<std::uint32_t>(tid);
}

namespace {

// The parent of `pid`, 0 when /proc cannot tell.
std::uint32_t parent_of(std::uint32_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return 0;
    const auto close = line.rfind(')');  // the command name may hold spaces and ')'
    if (close == std::string::npos || close + 2 >= line.size()) return 0;
    std::istringstream fields(line.substr(close + 2));  // state, ppid, ...
    std::string state;
    unsigned long ppid = 0;
    if (!(fields >> state >> ppid)) return 0;
    return static_cast<std::uint32_t>(ppid);
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
    std::ifstream stat("/proc/" + std::to_string(tid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    const auto close = line.rfind(')');  // the command name may hold spaces and ')'
    if (close == std::string::npos) return false;
    std::istringstream fields(line.substr(close + 2));  // from field 3 (state) on
    std::vector<std::string> f{"", "", ""};             // fields 1 and 2 are before
    for (std::string field; fields >> field;) f.push_back(field);
    if (f.size() <= 52) return false;  // kernels before 3.5 do not report exit_code
    constexpr unsigned long kPfExiting = 0x4;
    const unsigned long flags = std::stoul(f[9]);
    const long exit_code = std::stol(f[52]);
    return (flags & kPfExiting) && (exit_code & 0x7f) != 0;
}

Caller caller_of(pid_t tid) {
    Caller caller;
    caller.pid = process_of(tid);
    std::ifstream comm("/proc/" + std::to_string(caller.pid) + "/comm");
    std::getline(comm, caller.name);
    return caller;
}

}  // namespace kcache::fsd
