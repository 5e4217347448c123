// The ring threads of kcache-fsd --io-uring (private to uring_transport.cpp and
// uring_ring.cpp): an Entry is one registered ring entry and its buffers; a Ring is one
// thread's io_uring with its entries. uring_transport.hpp says what they do, which
// thread owns what and which lock guards what; uring_ring.cpp is the thread's loop.
#pragma once

#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <sys/uio.h>

#include <csignal>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fuse_uring_abi.hpp"
#include "kernel_order.hpp"
#include "lock_order.hpp"
#include "uring_area.hpp"
#include "uring_transport.hpp"

namespace kcache::fsd {

struct Entry;

namespace uring_detail {

namespace abi = uring_abi;

constexpr std::uint64_t kEventTag = 1;  // user_data of the eventfd read (entries are pointers)
constexpr std::size_t kPage = 4096;
// An entry's memory (in the ring area, uring_area.hpp): the header page; the prefix page,
// which starts with what a reply overwrites of its request, saved (the fuse_in_header
// at kSavedInHeader, the head of the payload at kSavedPayload) and ends with the
// request's fuse_in_header and op header put back in front of its payload (libfuse
// wants /dev/fuse's layout: one contiguous buffer); then the payload.
constexpr std::size_t kHeaderArea = kPage;
constexpr std::size_t kPrefixArea = kPage;
constexpr std::size_t kSavedInHeader = 0;
constexpr std::size_t kSavedPayload = 64;
constexpr std::size_t kSaveCapacity = kPrefixArea - kSavedPayload - 40 - abi::kOpInOutSize;
constexpr std::uint32_t kNotSaved = ~std::uint32_t{0};
constexpr unsigned kRingDepth = 2 * UringTransport::kMaxEntriesPerThread + 8;

inline thread_local Entry* t_current = nullptr;  // the entry this ring thread is handling

// Runs the calling thread on `cpu` only; false where that CPU is offline or forbidden.
inline bool pin_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// A statfs of the mount from a thread of its own pinned to `cpu`, as a caller: the
// request goes to that CPU's queue (a statfs always reaches the daemon), and the thread
// ends once it is answered (by this daemon or, at an upgrade, its successor). Call it
// with every signal blocked (SignalsBlocked): the thread inherits the mask. False where
// no thread could be started (logged).
bool ask_from_cpu(const std::string& mountpoint, int cpu);

// While it lives, the calling thread blocks every signal, and so do the threads it
// starts: SIGTERM and the like must reach libfuse's loop (its handler ends the
// session), and an io_uring wait would swallow them.
class SignalsBlocked {
  public:
    SignalsBlocked() {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &m_old);
    }
    ~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &m_old, nullptr); }
    SignalsBlocked(const SignalsBlocked&) = delete;
    SignalsBlocked& operator=(const SignalsBlocked&) = delete;

  private:
    sigset_t m_old;
};

// The kernel's order between replies and requests, for ThreadSanitizer (kernel_order.hpp).
using kernel_order::replied_to_kernel;
using kernel_order::request_from_kernel;

}  // namespace uring_detail

struct Entry {
    UringTransport::Ring* ring = nullptr;
    char* base = nullptr;  // in the ring area: kHeaderArea + kPrefixArea + payload_size
    uring_area::SlotRecord* record = nullptr;  // what a successor reads of it (uring_area.hpp)
    uring_abi::ReqHeader* header = nullptr;
    char* payload = nullptr;
    std::size_t payload_size = 0;
    iovec iov[2]{};
    // Owner thread only:
    std::uint64_t request = 0;    // unique of the request it holds
    bool busy = false;            // holds a request whose reply is not committed
    bool dead = false;            // the kernel ended it (teardown)
    bool replied_inline = false;  // answered during fuse_session_process_buf
    bool free = false;            // its kernel entry ended empty: the slot may be reused
    bool adopted = false;         // a dead daemon's, committed again: ENOENT is no error
    // The unique of the request whose reply has not been claimed yet; 0 otherwise.
    // The reply's writer claims it (compare-exchange), from any thread.
    std::atomic<std::uint64_t> awaiting{0};
};

struct UringTransport::Ring {
    UringTransport* transport = nullptr;
    int qid = 0;
    std::uint32_t index = 0;  // in the transport's rings: its slots in the ring area
    io_uring ring{};
    bool ring_made = false;
    int event_fd = -1;
    std::uint64_t event_value = 0;
    std::size_t payload_size = 0;
    Entry slots[kMaxEntriesPerThread];
    std::atomic<int> entry_count{0};  // slots[0, entry_count) are made (release/acquire)
    // Replies written by other threads, for this thread to commit.
    Mutex handoff KCACHE_LEVEL(8);  // a leaf
    std::vector<Entry*> handed GUARDED_BY(handoff);
    bool closed GUARDED_BY(handoff) = false;  // the ring is gone: replies are refused
    std::atomic<bool> stopping{false};
    // An upgrade hands the rings over (UringTransport::hand_over): requests that come
    // are kept for the successor, not served.
    std::atomic<bool> draining{false};
    // Entries whose command waits in the kernel for a request (registered or committed,
    // its completion not yet seen); written by the owner thread only.
    std::atomic<int> armed{0};
    std::uint64_t kept = 0;  // requests kept for the successor (owner thread)
    std::atomic<std::uint64_t> served{0};
    std::thread thread;
    // Threads redoing a predecessor's requests (redo); joined by stop() after `thread`.
    std::vector<std::thread> redoers;
    bool warned_full = false;
    // Commits handed to the ring and not yet seen consumed by the kernel (owner thread):
    // marked `committed` in their records once they are (mark_committed).
    std::vector<std::pair<Entry*, std::uint64_t>> committing;

    // The start-up handshake with the thread that answers INIT.
    enum class Phase { making, made, failed, go, abort, registered, register_failed };
    Mutex phase_mutex KCACHE_LEVEL(8);  // a leaf
    CondVar phase_changed;
    Phase phase GUARDED_BY(phase_mutex) = Phase::making;
    std::string error GUARDED_BY(phase_mutex);  // why it failed

    void set_phase(Phase p, std::string why = {}) {
        MutexLock lock(phase_mutex);
        phase = p;
        if (!why.empty()) error = std::move(why);
        phase_changed.notify_all();
    }
    // The phase after `from`, once there is one (and in *why the error set with it).
    Phase wait_phase_past(Phase from, std::string* why = nullptr) {
        MutexLock lock(phase_mutex);
        while (phase == from) phase_changed.wait(phase_mutex);
        if (why) *why = error;
        return phase;
    }

    ~Ring() {
        if (ring_made) io_uring_queue_exit(&ring);  // after its thread ended (uring_ring.cpp)
    }
    void run();
    bool make();
    Entry* add_entry();
    void adopt(std::vector<Entry*>& requests);
    int submit();
    void mark_committed();
    io_uring_sqe* sqe();
    void prep_register(Entry* e);
    void register_entry(Entry* e);
    void prep_commit(Entry* e);
    void arm_event_read();
    std::optional<fuse_buf> prepare(Entry* e);
    void dispatch(fuse_buf buf, std::uint64_t unique);
    void process(Entry* e);
    void redo(Entry* e);
    void serve();
    void init_entry(Entry& e, std::uint32_t slot);
    void close_ring();
};

}  // namespace kcache::fsd
