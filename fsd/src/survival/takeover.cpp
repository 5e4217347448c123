#include "takeover.hpp"

#include <linux/fuse.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "kernel_order.hpp"
#include "lock_order.hpp"
#include "log.hpp"
#include "resend.hpp"

namespace kcache::fsd {

using takeover::kNotifyResend;
using takeover::kResendBit;

namespace {

// The Takeover whose plain custom io is installed (install_plain): libfuse 3.14 calls
// its read and writev hooks with the session's userdata (the Filesystem), never a
// pointer of ours, so this is the one static that remains; one session per process.
std::atomic<Takeover*> g_plain{nullptr};

std::size_t total_of(const iovec* iov, int count) {
    std::size_t total = 0;
    for (int i = 0; i < count; ++i) total += iov[i].iov_len;
    return total;
}

}  // namespace

void Takeover::request_resend() {
    fuse_out_header out{};
    out.len = sizeof out;
    out.error = kNotifyResend;
    out.unique = 0;
    if (::write(m_fd, &out, sizeof out) != static_cast<ssize_t>(sizeof out)) {
        log::error(
            "takeover: FUSE_NOTIFY_RESEND refused ({}; it needs Linux 6.9): requests the "
            "previous daemon had read wait until their callers give up",
            std::strerror(errno));
        return;
    }
    log::info("takeover: the kernel resends what the previous daemon had not answered");
}

void Takeover::finish_replay() {
    {
        MutexLock lock(m_mutex);
        m_phase = Phase::done;
    }
    m_done.notify_all();
}

Takeover::Takeover(StateFile& state, int fuse_fd, const Resend& resend)
    : m_state(state), m_fd(fuse_fd), m_resend(resend) {
    if (!state.inherited()) return;
    const std::uint32_t size = state.header().init_size.load(std::memory_order_acquire);
    if (size < sizeof(fuse_in_header)) {
        // The previous daemon never answered INIT: the kernel's comes back resent.
        log::warning("takeover: the previous daemon died before the kernel's INIT was answered");
        request_resend();
        return;
    }
    fuse_in_header in{};
    std::memcpy(&in, state.header().init, sizeof in);
    m_replay_unique = in.unique;
    m_phase = Phase::pending;
}

Takeover::~Takeover() {
    Takeover* self = this;
    g_plain.compare_exchange_strong(self, nullptr);
}

bool Takeover::resuming() const {
    return m_state.inherited();
}

std::optional<ssize_t> Takeover::read_replayed(void* buf, size_t len) {
    Phase phase = m_phase.load(std::memory_order_acquire);
    if (phase == Phase::none || phase == Phase::done) return std::nullopt;
    if (phase == Phase::pending && m_phase.compare_exchange_strong(phase, Phase::replaying)) {
        const std::uint32_t size = m_state.header().init_size.load(std::memory_order_acquire);
        if (len < size) {  // cannot happen: libfuse's first buffer holds any request
            finish_replay();
            errno = EIO;
            return -1;
        }
        std::memcpy(buf, m_state.header().init, size);
        return static_cast<ssize_t>(size);
    }
    MutexLock lock(m_mutex);
    while (m_phase.load() != Phase::done) m_done.wait(m_mutex);
    return std::nullopt;
}

// The kernel's INIT resent: the dead daemon recorded it but died before its reply
// reached the kernel. libfuse, resumed already, would answer it EIO; the reply it gave
// to the replay is the answer.
bool Takeover::answer_resent_init(int fd, const fuse_in_header& in) {
    if (in.opcode != FUSE_INIT || !(in.unique & kResendBit)) return false;
    if (m_replay_reply.size() < sizeof(fuse_out_header)) return false;
    std::vector<std::uint8_t> reply = m_replay_reply;
    auto* out = reinterpret_cast<fuse_out_header*>(reply.data());
    out->unique = in.unique;
    if (::write(fd, reply.data(), reply.size()) < 0) {
        log::error("takeover: answering the resent INIT: {}", std::strerror(errno));
    } else {
        log::info(
            "takeover: the kernel's INIT, which the previous daemon had not answered, "
            "is answered now");
    }
    return true;
}

namespace {

// A request the kernel cannot copy whole into the reading daemon's buffer is ended with
// EIO, not resent (fs/fuse/dev.c, fuse_dev_do_read). A daemon being killed (SIGKILL
// pending) cannot take a page fault: so a WRITE whose payload lands on pages of the
// buffer never touched before failed with EIO at a kill, and a buffered write() split
// into several WRITEs returned short, which callers that check only for -1 (fsstress)
// take for the whole (issue 33: the files 1 run in 12 lost a write's tail). So each
// thread's buffer is made resident before its first read: touched page by page and
// locked where RLIMIT_MEMLOCK allows (touched pages stay resident with no swap).
// Which buffer this thread made resident is the thread's own fact (libfuse gives each
// worker its buffer and the hook nothing to tell threads apart): a thread-local.
void make_resident(void* buf, std::size_t len) {
    thread_local const void* t_buf = nullptr;
    thread_local std::size_t t_len = 0;
    if (buf == t_buf && len <= t_len) return;
    auto* bytes = static_cast<volatile char*>(buf);
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    for (std::size_t at = 0; at < len; at += page) bytes[at] = 0;
    if (len > 0) bytes[len - 1] = 0;
    (void)::mlock(buf, len);  // best effort: the touch is what matters without swap
    t_buf = buf;
    t_len = len;
}

}  // namespace

ssize_t Takeover::read(int fd, void* buf, size_t len) {
    if (auto replayed = read_replayed(buf, len)) return *replayed;
    make_resident(buf, len);
    for (;;) {
        const ssize_t n = ::read(fd, buf, len);
        if (n < static_cast<ssize_t>(sizeof(fuse_in_header))) return n;
        const auto* in = static_cast<const fuse_in_header*>(buf);
        m_resend.note(in->unique);
        if (in->opcode != FUSE_INIT) return n;
        if (m_phase.load() == Phase::done && answer_resent_init(fd, *in)) continue;
        if (n <= static_cast<ssize_t>(kMaxInitBytes)) {
            MutexLock lock(m_pending_mutex);
            m_pending_unique = in->unique;
            m_pending_size = static_cast<std::uint32_t>(n);
            std::memcpy(m_pending, buf, static_cast<std::size_t>(n));
        }
        return n;
    }
}

std::optional<ssize_t> Takeover::swallow_reply(const iovec* iov, int count) {
    if (m_phase.load(std::memory_order_acquire) != Phase::replaying || count < 1 ||
        iov[0].iov_len < sizeof(fuse_out_header)) {
        return std::nullopt;
    }
    const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
    if (out->unique != m_replay_unique) return std::nullopt;
    const std::size_t total = total_of(iov, count);
    m_replay_reply.clear();
    for (int i = 0; i < count; ++i) {
        const auto* p = static_cast<const std::uint8_t*>(iov[i].iov_base);
        m_replay_reply.insert(m_replay_reply.end(), p, p + iov[i].iov_len);
    }
    if (out->error != 0) {
        log::error("takeover: libfuse refused the replayed INIT ({})", std::strerror(-out->error));
    } else {
        log::info("takeover: the session resumed (INIT replayed)");
    }
    request_resend();
    finish_replay();
    return static_cast<ssize_t>(total);
}

void Takeover::record_init(const iovec* iov, int count) {
    if (count < 1 || iov[0].iov_len < sizeof(fuse_out_header)) return;
    const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
    if (out->unique == 0 || out->error != 0) return;
    MutexLock lock(m_pending_mutex);
    if (out->unique != m_pending_unique) return;
    StateHeader& h = m_state.header();
    std::memcpy(h.init, m_pending, m_pending_size);
    h.init_size.store(m_pending_size, std::memory_order_release);
    m_pending_unique = 0;
}

namespace {

ssize_t plain_read(int fd, void* buf, size_t len, void*) {
    const ssize_t n = g_plain.load(std::memory_order_acquire)->read(fd, buf, len);
    kernel_order::request_from_kernel();
    return n;
}

ssize_t plain_writev(int fd, iovec* iov, int count, void*) {
    Takeover* takeover = g_plain.load(std::memory_order_acquire);
    if (auto swallowed = takeover->swallow_reply(iov, count)) return *swallowed;
    takeover->record_init(iov, count);
    kernel_order::replied_to_kernel();
    return ::writev(fd, iov, count);
}

}  // namespace

bool Takeover::install_plain(fuse_session* session) {
    fuse_custom_io io{};
    io.read = &plain_read;
    io.writev = &plain_writev;
    if (const int rc = fuse_session_custom_io(session, &io, fuse_session_fd(session)); rc != 0) {
        log::warning("libfuse refused a custom io ({}): a crash of this daemon ends the mount",
                     std::strerror(-rc));
        return false;
    }
    g_plain.store(this, std::memory_order_release);
    return true;
}

}  // namespace kcache::fsd
