// systemd's notification socket and file descriptor store, spoken by hand (the
// protocol of sd_notify(3) and sd_listen_fds(3); kcache does not link libsystemd).
//
// Under a unit with Type=notify and FileDescriptorStoreMax= (docs/operations.md) the
// keeper (keeper.hpp) hands systemd, before READY=1, copies of the three files a
// successor needs to take the mount over:
//   kcache-fuse   the mount's /dev/fuse file (the FUSE connection lives while any copy
//                 is open: systemd's copy keeps it alive when keeper and daemon die);
//   kcache-state  the state memfd (state.hpp: the INIT to replay, the handle table);
//   kcache-lock   the db's daemon.lock, locked (flock belongs to the open file, which
//                 systemd's copy shares: a daemon still dying cannot keep the next out).
// When the keeper dies, systemd's Restart= starts kcache-fsd again with those files
// (LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES); adopt() checks them, the keeper does not
// mount again and its first daemon takes over as after a crash (takeover.hpp). Before
// an unmount the keeper empties the store (FDSTOREREMOVE=1), so that systemd does not
// hand a dead connection to the next start.
//
// Thread safety: called from the keeper's one thread (and main before it).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kcache/core/error.hpp"

namespace kcache::fsd::fd_store {

inline constexpr const char* kFuseName = "kcache-fuse";
inline constexpr const char* kStateName = "kcache-state";
inline constexpr const char* kLockName = "kcache-lock";
// The name the keeper gives its state memfd (memfd_create), which adopt() checks.
inline constexpr const char* kStateMemfdName = "kcache-fsd-state";

// Whether a service manager listens ($NOTIFY_SOCKET is set).
bool under_systemd();

// Sends `text` (newline-separated assignments) to $NOTIFY_SOCKET with `fds` attached
// (SCM_RIGHTS). True when sent; false without a socket or when sending failed (logged).
bool notify(const std::string& text, const std::vector<int>& fds = {});

// FDSTORE=1 with FDNAME=`name`: systemd keeps a copy of `fd`. False when not sent.
bool store(const char* name, int fd);
// FDSTOREREMOVE=1 for every name this binary stores (and `extra`): systemd closes its
// copies. Nothing without a socket.
void empty(const std::vector<std::string>& extra = {});

// The files a keeper takes over (-1: none; `lock` is -1 for a --read-only mount,
// whose daemons take no lock). Close-on-exec.
struct Files {
    int fuse = -1;
    int state = -1;
    int lock = -1;
};

// The files systemd passed to this process (LISTEN_PID is ours), each checked:
// - kcache-fuse: /dev/fuse (char 10:229) with a live FUSE connection, and
//   /proc/self/mountinfo shows a kcache mount of `db` at `mountpoint` (read without
//   touching the mount: nobody serves it yet, a stat would wait for its daemon);
// - kcache-state: a memfd named as the keeper names it, of StateFile::kSize bytes, with
//   the state's magic, layout and slot count (a first daemon wrote them before the
//   keeper stored it);
// - kcache-lock: the file db/daemon.lock (same inode), which this file may lock (no
//   other open file holds it). Absent for a --read-only mount (`read_only`).
// nullopt when systemd passed nothing (a fresh start: mount). On anything else (a name
// unknown or twice, a file missing or failing its check) an error naming the fd, its
// name and the reason; the passed files are then closed and the store emptied, so the
// next start mounts afresh. LISTEN_* are removed from the environment in every case.
core::Result<std::optional<Files>> adopt(const std::string& mountpoint, const std::string& db,
                                         bool read_only);

}  // namespace kcache::fsd::fd_store
