// Taking a mount over from a daemon that died (or handed over for an upgrade): the
// FUSE side (keeper.hpp runs the daemons; state.hpp holds what they share).
//
// libfuse 3.14 has no API to resume a negotiated session: a fuse_session answers
// every request with EIO until it has processed an INIT. So every daemon's custom io
// (this file's own, or UringTransport's with --io-uring, which call these hooks)
// records the kernel's INIT request in the state memfd just before its reply is written
// (read, record_init); a daemon that starts on an inherited state with an INIT
// recorded replays it (begin): the first read of the session loop returns the saved
// request instead of reading /dev/fuse (read), libfuse processes it as it
// would the kernel's (Filesystem::init runs, the connection's limits are set), and its
// reply is swallowed (swallow_reply): the kernel had the first daemon's. Then the
// daemon writes FUSE_NOTIFY_RESEND (Linux 6.9+): the kernel puts every request the dead
// daemon had read and not answered back in its queue, with bit 63 of `unique` set, and
// they are served as new ones; their replies carry that unique back, which is how the
// kernel matches them. Until the replay is done the loop's other readers wait (a
// request read before INIT would be answered EIO by libfuse).
//
// A daemon that died before its INIT reply was written leaves no INIT: the next one
// sends FUSE_NOTIFY_RESEND at once, and the kernel's INIT comes back resent. One that
// died between recording it and the write: the INIT is replayed and also resent; the
// resent one is answered with the replay's reply (libfuse would answer it EIO).
//
// Thread safety: the hooks are called from every loop thread; one session per process.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <optional>

#include "state.hpp"

namespace kcache::fsd::takeover {

inline constexpr int kNotifyResend = 7;  // FUSE_NOTIFY_RESEND (protocol 7.40)
inline constexpr std::uint64_t kResendBit = std::uint64_t{1} << 63;  // FUSE_UNIQUE_RESEND

// Before the session loop: where INIT is recorded, and whether to resume (the state
// was inherited). Logs what the takeover does.
void begin(StateFile& state, int fuse_fd);
// Whether this daemon took a mount over (begin on an inherited state).
bool resuming();

// The hooks' parts.
// Reads the next request: the replayed INIT first, then /dev/fuse (waiting while
// another thread replays; answering a resent INIT itself). Notes the request's unique
// (resend.hpp) and records the kernel's INIT until its reply.
ssize_t read(int fd, void* buf, size_t len);
// Before writing a reply: the size "written" for the replayed INIT's reply (which is
// kept, then the resend is requested), or nullopt to write.
std::optional<ssize_t> swallow_reply(const iovec* iov, int count);
// Before writing a reply (not swallowed): the INIT reply records the INIT for a
// successor. Before, not after: a daemon killed right after its write leaves it too.
void record_init(const iovec* iov, int count);

// Installs a custom io that does only the above (the daemon without --io-uring).
// False (logged) if libfuse refuses it: then no successor can take the mount over.
bool install_plain(fuse_session* session);

}  // namespace kcache::fsd::takeover
