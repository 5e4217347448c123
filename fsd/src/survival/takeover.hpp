// Taking a mount over from a daemon that died (or handed over for an upgrade): the
// FUSE side (keeper.hpp runs the daemons; state.hpp holds what they share).
//
// libfuse 3.14 has no API to resume a negotiated session: a fuse_session answers
// every request with EIO until it has processed an INIT. So every daemon's custom io
// (this file's own, or UringTransport's with --io-uring, which call these hooks)
// records the kernel's INIT request in the state memfd just before its reply is written
// (read, record_init); a daemon that starts on an inherited state with an INIT
// recorded replays it (once made): the first read of the session loop returns the saved
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
// Who does what: the daemon owns one Takeover for its session (serve.cpp makes it before
// the loop, with the session's /dev/fuse; it lives until the session is destroyed) and
// hands it to the custom io that calls its hooks: this file's own (install_plain) or
// UringTransport's. read notes each request's unique for resend.hpp (Resend::note).
//
// Thread safety: the hooks are called from every loop thread (and the ring threads);
// the replay's phase is an atomic, its waiters and the pending INIT are under leaf
// mutexes. One session per process: the plain custom io's hooks get no pointer of ours
// from libfuse (their userdata is the session's, the Filesystem), so install_plain keeps
// the one static pointer to its Takeover (takeover.cpp).
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "lock_order.hpp"
#include "resend.hpp"
#include "state.hpp"

struct fuse_in_header;  // <linux/fuse.h>

namespace kcache::fsd {

namespace takeover {
inline constexpr int kNotifyResend = 7;  // FUSE_NOTIFY_RESEND (protocol 7.40)
using resend::kResendBit;                // FUSE_UNIQUE_RESEND
}  // namespace takeover

class Takeover {
  public:
    // Before the session loop: where INIT is recorded (`state`), the session's
    // /dev/fuse, where each request's unique is noted (`resend`), and whether to resume
    // (the state was inherited). Logs what the takeover does.
    Takeover(StateFile& state, int fuse_fd, const Resend& resend);
    ~Takeover();
    Takeover(const Takeover&) = delete;
    Takeover& operator=(const Takeover&) = delete;

    // Whether this daemon took a mount over (an inherited state).
    bool resuming() const;

    // The hooks' parts.
    // Reads the next request: the replayed INIT first, then /dev/fuse (waiting while
    // another thread replays; answering a resent INIT itself). Notes the request's unique
    // (Resend::note) and records the kernel's INIT until its reply.
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

  private:
    // Phases of a resume: none (a first daemon, or no INIT to replay), pending (the
    // next read returns the INIT), replaying (a loop thread is processing it; other
    // readers wait), done.
    enum class Phase { none, pending, replaying, done };

    void request_resend();
    void finish_replay();
    std::optional<ssize_t> read_replayed(void* buf, size_t len);
    bool answer_resent_init(int fd, const fuse_in_header& in);

    StateFile& m_state;
    const int m_fd;
    const Resend& m_resend;
    std::atomic<Phase> m_phase{Phase::none};
    std::uint64_t m_replay_unique = 0;         // written before m_phase leaves none
    std::vector<std::uint8_t> m_replay_reply;  // libfuse's reply to the replayed INIT (swallowed)
    Mutex m_mutex KCACHE_LEVEL(8);             // with m_done: readers wait for the replay (a leaf)
    CondVar m_done;

    // The kernel's INIT request, read and not yet answered (a first daemon).
    Mutex m_pending_mutex KCACHE_LEVEL(8);                           // a leaf
    std::uint64_t m_pending_unique GUARDED_BY(m_pending_mutex) = 0;  // 0: none
    std::uint32_t m_pending_size GUARDED_BY(m_pending_mutex) = 0;
    std::uint8_t m_pending[kMaxInitBytes] GUARDED_BY(m_pending_mutex);
};

}  // namespace kcache::fsd
