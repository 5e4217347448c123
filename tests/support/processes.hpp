// The processes of a test's own children, read from /proc (Linux).
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kcache::test {

// The processes whose parent is `pid` (/proc/PID/stat: the state, then the ppid, after
// the command name in parentheses). Zombies count unless `include_zombies` is false.
// Throws when /proc cannot be read, so a check of "no children" never passes vacuously.
inline std::vector<pid_t> children_of(pid_t pid, bool include_zombies = true) {
    DIR* proc = ::opendir("/proc");
    if (!proc) throw std::runtime_error("children_of: /proc cannot be read");
    std::vector<pid_t> out;
    while (const dirent* e = ::readdir(proc)) {
        const pid_t candidate = static_cast<pid_t>(std::atoi(e->d_name));
        if (candidate <= 0) continue;
        std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
        std::string stat;
        if (!std::getline(in, stat)) continue;
        const auto close = stat.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(stat.substr(close + 1));
        std::string state;
        pid_t ppid = 0;
        rest >> state >> ppid;
        if (ppid == pid && (include_zombies || state != "Z")) out.push_back(candidate);
    }
    ::closedir(proc);
    return out;
}

}  // namespace kcache::test
