// Single flight on one node (kcache-fsd -o single_flight_ms=N; docs/operations.md,
// "Compile storms"): while one compile fills an entry, another compile's lookup of a
// name the entry lacks yet waits, bounded, until the name appears or the filler is
// done, instead of missing and compiling the same kernel again.
//
// Where the wait happens, and why there. The kernel sends the LOOKUP of a missing name
// E/x holding E's directory lock (shared; exclusive for a create): waiting in it would
// hold the lock that the filler's rename of x into E needs, so the filler would stall
// behind the waiter until the bound. So that LOOKUP is answered ESTALE at once. The
// kernel then retries the whole path walk once with LOOKUP_REVAL (every path syscall
// does, as for NFS), which revalidates each directory on the path with a LOOKUP of its
// own, sent with no directory lock held: the LOOKUP of E itself in its parent, by the
// same thread. *That* LOOKUP waits here, until x exists, no other compile is at work in
// the entry any more (its renames after its closes happen meanwhile), the bound passes,
// or the request is interrupted (answered EINTR at once). The retried LOOKUP of E/x
// that follows is answered as it stands, never ESTALE again. A lookup outside entries,
// of an entry in its parent, of a bookkeeping name (locks, temporary files) or in a
// bookkeeping directory, and every lookup of the filler's own compile, never waits.
//
// Who waits: a process (the thread's thread group) whose compile (same_compile: itself,
// an ancestor or descendant) is not at work in the entry, while another process is: it
// holds a handle open for writing a file of the entry (its temporary files included),
// or it made something in the entry (create, symlink, mknod, a rename into it; not a
// directory: mkdir -p by several processes is no compile) or closed
// such a handle within kGrace, and it is still alive.
//
// Limit: the kernel retries ESTALE for lookups, opens (O_CREAT too), renames, unlinks,
// stat and access, but not for the lookup that mkdir, symlink and mknod make of their
// new name: those, by a process not of the filler's compile, of a name that is not
// bookkeeping, inside an entry another compile is filling at that moment, fail with
// ESTALE. Compilers make no such names (their temporary files and directories are
// bookkeeping names, which never wait).
//
// Contract:
//  - writer_opened / writer_closed / created: called by handlers, never block (a leaf
//    lock), never fail. Every writer_opened is matched by one writer_closed.
//  - retry_first(): the decision for a missing name (step 1): true when the caller
//    must answer ESTALE; it records what the thread's retry will wait for.
//  - retried(): the retried lookup of that name (step 3): answered as it stands.
//  - retrying(): the revalidation of that name's directory by the same thread (step
//    2): what to wait for.
//  - wait(): true when the request was taken: `answer` then runs exactly once, on the
//    flight thread (or on the wait()'s caller when stop() came first). False (nothing
//    runs): disabled, not started, stopped, or kMaxWaiters waiting already.
//  - filled_by_other() reads /proc (same_compile) outside the lock.
// Threads: one flight thread (start() to stop()), which polls its waiters every kPoll
// (reading the db) and is woken by every change. Locks (lock_order.hpp): m_mutex,
// level 8, a leaf; no callback runs under it, and fuse_req_interrupt_func is called
// without it (it may call on_interrupt at once, which takes it).
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class SingleFlight {
  public:
    using Clock = std::chrono::steady_clock;
    enum class End {
        settled,      // the name appeared, or no other compile is at work in the entry
        timed_out,    // the bound passed
        interrupted,  // the kernel interrupted the request: answer EINTR
        stopped,      // the daemon is stopping
    };
    // What a thread's retried walk waits for: `name` in directory `dir` of `entry`.
    struct Awaited {
        core::Ino dir = 0;
        std::string name;
        core::Ino entry = 0;
        std::uint32_t asker = 0;  // the thread's process
    };
    // A filler whose last handle closed (or that last made something) this recently is
    // still at work: its rename of the file it closed comes next.
    static constexpr auto kGrace = std::chrono::milliseconds(250);
    static constexpr auto kPoll = std::chrono::milliseconds(20);
    // A thread answered ESTALE retries at once: its record lasts this long unused.
    static constexpr auto kRetryWindow = std::chrono::seconds(2);
    static constexpr std::size_t kMaxWaiters = 4096;
    static constexpr std::size_t kMaxRetries = 4096;      // threads between steps 1 and 3
    static constexpr std::size_t kMaxEntries = 1u << 16;  // entries with fillers remembered

    // `bound` 0 disables it: nothing is recorded and nothing waits.
    SingleFlight(core::Store& store, std::chrono::milliseconds bound)
        : m_store(store), m_bound(bound) {}
    ~SingleFlight() { stop(); }
    SingleFlight(const SingleFlight&) = delete;
    SingleFlight& operator=(const SingleFlight&) = delete;

    bool enabled() const { return m_bound.count() > 0; }
    void start();
    // Answers every waiter (End::stopped) and ends the thread. Idempotent.
    void stop();

    // ---- activity of fillers (handlers; `entry` 0 is ignored) ----
    void writer_opened(core::Ino entry, std::uint32_t process);
    void writer_closed(core::Ino entry, std::uint32_t process);
    void created(core::Ino entry, std::uint32_t process);

    // Some process is at work in `entry` (cheap: no /proc).
    bool active(core::Ino entry);
    // A process at work in `entry` that is not of `asker`'s compile, and none that is.
    bool filled_by_other(core::Ino entry, std::uint32_t asker);

    // Step 1: a LOOKUP by thread `tid` of `name`, missing in `dir` of `entry`. True:
    // answer ESTALE (another compile fills the entry); the retry is expected.
    bool retry_first(pid_t tid, const Awaited& awaited);
    // Step 3: true (and forgotten) when this LOOKUP is the retry of thread `tid`'s.
    bool retried(pid_t tid, core::Ino dir, std::string_view name);
    // Step 2: a LOOKUP by `tid` that found directory `ino`: what to wait for when it is
    // the directory of the name the thread was answered ESTALE for.
    std::optional<Awaited> retrying(pid_t tid, core::Ino ino);

    // Defers the answer to `req` until `awaited.name` exists in `awaited.dir`, or the
    // entry has no other compile at work, or the bound.
    bool wait(fuse_req_t req, Awaited awaited, std::function<void(End)> answer);

  private:
    struct Filler {
        std::uint32_t writers = 0;  // handles open for writing a file of the entry
        Clock::time_point last{};   // its last make, or close of its last handle
    };
    struct Retry {
        Awaited awaited;
        bool waited = false;  // step 2 came
        Clock::time_point expires{};
    };
    struct Waiter {
        fuse_req_t req = nullptr;
        Awaited awaited;
        Clock::time_point deadline{};
        bool registered = false;  // its interrupt function is set: the thread may answer it
        bool interrupted = false;
        std::function<void(End)> answer;
    };
    static void on_interrupt(fuse_req_t req, void* data);
    void run();
    bool at_work(const Filler& f, Clock::time_point now) const {
        return f.writers > 0 || now - f.last < kGrace;
    }
    void prune_locked(Clock::time_point now) REQUIRES(m_mutex);

    core::Store& m_store;
    const std::chrono::milliseconds m_bound;
    Mutex m_mutex KCACHE_LEVEL(8);  // a leaf
    CondVar m_wake;
    bool m_started GUARDED_BY(m_mutex) = false;
    bool m_stop GUARDED_BY(m_mutex) = false;
    std::unordered_map<core::Ino, std::unordered_map<std::uint32_t, Filler>> m_fillers
        GUARDED_BY(m_mutex);
    std::unordered_map<pid_t, Retry> m_retries GUARDED_BY(m_mutex);  // by thread
    std::uint64_t m_next_id GUARDED_BY(m_mutex) = 0;
    std::unordered_map<std::uint64_t, Waiter> m_waiters GUARDED_BY(m_mutex);
    // Interrupts find their waiter.
    std::unordered_map<fuse_req_t, std::uint64_t> m_by_req GUARDED_BY(m_mutex);
    std::thread m_thread;
};

}  // namespace kcache::fsd
