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

// What `pid`'s threads are doing, for a failure message: a line per thread (tid, name,
// state) followed by its kernel stack (/proc/PID/task/TID/stack: root only; empty
// otherwise). "" when the process is gone.
inline std::string describe_threads(pid_t pid) {
    const std::string base = "/proc/" + std::to_string(pid) + "/task";
    DIR* tasks = ::opendir(base.c_str());
    if (!tasks) return "";
    std::string out;
    while (const dirent* e = ::readdir(tasks)) {
        if (std::atoi(e->d_name) <= 0) continue;
        const std::string dir = base + "/" + e->d_name;
        std::ifstream stat_in(dir + "/stat");
        std::string stat;
        std::getline(stat_in, stat);
        const auto open = stat.find('('), close = stat.rfind(')');
        if (open == std::string::npos || close == std::string::npos || close + 2 >= stat.size())
            continue;
        out += "  thread " + std::string(e->d_name) + " " + stat.substr(open, close - open + 1) +
               " " + stat[close + 2] + "\n";
        std::ifstream stack_in(dir + "/stack");
        for (std::string frame; std::getline(stack_in, frame);) out += "      " + frame + "\n";
    }
    ::closedir(tasks);
    return out;
}

}  // namespace kcache::test
