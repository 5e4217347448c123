#include "process.hpp"

#include <fstream>
#include <string>

namespace kcache::fsd {

Caller caller_of(pid_t tid) {
    Caller caller;
    caller.pid = static_cast<std::uint32_t>(tid);
    std::ifstream status("/proc/" + std::to_string(tid) + "/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("Tgid:", 0) == 0) {
            caller.pid = static_cast<std::uint32_t>(std::stoul(line.substr(5)));
            break;
        }
    }
    std::ifstream comm("/proc/" + std::to_string(caller.pid) + "/comm");
    std::getline(comm, caller.name);
    return caller;
}

}  // namespace kcache::fsd
