// Resent requests answered once (issue 20): a request the dead daemon had read comes
// to its successor again (takeover.hpp, bit 63 of `unique`). Idempotent ones are
// simply redone. A non-idempotent one (mkdir, mknod, symlink, link, an O_EXCL create,
// unlink, rmdir, rename, an XATTR_CREATE setxattr, removexattr) whose change the dead daemon
// had committed must get that change's answer, not the one a redo would give (EEXIST
// to the creator of a lock file, ENOENT to the renamer, ENODATA to the remover): so
// each records, inside its write transaction before the commit, its request's unique
// and the inode it made, removed, moved or changed, in the state memfd (state.hpp,
// AnswerRecord). The successor proves from the db whether the commit happened: inode
// numbers are never reused, so "the name now holds that inode" (or no longer does, for
// a removal) is true only if it did. Proven: it answers as the dead daemon would have;
// not proven: it redoes the request. An attribute has no number of its own: a resent
// XATTR_CREATE that finds EEXIST, or a resent removexattr that finds ENODATA, was
// done by the dead daemon exactly when a record says its transaction did it (else the
// redo's answer stands: a removal of an attribute that never existed is ENODATA).
//
// Who does what: the daemon owns one Resend (serve.cpp; Filesystem makes a private one
// that records nothing when given none) and hands it to the transports and to
// Filesystem. A handler of a non-idempotent request goes through
// Filesystem::non_idempotent, which reads the request's context once (current), makes a
// NonIdempotent for it (proof, record, fault point) and hands that down: nothing below
// reads the thread's request again.
//
// The current request, the one seam libfuse forces: libfuse 3.14 gives a handler no
// way to know its request's unique, so the transport notes it (note: the custom io's
// read hook, Takeover::read, and an io_uring ring thread's dispatch) on the thread
// that then processes the request (libfuse processes a request on the thread that read
// it), in a thread-local that only note and current touch.
//
// Fault point for tests: KCACHE_FSD_FAULT=kill_after_commit=OP (OP: mkdir, mknod,
// symlink, link, create, unlink, rmdir, rename, setxattr, removexattr) kills the daemon (SIGKILL)
// after the commit of the first OP on the mount and before its reply; once per mount (the state
// remembers). KCACHE_FSD_FAULT=kill_before_reply=OP (OP: setxattr, removexattr) kills it before the
// reply of the first OP whatever its outcome, a failed one included (which commits
// nothing): the request is resent with no record.
//
// Thread safety: a Resend is immutable once made (its records are the memfd's atomics,
// one slot per unique in flight); a NonIdempotent belongs to its request's thread.
#pragma once

#include <cstdint>
#include <optional>

#include "kcache/core/types.hpp"
#include "state.hpp"

namespace kcache::fsd {

namespace resend {

enum class Op : std::uint8_t {
    none = 0,
    mkdir,
    symlink,
    create,
    unlink,
    rmdir,
    rename,
    setxattr,
    removexattr,
    mknod,
    link
};

inline constexpr std::uint64_t kResendBit = std::uint64_t{1} << 63;  // FUSE_UNIQUE_RESEND

// The operation's name, as the fault point and the log spell it.
const char* name_of(Op op);
// Whether `op`'s change is proven inside its transaction (setxattr, removexattr: an
// attribute has no inode number), not from a name before it (the others).
bool proven_in_transaction(Op op);

}  // namespace resend

// A request as the transport read it: its unique as the kernel sent it.
struct RequestContext {
    std::uint64_t unique = 0;
    // Whether the kernel resent it (a takeover).
    bool resent() const { return (unique & resend::kResendBit) != 0; }
    // The unique the dead daemon read it with (0: none noted).
    std::uint64_t first_unique() const { return unique & ~resend::kResendBit; }
};

class Resend {
  public:
    // Where answers are recorded (the daemon's state), and the fault point
    // (KCACHE_FSD_FAULT). Null: records nothing, answers nothing, no fault point.
    explicit Resend(StateFile* state);
    Resend(const Resend&) = delete;
    Resend& operator=(const Resend&) = delete;

    // The seam (above). The transport: the request this thread processes next.
    void note(std::uint64_t unique) const;
    // Filesystem::non_idempotent, once at a handler's entry: that request.
    RequestContext current() const;

    // Inside the operation's write transaction, before the commit.
    void record(RequestContext request, resend::Op op, core::Ino ino) const;
    // For a resent request: the inode the dead daemon recorded for it doing `op`.
    std::optional<core::Ino> recorded(RequestContext request, resend::Op op) const;
    // Before the reply to `op` (above): `recorded`: the request recorded its change;
    // `committed`: its transaction committed.
    void before_reply(resend::Op op, bool recorded, bool committed) const;

  private:
    AnswerRecord& slot_of(std::uint64_t unique) const;
    void kill_at_fault_point(const char* where) const;

    StateFile* m_state;
    resend::Op m_fault = resend::Op::none;  // KCACHE_FSD_FAULT
    bool m_fault_any_outcome = false;       // kill_before_reply: not only after a commit
};

// One non-idempotent request being served (Filesystem::non_idempotent makes it).
class NonIdempotent {
  public:
    NonIdempotent(const Resend& resend, RequestContext request, resend::Op op)
        : m_resend(resend), m_request(request), m_op(op) {}

    resend::Op op() const { return m_op; }
    // For a resent request: the inode the dead daemon recorded for it.
    std::optional<core::Ino> recorded() const { return m_resend.recorded(m_request, m_op); }
    // Inside the write transaction, before the commit: the inode made, removed, moved
    // or changed.
    void record(core::Ino ino) {
        m_recorded = true;
        m_resend.record(m_request, m_op, ino);
    }
    // Before the reply, once the transaction is over (`committed`): the fault point.
    void before_reply(bool committed) const { m_resend.before_reply(m_op, m_recorded, committed); }

  private:
    const Resend& m_resend;
    RequestContext m_request;
    resend::Op m_op;
    bool m_recorded = false;  // by this request
};

}  // namespace kcache::fsd
