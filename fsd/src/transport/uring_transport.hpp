// FUSE over io_uring (kcache-fsd --io-uring): requests served from per-CPU rings
// instead of read(2)/writev(2) on /dev/fuse.
//
// How it fits libfuse 3.14, which knows nothing of it: the daemon mounts and runs
// fuse_session_loop_mt on /dev/fuse as always; install() puts a custom io under the
// session (fuse_session_custom_io). Its read hook sees the kernel's INIT request (does
// the kernel offer FUSE_OVER_IO_URING?); its writev hook sees every reply:
// - the INIT reply: when offered, the ring threads are made (rings, buffers) and
//   FUSE_OVER_IO_URING is added to the reply; once the kernel has it, the threads
//   register their entries, and when every possible CPU's queue has one the kernel
//   sends requests to the rings (FORGET and INTERRUPT still come on /dev/fuse, and so
//   does anything before that);
// - a reply to a ring request goes into its entry (out header, payload) and is
//   committed with FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which also fetches the next;
// - everything else (notifications, replies to /dev/fuse requests) is written to
//   /dev/fuse.
// When the kernel does not offer it (module parameter enable_uring off, a kernel
// without it) or a ring cannot be set up, one log line says so and the daemon serves
// /dev/fuse alone.
//
// Threads: kThreadsPerQueue per possible CPU (queue), each with its own io_uring,
// pinned to its queue's CPU where it may run there. A thread waits on its ring and
// processes each request inline (fuse_session_process_buf): no hand-off, no extra
// wake-up. It starts with one entry; while all of its entries hold requests whose
// replies were deferred (an OPEN answered by the background thread or the writer
// gate, a lookup answered by the shared tier), it registers another (at most
// kMaxEntriesPerThread), so deferred replies never leave a queue without an entry.
// One entry per thread otherwise, because the kernel hands a request to any free
// entry of the CPU's queue: a second entry on a busy thread would wait behind the
// request that thread is handling while another thread sits idle. Several threads per
// queue so that a handler that blocks (the LMDB writer lock, a version's end) does
// not stall its CPU's other requests.
// A successor redoes each request its predecessor's entries held on a thread of its
// own (Ring::redo, joined by stop()): such requests come in a burst, and one may wait
// for another held in the same ring (a writer's open for the RELEASE of the version
// before it) while the ring's thread must go on serving.
// The extra entries are needed: with one entry per thread and no more, the soak
// deadlocked (a queue's entries all held by deferred replies that wait, through a
// notification blocked on a directory lock, for a request queued behind them). Known
// risk left: once a deferred reply is committed its thread has two free entries, and
// the kernel may give a request to the one of a thread busy in a handler, which
// delays it until the handler returns (and would deadlock if that handler waited
// for that very request). The fix: commit a deferred entry on a thread that has no
// free entry (an entry belongs to the ring its command was last submitted on), so
// that every thread keeps exactly one free entry.
//
// Locks: a thread alone submits to its ring. A reply written on the ring's thread
// (during fuse_session_process_buf) is committed at once, inside fuse_reply_*, as a
// write to /dev/fuse would be. A reply from another thread (deferred) claims its
// entry (an atomic on the entry), fills it, and hands it to the ring's thread under
// that thread's hand-off mutex, waking it with an eventfd the ring always has a read
// armed on; the thread commits it as soon as it is not running a handler. The
// hand-off mutex is a leaf.
//
// Owns: the ring threads, their rings and eventfds, the entries' buffers (mmap), the
// custom io. Lifetime: install() after fuse_session_mount; stop() after the session
// loop has returned (joins the threads; later replies are refused with ENOTCONN);
// destroy after the last reply can come (after Filesystem::stop) and before
// fuse_session_destroy.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kcache::fsd {

class Resend;
class Takeover;

class UringTransport {
  public:
    static constexpr int kThreadsPerQueue = 2;
    static constexpr int kMaxEntriesPerThread = 32;

    // Installs the custom io on a mounted session; one per process. Its hooks are
    // `takeover`'s (takeover.hpp), and each ring thread notes the request it hands to
    // libfuse in `resend` (Resend::note); both outlive the transport. `state_fd`: the
    // keeper's state memfd, where the entries' buffers are kept for a successor
    // (uring_area.hpp; -1: private memory); `mountpoint`: where a ring asks for a
    // request on its queue whenever it registers an entry (Ring::register_entry:
    // requests queued while no entry was free are fetched only by a commit). Returns nullptr (after
    // logging why) if the session refuses it: then /dev/fuse serves alone.
    static std::unique_ptr<UringTransport> install(fuse_session* session, Takeover& takeover,
                                                   const Resend& resend, int state_fd,
                                                   std::string mountpoint);
    ~UringTransport();
    UringTransport(const UringTransport&) = delete;
    UringTransport& operator=(const UringTransport&) = delete;

    // Ends the ring threads (after the session loop has returned) and logs how many
    // requests the rings served. Idempotent.
    void stop();
    // An upgrade's stop (after the session loop has returned, before the keeper is told
    // "handed over"): the rings stop serving and keep what comes in their entries for
    // the successor, until no entry of theirs waits in the kernel for a request (the
    // mount's own statfs from each queue's CPU fills the idle ones; each waits for the
    // successor's answer); then stop(). Why: the kernel ends with ECANCELED a request it
    // hands to an entry whose thread is exiting (uring_area.hpp), so no thread may exit
    // with an entry waiting. Bounded (2 s: a queue whose CPU this daemon may not run on
    // cannot be filled): then stop() as it stands, logged.
    void hand_over();
    // Requests the rings have served so far (0: /dev/fuse served everything).
    std::uint64_t served() const;

    struct Ring;  // one thread's ring (uring_transport.cpp)

  private:
    UringTransport(fuse_session* session, Takeover& takeover, const Resend& resend, int state_fd,
                   std::string mountpoint);
    friend struct UringHooks;

    fuse_session* m_session;
    Takeover& m_takeover;
    const Resend& m_resend;
    int m_fd;
    int m_state_fd;
    std::string m_mountpoint;
    std::vector<std::unique_ptr<Ring>> m_rings;
    std::atomic<bool> m_serving{false};  // the rings were made and registered
    bool m_stopped = false;
};

}  // namespace kcache::fsd
