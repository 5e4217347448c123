#include "uring_transport.hpp"

#include <liburing.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "log.hpp"
#include "resend.hpp"
#include "takeover.hpp"
#include "uring_area.hpp"
#include "uring_ring.hpp"

// What this relies on in the kernel (fs/fuse/dev_uring.c, Linux 6.14 to 6.18):
// - a request's fuse_in_header is copied to ReqHeader::in_out, its first argument
//   (the per-op header, possibly empty) to ReqHeader::op_in, the other arguments one
//   after the other to the payload buffer, whose used size is ring_ent_in_out.payload_sz;
//   so the op header is in_header.len - sizeof(fuse_in_header) - payload_sz bytes;
// - a reply is the fuse_out_header in in_out and all of its out arguments in the
//   payload buffer (payload_sz bytes), committed with COMMIT_AND_FETCH naming the
//   request's unique as commit_id;
// - REGISTER needs the INIT reply processed (else EAGAIN), a 128-byte SQE, iov[0] at
//   least sizeof(ReqHeader), iov[1] at least max(8 KiB, max_write, max_pages pages);
// - the ring is ready (and requests other than FORGET and INTERRUPT go to it) once
//   every possible CPU's queue has an entry; until then, requests made after the INIT
//   reply wait for it. A request goes to the queue of the CPU its caller runs on;
//   within a queue, to the entry that became free last.
// - a failed REGISTER clears the connection's io_uring (requests go on over /dev/fuse).

namespace kcache::fsd {

namespace {

using namespace uring_detail;

std::atomic<UringTransport*> g_transport{nullptr};

// hand_over asks again for a queue whose entries still wait after this long.
constexpr auto kAskAgain = std::chrono::milliseconds(20);

// The INIT exchange, seen by the hooks (one per process: one session).
std::atomic<bool> g_init_seen{false};
std::atomic<std::uint64_t> g_init_unique{0};
std::atomic<bool> g_offered{false};

std::vector<int> possible_cpus() {
    std::ifstream in("/sys/devices/system/cpu/possible");
    std::string text;
    std::getline(in, text);
    std::vector<int> cpus;
    std::size_t pos = 0;
    while (pos < text.size()) {
        std::size_t end = text.find(',', pos);
        if (end == std::string::npos) end = text.size();
        const std::string range = text.substr(pos, end - pos);
        const auto dash = range.find('-');
        try {
            const int first = std::stoi(range.substr(0, dash));
            const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
            for (int c = first; c <= last; ++c) cpus.push_back(c);
        } catch (const std::exception&) {
            return {};
        }
        pos = end + 1;
    }
    return cpus;
}

// Why the kernel did not offer FUSE over io_uring, for the fallback's log line.
std::string not_offered_reason() {
    std::ifstream in("/sys/module/fuse/parameters/enable_uring");
    std::string value;
    if (!in || !std::getline(in, value)) {
        return "this kernel has no FUSE over io_uring (it needs Linux 6.14 or later built with "
               "CONFIG_FUSE_IO_URING)";
    }
    if (value != "Y") {
        return "the fuse module's parameter enable_uring is off (as root: echo Y > "
               "/sys/module/fuse/parameters/enable_uring)";
    }
    return "the kernel did not offer it to this mount";
}

}  // namespace

namespace uring_detail {

bool ask_from_cpu(const std::string& mountpoint, int cpu) {
    try {
        std::thread([mountpoint, cpu] {
            if (!pin_to_cpu(cpu)) return;
            struct statfs st {};
            (void)::statfs(mountpoint.c_str(), &st);
        }).detach();
        return true;
    } catch (const std::system_error& e) {
        log::warning("io_uring: cannot start a thread to ask for a request: {}", e.what());
        return false;
    }
}

}  // namespace uring_detail

struct UringHooks {
    static ssize_t read(int fd, void* buf, size_t len, void*) {
        // A takeover's replayed INIT comes first (takeover.hpp). The transport is set
        // before the session loop starts, and cleared after it ended.
        const ssize_t n =
            g_transport.load(std::memory_order_acquire)->m_takeover.read(fd, buf, len);
        request_from_kernel();  // /dev/fuse and the rings: one order (uring_ring.hpp)
        if (n >= static_cast<ssize_t>(sizeof(fuse_in_header)) &&
            !g_init_seen.load(std::memory_order_relaxed)) {
            const auto* in = static_cast<const fuse_in_header*>(buf);
            if (in->opcode == FUSE_INIT) {
                const auto* init = reinterpret_cast<const fuse_init_in*>(in + 1);
                std::uint64_t flags = 0;
                if (static_cast<std::size_t>(n) >=
                    sizeof(fuse_in_header) + offsetof(fuse_init_in, flags2) + sizeof init->flags2) {
                    flags = init->flags;
                    if (flags & abi::kInitExt) flags |= std::uint64_t{init->flags2} << 32;
                }
                g_offered = (flags & abi::kOverIoUring) != 0;
                g_init_unique = in->unique;
                g_init_seen = true;
            }
        }
        return n;
    }

    static ssize_t writev(int fd, iovec* iov, int count, void*) {
        // The INIT reply goes through reply_init (write_init), a takeover's replay too:
        // the rings are set up again, only the reply itself is swallowed.
        UringTransport* t = g_transport.load(std::memory_order_acquire);
        const bool init_reply =
            t && count > 0 && iov[0].iov_len >= sizeof(fuse_out_header) &&
            !t->m_serving.load(std::memory_order_acquire) &&
            static_cast<const fuse_out_header*>(iov[0].iov_base)->unique == g_init_unique.load();
        if (init_reply) return write_reply(fd, iov, count);
        if (t) {
            if (auto swallowed = t->m_takeover.swallow_reply(iov, count)) return *swallowed;
        }
        return write_reply(fd, iov, count);
    }

    // Writes the INIT reply, or swallows it (a takeover's replay, takeover.hpp).
    static ssize_t write_init(Takeover& takeover, int fd, iovec* iov, int count) {
        if (auto swallowed = takeover.swallow_reply(iov, count)) return *swallowed;
        takeover.record_init(iov, count);
        return ::writev(fd, iov, count);
    }

    static ssize_t write_reply(int fd, iovec* iov, int count) {
        replied_to_kernel();
        UringTransport* t = g_transport.load(std::memory_order_acquire);
        if (t && count > 0 && iov[0].iov_len >= sizeof(fuse_out_header)) {
            const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
            if (out->unique != 0) {
                if (t->m_serving.load(std::memory_order_acquire)) {
                    if (auto written = reply_to_ring(*t, out->unique, iov, count)) return *written;
                } else if (out->unique == g_init_unique.load()) {
                    return reply_init(*t, fd, iov, count);
                }
            }
        }
        return ::writev(fd, iov, count);
    }

    // A reply to a request a ring entry holds: into the entry, then committed (by
    // the entry's thread). nullopt: no entry holds it (a /dev/fuse request).
    static std::optional<ssize_t> reply_to_ring(UringTransport& t, std::uint64_t unique,
                                                const iovec* iov, int count) {
        Entry* e = nullptr;
        const bool inline_reply =
            t_current && t_current->awaiting.load(std::memory_order_relaxed) == unique;
        if (inline_reply) {
            e = t_current;
        } else {
            for (const auto& ring : t.m_rings) {
                const int n = ring->entry_count.load(std::memory_order_acquire);
                for (int i = 0; i < n && !e; ++i) {
                    if (ring->slots[i].awaiting.load(std::memory_order_acquire) == unique)
                        e = &ring->slots[i];
                }
                if (e) break;
            }
        }
        if (!e) return std::nullopt;
        std::uint64_t expected = unique;
        if (!e->awaiting.compare_exchange_strong(expected, 0)) return std::nullopt;

        std::size_t total = 0;
        for (int i = 0; i < count; ++i) total += iov[i].iov_len;
        if (!inline_reply) return hand_to_ring(*e, iov, count, total);
        // On the entry's thread: committed now, as a write to /dev/fuse would be: when
        // fuse_reply_* returns the kernel has the reply (the daemon orders notifications
        // after replies).
        fill(*e, iov, count, total);
        e->replied_inline = true;
        e->busy = false;
        e->ring->prep_commit(e);
        if (const int rc = e->ring->submit(); rc < 0) {
            log::error("io_uring: submitting a reply on queue {}: {}", e->ring->qid,
                       std::strerror(-rc));
            errno = -rc;
            return -1;
        }
        return static_cast<ssize_t>(total);
    }

    // A reply from another thread than the entry's: filled and handed to the ring's
    // thread to commit, under the hand-off lock, which close_ring() closes the ring
    // under. Refused once closed, before anything is written: an upgrade's successor
    // reads the entries while this daemon may still be ending (a late fill would tear
    // the request it redoes), and a wake-up after the close could land in a file that
    // reused event_fd's number (ThreadSanitizer found it). An eventfd write does not block.
    static ssize_t hand_to_ring(Entry& e, const iovec* iov, int count, std::size_t total) {
        MutexLock lock(e.ring->handoff);
        if (e.ring->closed) {
            errno = ENOTCONN;
            return -1;
        }
        fill(e, iov, count, total);
        e.ring->handed.push_back(&e);
        const std::uint64_t one = 1;
        if (::write(e.ring->event_fd, &one, sizeof one) != sizeof one) {
            log::error("io_uring: cannot wake ring thread {}: {}", e.ring->qid,
                       std::strerror(errno));
        }
        return static_cast<ssize_t>(total);
    }

    // Writes a reply into an entry: the out header into the header buffer, the rest
    // into the payload buffer. What it overwrites of the request is saved first, and
    // the entry's record says how far it got (uring_area.hpp: a successor answers it).
    static void fill(Entry& e, const iovec* iov, int count, std::size_t total) {
        uring_area::SlotRecord& rec = *e.record;
        const std::uint64_t unique = e.request;
        const std::uint32_t request_payload = e.header->ring_ent_in_out.payload_sz;
        std::size_t payload = total - iov[0].iov_len;
        const std::size_t overwritten = std::min<std::size_t>(payload, request_payload);
        char* prefix = e.base + kHeaderArea;
        std::memcpy(prefix + kSavedInHeader, e.header->in_out, sizeof(fuse_in_header));
        if (overwritten <= kSaveCapacity) {
            std::memcpy(prefix + kSavedPayload, e.payload, overwritten);
            rec.saved.store(static_cast<std::uint32_t>(overwritten), std::memory_order_relaxed);
        } else {
            rec.saved.store(kNotSaved, std::memory_order_relaxed);
        }
        rec.payload_sz = request_payload;
        rec.filling.store(unique, std::memory_order_release);

        std::memcpy(e.header->in_out, iov[0].iov_base, sizeof(fuse_out_header));
        if (payload > e.payload_size) {
            // Cannot happen (a reply is never larger than max_write or a page-sized
            // request allows); if it did, the caller gets EIO rather than a cut reply.
            log::error("io_uring: a reply of {} bytes exceeds the ring's {}: answered EIO", payload,
                       e.payload_size);
            auto* out = reinterpret_cast<fuse_out_header*>(e.header->in_out);
            out->error = -EIO;
            out->len = sizeof(fuse_out_header);
            payload = 0;
        } else {
            char* to = e.payload;
            for (int i = 1; i < count; ++i) {
                std::memmove(to, iov[i].iov_base, iov[i].iov_len);
                to += iov[i].iov_len;
            }
        }
        e.header->ring_ent_in_out.payload_sz = static_cast<std::uint32_t>(payload);
        rec.replied.store(unique, std::memory_order_release);
    }

    // The INIT reply: when the kernel offers FUSE over io_uring, the rings are made
    // first (so that nothing can fail once the kernel has been told), then the reply
    // says FUSE_OVER_IO_URING, then the entries are registered.
    static ssize_t reply_init(UringTransport& t, int fd, iovec* iov, int count) {
        g_init_unique = 0;
        const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
        fuse_init_out init{};
        const bool full = count == 2 &&
                          iov[1].iov_len >= offsetof(fuse_init_out, flags2) + sizeof init.flags2 &&
                          iov[1].iov_len <= sizeof init;
        if (out->error != 0 || !full)
            return write_init(t.m_takeover, fd, iov, count);  // no session to serve
        if (!g_offered) {
            log::warning("--io-uring: {}: serving over /dev/fuse", not_offered_reason());
            return write_init(t.m_takeover, fd, iov, count);
        }
        std::memcpy(&init, iov[1].iov_base, iov[1].iov_len);
        const std::size_t pages = (init.flags & FUSE_MAX_PAGES) ? init.max_pages : 32;
        const std::size_t payload_size = std::max<std::size_t>(
            {8192, init.max_write, pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE))});

        const std::vector<int> cpus = possible_cpus();
        if (cpus.empty()) {
            log::warning(
                "--io-uring: cannot read /sys/devices/system/cpu/possible: serving "
                "over /dev/fuse");
            return write_init(t.m_takeover, fd, iov, count);
        }
        uring_area::Geometry geometry;
        geometry.rings = static_cast<std::uint32_t>(cpus.size() * UringTransport::kThreadsPerQueue);
        geometry.per_ring = UringTransport::kMaxEntriesPerThread;
        geometry.entry_size =
            kHeaderArea + kPrefixArea + (payload_size + kPage - 1) / kPage * kPage;
        geometry.payload_size = payload_size;
        if (auto made = uring_area::create(t.m_state_fd, geometry); !made) {
            log::warning("--io-uring: {}: serving over /dev/fuse", made.error().message);
            return write_init(t.m_takeover, fd, iov, count);
        }
        const std::string failure = make_rings(t, cpus.size(), payload_size);
        if (!failure.empty()) {
            abandon_rings(t);
            log::warning("--io-uring: {}: serving over /dev/fuse", failure);
            return write_init(t.m_takeover, fd, iov, count);
        }

        init.flags |= abi::kInitExt;
        init.flags2 |= static_cast<std::uint32_t>(abi::kOverIoUring >> 32);
        iovec with_uring[2] = {iov[0], {&init, iov[1].iov_len}};
        const ssize_t written = write_init(t.m_takeover, fd, with_uring, 2);
        if (written < 0) {
            const int err = errno;
            abandon_rings(t);
            errno = err;
            return written;
        }
        register_rings(t, cpus.size(), payload_size);
        return written;
    }

    // Starts kThreadsPerQueue ring threads per queue, each making its ring, and waits
    // until each made it or failed: the first failure, empty when every ring was made.
    static std::string make_rings(UringTransport& t, std::size_t queues, std::size_t payload_size) {
        {
            SignalsBlocked no_signals;  // the ring threads take none (uring_ring.hpp)
            for (std::size_t q = 0; q < queues; ++q) {
                for (int k = 0; k < UringTransport::kThreadsPerQueue; ++k) {
                    auto ring = std::make_unique<UringTransport::Ring>();
                    ring->transport = &t;
                    ring->qid = static_cast<int>(q);
                    ring->index = static_cast<std::uint32_t>(t.m_rings.size());
                    ring->payload_size = payload_size;
                    t.m_rings.push_back(std::move(ring));
                    UringTransport::Ring* r = t.m_rings.back().get();
                    try {
                        r->thread = std::thread([r] { r->run(); });
                    } catch (const std::system_error& e) {
                        r->set_phase(UringTransport::Ring::Phase::failed,
                                     fmt::format("cannot start a thread: {}", e.what()));
                    }
                }
            }
        }

        std::string failure;
        for (auto& r : t.m_rings) {
            std::string why;
            if (r->wait_phase_past(UringTransport::Ring::Phase::making, &why) ==
                    UringTransport::Ring::Phase::failed &&
                failure.empty()) {
                failure = why;
            }
        }
        return failure;
    }

    // Ends every ring thread before the kernel was told of io_uring.
    static void abandon_rings(UringTransport& t) {
        for (auto& r : t.m_rings) {
            r->set_phase(UringTransport::Ring::Phase::abort);
            if (r->thread.joinable()) r->thread.join();
        }
        t.m_rings.clear();
    }

    // After the INIT reply told the kernel: the ring threads register their entries.
    static void register_rings(UringTransport& t, std::size_t queues, std::size_t payload_size) {
        std::string failure;
        t.m_serving.store(true, std::memory_order_release);
        for (auto& r : t.m_rings) r->set_phase(UringTransport::Ring::Phase::go);
        int failed = 0;
        for (auto& r : t.m_rings) {
            std::string why;
            if (r->wait_phase_past(UringTransport::Ring::Phase::go, &why) ==
                UringTransport::Ring::Phase::register_failed) {
                if (failed++ == 0) failure = why;
            }
        }
        // Threads that registered keep serving (their entries are the kernel's now);
        // the kernel gave up io_uring for the connection at the first failed REGISTER.
        if (failed) {
            log::warning(
                "--io-uring: {} of {} ring threads could not register ({}): serving "
                "over /dev/fuse",
                failed, t.m_rings.size(), failure);
        } else {
            log::info(
                "serving over io_uring: {} queues x {} entries (a thread each, more "
                "while replies are deferred; {} KiB payload)",
                queues, UringTransport::kThreadsPerQueue, payload_size / 1024);
        }
    }
};

std::unique_ptr<UringTransport> UringTransport::install(fuse_session* session, Takeover& takeover,
                                                        const Resend& resend, int state_fd,
                                                        std::string mountpoint) {
    std::unique_ptr<UringTransport> t(
        new UringTransport(session, takeover, resend, state_fd, std::move(mountpoint)));
    fuse_custom_io io{};
    io.read = &UringHooks::read;
    io.writev = &UringHooks::writev;
    if (const int rc = fuse_session_custom_io(session, &io, t->m_fd); rc != 0) {
        log::warning("--io-uring: libfuse refused a custom io ({}): serving over /dev/fuse",
                     std::strerror(-rc));
        return nullptr;
    }
    g_transport.store(t.get(), std::memory_order_release);
    return t;
}

UringTransport::UringTransport(fuse_session* session, Takeover& takeover, const Resend& resend,
                               int state_fd, std::string mountpoint)
    : m_session(session),
      m_takeover(takeover),
      m_resend(resend),
      m_fd(fuse_session_fd(session)),
      m_state_fd(state_fd),
      m_mountpoint(std::move(mountpoint)) {}

UringTransport::~UringTransport() {
    stop();
    g_transport.store(nullptr, std::memory_order_release);
}

void UringTransport::stop() {
    if (m_stopped) return;
    m_stopped = true;
    for (auto& r : m_rings) {
        r->stopping = true;
        MutexLock lock(r->handoff);
        if (!r->closed) {
            const std::uint64_t one = 1;
            (void)!::write(r->event_fd, &one, sizeof one);
        }
    }
    std::uint64_t kept = 0;
    for (auto& r : m_rings) {
        if (r->thread.joinable()) r->thread.join();
        kept += r->kept;                                // written by its thread, now ended
        for (auto& redoer : r->redoers) redoer.join();  // started by that thread
    }
    if (m_serving)
        log::info("io_uring served {} requests ({} kept for a successor)", served(), kept);
}

void UringTransport::hand_over() {
    if (m_stopped || !m_serving.load(std::memory_order_acquire)) return stop();
    for (auto& r : m_rings) r->draining.store(true, std::memory_order_release);
    SignalsBlocked no_signals;  // the statfs threads, as the ring threads
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::seconds(2);
    std::map<int, std::chrono::steady_clock::time_point> asked;  // by queue
    std::size_t asks = 0;
    bool drained = false;
    while (!drained && std::chrono::steady_clock::now() < deadline) {
        std::map<int, int> waiting;  // entries waiting in the kernel, by queue
        for (const auto& r : m_rings) waiting[r->qid] += r->armed.load(std::memory_order_acquire);
        drained = true;
        const auto now = std::chrono::steady_clock::now();
        for (const auto& [qid, n] : waiting) {
            if (n <= 0) continue;
            drained = false;
            // Asked again while some stay armed: a request may have gone elsewhere
            // (every one lands somewhere: an extra one waits for the successor).
            if (auto it = asked.find(qid); it != asked.end() && now - it->second < kAskAgain)
                continue;
            asked[qid] = now;
            for (int i = 0; i < n; ++i) asks += ask_from_cpu(m_mountpoint, qid) ? 1 : 0;
        }
        if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (drained) {
        log::info(
            "upgrade: the rings keep every request that came for the successor ({} statfs "
            "asked, {:.1f} ms)",
            asks, ms);
    } else {
        log::warning(
            "upgrade: ring entries still wait in the kernel after {:.0f} ms: a request it hands "
            "them as their threads end fails with ECANCELED",
            ms);
    }
    stop();
}

std::uint64_t UringTransport::served() const {
    std::uint64_t n = 0;
    for (const auto& r : m_rings) n += r->served.load(std::memory_order_relaxed);
    return n;
}

}  // namespace kcache::fsd
