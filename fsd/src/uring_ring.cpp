// The ring threads of kcache-fsd --io-uring: setting up a ring and its entries,
// registering them, and the loop that serves requests and commits replies
// (uring_ring.hpp, uring_transport.hpp).
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "log.hpp"
#include "resend.hpp"
#include "uring_ring.hpp"

// What this relies on in the kernel: the list at the head of uring_transport.cpp.

namespace kcache::fsd {

using namespace uring_detail;

void UringTransport::Ring::run() {
    // Pinned to its queue's CPU where allowed (requests of that CPU come here); an
    // offline or forbidden CPU leaves it unpinned.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(qid, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);

    if (!make()) return;
    if (wait_phase_past(Phase::made) != Phase::go) return close_ring();

    prep_register(&slots[0]);
    arm_event_read();
    const int submitted = io_uring_submit(&ring);
    std::string failure;
    if (submitted < 0) failure = fmt::format("io_uring_submit: {}", std::strerror(-submitted));
    // An error of REGISTER is posted at once; a request may already have come too.
    unsigned head;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring, head, cqe) {
        if (cqe->user_data != kEventTag && cqe->res < 0 && failure.empty())
            failure = fmt::format("FUSE_IO_URING_CMD_REGISTER: {}", std::strerror(-cqe->res));
    }
    if (!failure.empty()) {
        set_phase(Phase::register_failed, failure);
        return close_ring();
    }
    set_phase(Phase::registered);
    serve();
    close_ring();
}

bool UringTransport::Ring::make() {
    io_uring_params params{};
    // One thread submits (it alone touches the SQ) and completions are run when it
    // waits: the kernel's work of handing it a request runs in its own context.
    params.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    int rc = io_uring_queue_init_params(kRingDepth, &ring, &params);
    if (rc == -EINVAL) {  // a kernel without DEFER_TASKRUN
        params = {};
        params.flags = IORING_SETUP_SQE128;
        rc = io_uring_queue_init_params(kRingDepth, &ring, &params);
    }
    if (rc < 0) {
        set_phase(Phase::failed, fmt::format("cannot set up an io_uring: {}", std::strerror(-rc)));
        return false;
    }
    ring_made = true;
    event_fd = eventfd(0, EFD_CLOEXEC);
    if (event_fd < 0) {
        set_phase(Phase::failed, fmt::format("eventfd: {}", std::strerror(errno)));
        close_ring();
        return false;
    }
    if (!add_entry()) {
        set_phase(Phase::failed, fmt::format("cannot map a ring entry of {} bytes: {}",
                                             payload_size, std::strerror(errno)));
        close_ring();
        return false;
    }
    set_phase(Phase::made);
    return true;
}

bool UringTransport::Ring::add_entry() {
    const int n = entry_count.load(std::memory_order_relaxed);
    if (n >= kMaxEntriesPerThread) return false;
    Entry& e = slots[n];
    e.mapped = kHeaderArea + kPrefixArea + (payload_size + kPage - 1) / kPage * kPage;
    void* base =
        mmap(nullptr, e.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return false;
    e.ring = this;
    e.base = static_cast<char*>(base);
    e.header = reinterpret_cast<abi::ReqHeader*>(e.base);
    e.payload = e.base + kHeaderArea + kPrefixArea;
    e.payload_size = payload_size;
    e.iov[0] = {e.header, sizeof(abi::ReqHeader)};
    e.iov[1] = {e.payload, payload_size};
    entry_count.store(n + 1, std::memory_order_release);
    return true;
}

io_uring_sqe* UringTransport::Ring::sqe() {
    io_uring_sqe* s = io_uring_get_sqe(&ring);
    if (!s) {  // full: hand what is queued to the kernel first
        (void)io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    if (s) std::memset(static_cast<void*>(s), 0, 128);  // a 128-byte SQE (SQE128)
    return s;
}

void UringTransport::Ring::prep_register(Entry* e) {
    io_uring_sqe* s = sqe();
    if (!s) return;
    io_uring_prep_rw(IORING_OP_URING_CMD, s, transport->m_fd, e->iov, 2, 0);
    s->cmd_op = abi::kCmdRegister;
    auto* cmd = reinterpret_cast<abi::CmdReq*>(s->cmd);
    cmd->qid = static_cast<std::uint16_t>(qid);
    io_uring_sqe_set_data(s, e);
}

void UringTransport::Ring::prep_commit(Entry* e) {
    replied_to_kernel();
    io_uring_sqe* s = sqe();
    if (!s) {
        log::error("io_uring: no submission slot for a reply on queue {}", qid);
        return;
    }
    io_uring_prep_rw(IORING_OP_URING_CMD, s, transport->m_fd, nullptr, 0, 0);
    s->cmd_op = abi::kCmdCommitAndFetch;
    auto* cmd = reinterpret_cast<abi::CmdReq*>(s->cmd);
    cmd->commit_id = e->request;
    cmd->qid = static_cast<std::uint16_t>(qid);
    io_uring_sqe_set_data(s, e);
}

void UringTransport::Ring::arm_event_read() {
    io_uring_sqe* s = sqe();
    if (!s) return;
    io_uring_prep_read(s, event_fd, &event_value, sizeof event_value, 0);
    s->user_data = kEventTag;
}

void UringTransport::Ring::serve() {
    for (;;) {
        const int rc = io_uring_submit_and_wait(&ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            log::error("io_uring: ring thread of queue {} stops: {}", qid, std::strerror(-rc));
            return;
        }
        io_uring_cqe* cqe;
        bool woken = false;
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            const std::uint64_t tag = cqe->user_data;
            const int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            if (tag == kEventTag) {
                woken = true;
                std::vector<Entry*> ready;
                {
                    MutexLock lock(handoff);
                    ready.swap(handed);
                }
                for (Entry* e : ready) {
                    e->busy = false;
                    prep_commit(e);
                }
                if (!stopping) arm_event_read();
                continue;
            }
            auto* e = reinterpret_cast<Entry*>(tag);
            if (res < 0) {
                // The kernel ended the entry: the connection is going (ENOTCONN,
                // ECANCELED), or a commit it refused.
                e->dead = true;
                e->busy = false;
                if (res != -ENOTCONN && res != -ECANCELED && res != -ENODEV)
                    log::warning("io_uring: a ring entry of queue {} failed: {}", qid,
                                 std::strerror(-res));
                continue;
            }
            request_from_kernel();
            process(e);
        }
        if (woken && stopping) return;
    }
}

void UringTransport::Ring::process(Entry* e) {
    const auto* in = reinterpret_cast<const fuse_in_header*>(e->header->in_out);
    const std::uint32_t payload = e->header->ring_ent_in_out.payload_sz;
    const std::size_t fixed = sizeof(fuse_in_header) + payload;
    const std::size_t op_len = in->len >= fixed ? in->len - fixed : abi::kOpInOutSize + 1;
    e->request = in->unique;
    if (op_len > abi::kOpInOutSize || payload > e->payload_size) {
        log::error(
            "io_uring: a request of opcode {} does not add up (length {}, payload {}): "
            "answered EIO",
            in->opcode, in->len, payload);
        auto* out = reinterpret_cast<fuse_out_header*>(e->header->in_out);
        const std::uint64_t unique = in->unique;
        *out = {};
        out->len = sizeof *out;
        out->error = -EIO;
        out->unique = unique;
        e->header->ring_ent_in_out.payload_sz = 0;
        return prep_commit(e);
    }
    // /dev/fuse's layout: fuse_in_header, op header, payload in one buffer.
    char* start = e->payload - op_len - sizeof(fuse_in_header);
    std::memcpy(start + sizeof(fuse_in_header), e->header->op_in, op_len);
    std::memcpy(start, in, sizeof(fuse_in_header));
    e->busy = true;
    e->replied_inline = false;
    e->awaiting.store(e->request, std::memory_order_release);
    t_current = e;
    fuse_buf buf{};
    buf.size = reinterpret_cast<const fuse_in_header*>(start)->len;
    buf.mem = start;
    buf.fd = -1;
    resend::set_current(e->request);  // resend.hpp: the request this thread handles
    fuse_session_process_buf(transport->m_session, &buf);
    t_current = nullptr;
    served.fetch_add(1, std::memory_order_relaxed);
    if (e->replied_inline) return;  // and committed
    // The reply was deferred (or written from another thread already): the entry stays
    // with its request. Keep one entry of this thread free for the kernel.
    const int n = entry_count.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
        if (!slots[i].busy && !slots[i].dead) return;
    }
    if (add_entry()) {
        prep_register(&slots[n]);
    } else if (!warned_full) {
        warned_full = true;
        log::warning(
            "io_uring: the {} entries of a ring thread of queue {} all wait for deferred "
            "replies; its CPU's requests may wait",
            n, qid);
    }
}

void UringTransport::Ring::close_ring() {
    MutexLock lock(handoff);  // a deferred reply writes event_fd under it
    closed = true;
    handed.clear();
    if (ring_made) io_uring_queue_exit(&ring);
    ring_made = false;
    if (event_fd >= 0) close(event_fd);
    event_fd = -1;
}

}  // namespace kcache::fsd
