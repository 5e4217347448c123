// The keeper: kcache-fsd's small first process, which outlives its serving daemons.
//
// It mounts, holds the mount's /dev/fuse file (the FUSE connection lives while any
// process holds it open, so a daemon's death does not end the mount: the kernel queues
// requests meanwhile) and the state memfd (state.hpp), and runs the serving daemon as
// its child: this binary again (the path it was started from, so an upgrade on disk is
// what runs next), with the two files and a start-up pipe named in $KCACHE_FSD_SERVE.
// When the daemon dies for any reason but a clean stop, the keeper logs how (the
// signal, the exit status) and starts another at once, which takes the mount over
// (takeover.hpp); a crash loop is slowed, then ends the mount (kShortLife below). It does no LMDB
// work and handles no FUSE request.
//
// A daemon is taken for dead as soon as it is dying (its main thread exited): a thread
// of it may be stuck in the kernel until a request it leaves is answered (a
// notification waits for a directory lock the caller of that request holds), which
// only its successor can do. The db's lock file is held by the keeper too, so the
// successor is not kept out by it.
//
// Under systemd (fd_store.hpp) the keeper hands systemd copies of the /dev/fuse file,
// the state memfd and the db's lock before READY=1; a keeper that systemd restarts
// with them (`adopted`) mounts nothing: its first daemon takes the mount over as after
// a crash. The store is emptied before every unmount.
//
// Signals to the keeper: SIGTERM, SIGINT stop the daemon (which flushes) and unmount;
// SIGHUP replaces the daemon with the binary on disk (an upgrade: the daemon stops at
// a request boundary, takeover.hpp). The daemon dies with its keeper (PR_SET_PDEATHSIG):
// no daemon serves a mount that nobody would restart; starting kcache-fsd again on the
// dead mount recovers it (startup.cpp).
//
// Exit: 0 once the daemon stopped cleanly (an unmount, SIGTERM) and the mount is gone;
// 1 when the first daemon could not start (its message went to `fail`), when
// kQuickDeaths daemons in a row died before they were ready, or after kCrashLoopDeaths
// short-lived daemons in a row (below).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fd_store.hpp"
#include "options.hpp"

namespace kcache::fsd::keeper {

inline constexpr const char* kServeEnv = "KCACHE_FSD_SERVE";
inline constexpr int kQuickDeaths = 5;
// A crash loop: a daemon that dies within kShortLife of being ready is a short-lived
// one (a binary that crashes on its first request, a request that kills every daemon it
// is resent to). The first kFreeRestarts of a run of them are started again at once
// (a `kill -9` costs a pause, nothing more); later ones wait kFirstBackoff, doubling up
// to kMaxBackoff, and the kCrashLoopDeaths-th in a row ends the mount: compilers then
// see their plain cache directory instead of a mount that never answers. Without this,
// a broken binary on disk was restarted 140 times a second (a 64 MB log in 18 min).
inline constexpr std::chrono::milliseconds kShortLife{500};
inline constexpr int kFreeRestarts = 2;
inline constexpr std::chrono::milliseconds kFirstBackoff{100};
inline constexpr std::chrono::milliseconds kMaxBackoff{5000};
inline constexpr int kCrashLoopDeaths = 10;
// A daemon that exits with this status handed the mount over (an upgrade).
inline constexpr int kHandedOver = 75;

// What a serving daemon started by a keeper inherits (from $KCACHE_FSD_SERVE, which
// is then removed from the environment).
struct Inherited {
    int fuse_fd = -1;   // the mount's /dev/fuse file
    int state_fd = -1;  // the state memfd
    int ready_fd = -1;  // a unix socket: "ready" (with the db's lock file), or the error
    int lock_fd = -1;   // the db's daemon.lock, locked (-1 for the first daemon)
};
std::optional<Inherited> inherited();

struct Startup {
    std::function<void(const std::string&)> fail;  // the first daemon's error; does not return
    std::function<void()> ready;                   // the mount is served
};

// Runs the keeper for `mountpoint` (checked already), mounting with libfuse's
// `fuse_args` (or serving the mount of the `adopted` files, checked by
// fd_store::adopt) and starting daemons with `argv`. Returns the exit status.
int run(const std::string& mountpoint, const std::vector<std::string>& fuse_args, char** argv,
        const Startup& startup, const std::optional<fd_store::Files>& adopted = std::nullopt);

}  // namespace kcache::fsd::keeper
