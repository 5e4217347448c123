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

#include <algorithm>
#include <optional>
#include <system_error>

#include "log.hpp"
#include "resend.hpp"
#include "takeover.hpp"
#include "uring_ring.hpp"

// What this relies on in the kernel: the list at the head of uring_transport.cpp.

namespace kcache::fsd {

using namespace uring_detail;

void UringTransport::Ring::run() {
    // Pinned to its queue's CPU where allowed (requests of that CPU come here); an
    // offline or forbidden CPU leaves it unpinned.
    (void)pin_to_cpu(qid);

    if (!make()) return;
    if (wait_phase_past(Phase::made) != Phase::go) return close_ring();

    // What a dead predecessor's entries of this ring held is answered first (its replies
    // committed again now, its requests redone once the fresh entry is registered).
    std::vector<Entry*> requests;
    adopt(requests);
    Entry* fresh = add_entry();
    if (!fresh) {
        set_phase(Phase::register_failed, "no ring entry slot is free");
        return close_ring();
    }
    prep_register(fresh);
    arm_event_read();
    const int submitted = submit();
    std::string failure;
    if (submitted < 0) failure = fmt::format("io_uring_submit: {}", std::strerror(-submitted));
    // An error of REGISTER is posted at once; a request may already have come too.
    unsigned head;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring, head, cqe) {
        if (cqe->user_data == reinterpret_cast<std::uint64_t>(fresh) && cqe->res < 0 &&
            failure.empty())
            failure = fmt::format("FUSE_IO_URING_CMD_REGISTER: {}", std::strerror(-cqe->res));
    }
    if (!failure.empty()) {
        set_phase(Phase::register_failed, failure);
        return close_ring();
    }
    set_phase(Phase::registered);
    // As register_entry does for every later entry: a predecessor's callers, or callers
    // that came before this queue had an entry, may wait in the kernel's queue.
    (void)ask_from_cpu(transport->m_mountpoint, qid);
    for (Entry* e : requests) redo(e);
    serve();
    close_ring();
}

bool UringTransport::Ring::make() {
    io_uring_params params{};
    // One thread submits (it alone touches the SQ); the kernel's work of handing it a
    // request runs at its next transition into the kernel (COOP_TASKRUN), not by an
    // interrupt. Not DEFER_TASKRUN, which runs that work only when the thread waits:
    // after a kill -9 it could then run only once the whole process had ended, and the
    // process could not end while its notification thread waited on a directory lock
    // held by a caller whose request was in that work: the callers waited for ever (2
    // of 2 runs). With COOP_TASKRUN each dying thread runs it as it exits, and the
    // kernel ends such a request with ECANCELED (docs/operations.md).
    params.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN;
    int rc = io_uring_queue_init_params(kRingDepth, &ring, &params);
    if (rc == -EINVAL) {  // a kernel without COOP_TASKRUN or SINGLE_ISSUER (before 6.0)
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
    set_phase(Phase::made);
    return true;
}

void UringTransport::Ring::init_entry(Entry& e, std::uint32_t slot) {
    e.ring = this;
    e.base = uring_area::entry(index, slot);
    e.record = &uring_area::record(index, slot);
    e.header = reinterpret_cast<abi::ReqHeader*>(e.base);
    e.payload = e.base + kHeaderArea + kPrefixArea;
    e.payload_size = payload_size;
    e.iov[0] = {e.header, sizeof(abi::ReqHeader)};
    e.iov[1] = {e.payload, payload_size};
}

Entry* UringTransport::Ring::add_entry() {
    const int n = entry_count.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
        if (slots[i].free) {  // its kernel entry ended empty (adopt)
            slots[i].free = false;
            slots[i].dead = false;
            return &slots[i];
        }
    }
    if (n >= kMaxEntriesPerThread) return nullptr;
    init_entry(slots[n], static_cast<std::uint32_t>(n));
    slots[n].free = slots[n].dead = slots[n].adopted = false;
    entry_count.store(n + 1, std::memory_order_release);
    return &slots[n];
}

namespace {

enum class Held { nothing, reply, request };

// What a dead daemon's entry holds (uring_area.hpp); puts a request whose reply was
// being written back as it came, or writes an EIO reply where that cannot be done.
Held held_by(Entry& e, int qid) {
    const uring_area::SlotRecord& rec = *e.record;
    const std::uint64_t unique = e.header->ring_ent_in_out.commit_id;
    if (unique == 0 || rec.committed.load(std::memory_order_acquire) == unique)
        return Held::nothing;
    if (rec.replied.load(std::memory_order_acquire) == unique) return Held::reply;
    auto* in = reinterpret_cast<fuse_in_header*>(e.header->in_out);
    const char* prefix = e.base + kHeaderArea;
    bool whole = true;
    if (rec.filling.load(std::memory_order_acquire) == unique) {
        const std::uint32_t saved = rec.saved.load(std::memory_order_relaxed);
        if (saved == kNotSaved || saved > kSaveCapacity) {
            whole = false;
        } else {
            std::memcpy(in, prefix + kSavedInHeader, sizeof *in);
            std::memcpy(e.payload, prefix + kSavedPayload, saved);
            e.header->ring_ent_in_out.payload_sz = rec.payload_sz;
        }
    }
    if (whole && in->unique == unique) return Held::request;
    log::error(
        "io_uring: a request (unique {}) the previous daemon held on queue {} cannot be read "
        "back: answered EIO",
        unique, qid);
    auto* out = reinterpret_cast<fuse_out_header*>(e.header->in_out);
    *out = {};
    out->len = sizeof *out;
    out->error = -EIO;
    out->unique = unique;
    e.header->ring_ent_in_out.payload_sz = 0;
    return Held::reply;
}

}  // namespace

void UringTransport::Ring::adopt(std::vector<Entry*>& requests) {
    if (!uring_area::inherited()) return;
    int used = 0;
    for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(kMaxEntriesPerThread); ++i) {
        Entry& e = slots[i];
        init_entry(e, i);
        e.free = true;
        const Held h = held_by(e, qid);
        switch (h) {
            case Held::nothing:
                continue;
            case Held::reply:
                // Committed again: the kernel takes this command as the entry's own (the
                // entry is ours from now on), or answers ENOENT if it had the reply.
                e.request = e.header->ring_ent_in_out.commit_id;
                e.adopted = true;
                prep_commit(&e);
                break;
            case Held::request:
                e.request = e.header->ring_ent_in_out.commit_id;
                e.adopted = true;
                requests.push_back(&e);
                break;
        }
        e.free = false;
        used = static_cast<int>(i) + 1;
    }
    entry_count.store(used, std::memory_order_release);
    if (!requests.empty() || used > 0)
        log::info(
            "io_uring: queue {} took over {} ring entries of the previous daemon ({} "
            "requests to answer)",
            qid, std::count_if(slots, slots + used, [](const Entry& e) { return !e.free; }),
            requests.size());
}

int UringTransport::Ring::submit() {
    const int rc = io_uring_submit(&ring);
    mark_committed();
    return rc;
}

// Once the kernel has consumed the SQEs (io_uring_enter issues a COMMIT_AND_FETCH
// inline), the commits are done: a successor must not commit them again.
void UringTransport::Ring::mark_committed() {
    if (committing.empty() || io_uring_sq_ready(&ring) != 0) return;
    for (const auto& [e, unique] : committing)
        e->record->committed.store(unique, std::memory_order_release);
    committing.clear();
}

io_uring_sqe* UringTransport::Ring::sqe() {
    io_uring_sqe* s = io_uring_get_sqe(&ring);
    if (!s) {  // full: hand what is queued to the kernel first
        (void)submit();
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
    armed.fetch_add(1, std::memory_order_relaxed);
}

// A new entry for this thread, registered now. The kernel hands a request waiting in
// its CPU's queue (one that came while every entry of the queue was busy) only to an
// entry that commits, never to one that registers (fs/fuse/dev_uring.c,
// fuse_uring_do_register), so such a request would wait for the next commit on the
// queue; if its caller holds a directory lock that a deferred reply's notification
// waits for, that commit never comes. So a request of our own is asked for on the
// queue (a statfs from its CPU): it takes the fresh entry, and its commit fetches the
// first waiting request, whose commit fetches the next.
void UringTransport::Ring::register_entry(Entry* e) {
    prep_register(e);
    if (const int rc = submit(); rc < 0)
        log::error("io_uring: registering an entry on queue {}: {}", qid, std::strerror(-rc));
    (void)ask_from_cpu(transport->m_mountpoint, qid);
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
    committing.emplace_back(e, e->request);
    armed.fetch_add(1, std::memory_order_relaxed);
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
        mark_committed();
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
            armed.fetch_sub(1, std::memory_order_release);  // its command is done
            if (res == -ENOENT && e->adopted) {  // the dead daemon's commit had been done
                e->adopted = false;
                e->free = true;
                continue;
            }
            e->adopted = false;
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
            if (draining.load(std::memory_order_acquire)) {
                // Kept, unanswered, in its entry: the successor reads it there and
                // answers it (Ring::adopt), as a dead daemon's.
                ++kept;
                continue;
            }
            request_from_kernel();
            process(e);
        }
        if (woken && stopping) return;
    }
}

// The request in `e` laid out as /dev/fuse gives it (fuse_in_header, op header,
// payload in one buffer, in front of the payload), marked as awaiting its reply; or,
// when it does not add up, answered EIO at once (nullopt).
std::optional<fuse_buf> UringTransport::Ring::prepare(Entry* e) {
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
        prep_commit(e);
        return std::nullopt;
    }
    char* start = e->payload - op_len - sizeof(fuse_in_header);
    std::memcpy(start + sizeof(fuse_in_header), e->header->op_in, op_len);
    std::memcpy(start, in, sizeof(fuse_in_header));
    e->busy = true;
    e->replied_inline = false;
    e->awaiting.store(e->request, std::memory_order_release);
    fuse_buf buf{};
    buf.size = reinterpret_cast<const fuse_in_header*>(start)->len;
    buf.mem = start;
    buf.fd = -1;
    return buf;
}

// Hands a prepared request to libfuse on the calling thread, as `unique` for resend.hpp
// (with the resend bit: a predecessor's, which may have been done; a non-idempotent one
// is then answered as it was).
void UringTransport::Ring::dispatch(fuse_buf buf, std::uint64_t unique) {
    transport->m_resend.note(unique);
    fuse_session_process_buf(transport->m_session, &buf);
    served.fetch_add(1, std::memory_order_relaxed);
}

// A dead or handed-over predecessor's request, redone on a thread of its own (joined by
// stop): one may wait for another (a writer's open for the RELEASE of the version
// before it, both in this ring's entries), and this thread must serve meanwhile. Its
// reply takes the deferred way (hand_to_ring), also when no thread can be started and
// it is redone here.
void UringTransport::Ring::redo(Entry* e) {
    auto buf = prepare(e);
    if (!buf) return;
    auto redo_it = [this, buf = *buf, unique = e->request | takeover::kResendBit] {
        request_from_kernel();
        dispatch(buf, unique);
    };
    try {
        redoers.emplace_back([redo_it] {
            SignalsBlocked no_signals;
            redo_it();
        });
    } catch (const std::system_error& err) {
        log::warning("io_uring: cannot start a thread for a resent request ({}): done here",
                     err.what());
        redo_it();
    }
}

void UringTransport::Ring::process(Entry* e) {
    auto buf = prepare(e);
    if (!buf) return;
    t_current = e;
    dispatch(*buf, e->request);
    t_current = nullptr;
    if (e->replied_inline) return;  // and committed
    // The reply was deferred (or written from another thread already): the entry stays
    // with its request. Keep one entry of this thread free for the kernel.
    const int n = entry_count.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
        if (!slots[i].busy && !slots[i].dead && !slots[i].free) return;
    }
    if (Entry* more = add_entry()) {
        register_entry(more);
    } else if (!warned_full) {
        warned_full = true;
        log::warning(
            "io_uring: the {} entries of a ring thread of queue {} all wait for deferred "
            "replies; its CPU's requests may wait",
            n, qid);
    }
}

// The io_uring itself stays open until the Ring is destroyed, after this thread has
// ended: the thread's exit cancels its entries that wait for a request, and what the
// kernel had queued for them runs first, while a ring closed first would end that work
// before the request is copied to its entry.
void UringTransport::Ring::close_ring() {
    MutexLock lock(handoff);  // a deferred reply writes event_fd under it
    closed = true;
    handed.clear();
    if (event_fd >= 0) close(event_fd);
    event_fd = -1;
}

}  // namespace kcache::fsd
