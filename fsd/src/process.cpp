#include "process.hpp"

#include <fstream>
#include <string>

namespace kcache::fsd {

std::uint32_t process_of(pid_t tid) {
    std::ifstream status("/proc/" + std::to_string(tid) + "/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("Tgid:", 0) == 0) return static_cast<std::uint32_t>(std::stoul(line.substr(5)));
    }
    return static_cast<std::uint32_t>(tid);
}

Caller caller_of(pid_t tid) {
    Caller caller;
    caller.pid = process_of(tid);
    std::ifstream comm("/proc/" + std::to_string(caller.pid) + "/comm");
    std::getline(comm, caller.name);
    return caller;
}

}  // namespace kcache::fsd
