// kcache-fsd: mounts a kcache db as a directory.
//
// Processes: kcache-fsd forks first (unless -f) and the parent waits for "ready" (exit
// 0) or the error (exit 1). The process that stays is the keeper (keeper.hpp): it
// mounts and runs the serving daemon, this binary again with $KCACHE_FSD_SERVE set,
// which opens the db and serves the mount the keeper holds; a daemon that starts on a
// state a dead one left takes the mount over (takeover.hpp). An LMDB environment must
// not cross a fork(): only the serving daemon opens the db. What can be wrong with the
// mountpoint is reported before anything is mounted; what is wrong with the db, by
// the first daemon, after which the keeper unmounts. Under systemd a keeper restarted
// with its predecessor's files (fd_store.hpp) serves that mount instead of mounting.
// --no-keeper: one process opens the db, mounts and serves (a crash then ends the
// mount).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "fd_store.hpp"
#include "keeper.hpp"
#include "options.hpp"
#include "serve.hpp"
#include "startup.hpp"

namespace fsd = kcache::fsd;
using fsd::StartupPipe;

// kcache-fsd --upgrade MOUNTPOINT: SIGHUP to the mount's keeper, which replaces its
// daemon with the binary on disk; returns once another daemon serves (exit 0).
int upgrade(const std::string& path) {
    std::error_code ec;
    const std::string mountpoint = std::filesystem::absolute(path, ec).lexically_normal().string();
    std::ifstream mounts("/proc/self/mountinfo");
    std::string line, db;
    while (std::getline(mounts, line)) {
        std::istringstream fields(line);
        std::string id, parent, dev, root, point;
        fields >> id >> parent >> dev >> root >> point;
        const auto dash = line.find(" - ");
        if (point != mountpoint || dash == std::string::npos) continue;
        std::istringstream rest(line.substr(dash + 3));
        std::string type, source;
        rest >> type >> source;
        if (source.rfind("kcache:", 0) == 0) db = source.substr(7);
    }
    if (db.empty()) {
        std::fprintf(stderr, "kcache-fsd: %s is not a kcache-fsd mount\n", mountpoint.c_str());
        return 1;
    }
    auto daemon_pid = [&]() -> pid_t {
        std::ifstream lock(db + "/daemon.lock");
        std::string word;
        pid_t pid = -1;
        if (lock >> word >> pid && word == "pid") return pid;
        return -1;
    };
    const pid_t daemon = daemon_pid();
    pid_t keeper = -1;
    if (daemon > 0) {
        std::ifstream stat("/proc/" + std::to_string(daemon) + "/stat");
        std::string text;
        std::getline(stat, text);
        const auto close = text.rfind(')');
        std::istringstream rest(close == std::string::npos ? "" : text.substr(close + 1));
        std::string state;
        rest >> state >> keeper;
    }
    if (keeper <= 1 || kill(keeper, SIGHUP) != 0) {
        std::fprintf(stderr, "kcache-fsd: no keeper serves %s (is it run with --no-keeper?)\n",
                     mountpoint.c_str());
        return 1;
    }
    for (int i = 0; i < 600; ++i) {
        usleep(100 * 1000);
        const pid_t now = daemon_pid();
        if (now > 0 && now != daemon) {
            std::printf("kcache-fsd: %s: daemon %d replaced by %d\n", mountpoint.c_str(),
                        static_cast<int>(daemon), static_cast<int>(now));
            return 0;
        }
    }
    std::fprintf(stderr,
                 "kcache-fsd: %s: daemon %d was not replaced within 60 s (see %s/fsd.log)\n",
                 mountpoint.c_str(), static_cast<int>(daemon), db.c_str());
    return 1;
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--upgrade") return upgrade(argv[2]);
    auto options = fsd::parse_options(argc, argv);
    if (!options) {
        std::fprintf(stderr, "kcache-fsd: %s\n", options.error().message.c_str());
        return 2;
    }
    if (!options->help.empty()) {
        std::fputs(options->help.c_str(), stdout);
        return 0;
    }
    const std::string& mountpoint = options->mountpoint;  // absolute (parse_options)
    StartupPipe startup;
    // A daemon the keeper started: it serves the keeper's mount.
    if (const auto inherited = fsd::keeper::inherited()) {
        startup.report_to(inherited->ready_fd, !options->foreground);
        return fsd::serve(*options, mountpoint, startup, inherited);
    }
    // Restarted by systemd with the files of a keeper that died (fd_store.hpp): its mount
    // is live and nobody serves it yet, so the mountpoint is not looked at (a stat would
    // wait for a daemon); the files are checked instead.
    const auto adopted = fsd::fd_store::adopt(mountpoint, options->db, options->read_only);
    if (!adopted) startup.fail_startup(adopted.error().message);
    if (*adopted && options->no_keeper) {
        for (int fd : {(*adopted)->fuse, (*adopted)->state, (*adopted)->lock})
            if (fd >= 0) close(fd);
        fsd::fd_store::empty();
        startup.fail_startup(
            "systemd passed a keeper's files (its fd store), but --no-keeper runs no keeper: "
            "emptied the store");
    }
    if (!*adopted) {
        if (auto s = fsd::check_mountpoint(mountpoint); !s) startup.fail_startup(s.error().message);
    }
    if (!options->foreground) startup.fork_daemon();
    if (options->no_keeper) return fsd::serve(*options, mountpoint, startup, std::nullopt);
    const std::string log_path = options->db + "/fsd.log";
    fsd::keeper::Startup report{[&](const std::string& message) { startup.fail_startup(message); },
                                [&] { startup.ready(log_path); }};
    return fsd::keeper::run(mountpoint, fsd::fuse_arguments(*options), argv, report, *adopted);
}
