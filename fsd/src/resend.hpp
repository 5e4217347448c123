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
// The current request: the custom io's read hook (and the io_uring ring threads) note
// the unique of the request a thread is about to process (set_current); the handler
// runs on that thread (libfuse processes a request on the thread that read it).
//
// Fault point for tests: KCACHE_FSD_FAULT=kill_after_commit=OP (OP: mkdir, mknod,
// symlink, link, create, unlink, rmdir, rename, setxattr, removexattr) kills the daemon (SIGKILL)
// after the commit of the first OP on the mount and before its reply; once per mount (the state
// remembers). KCACHE_FSD_FAULT=kill_before_reply=OP (OP: setxattr, removexattr) kills it before the
// reply of the first OP whatever its outcome, a failed one included (which commits
// nothing): the request is resent with no record.
#pragma once

#include <cstdint>
#include <optional>

#include "kcache/core/types.hpp"
#include "state.hpp"

namespace kcache::fsd::resend {

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

// The operation's name, as the fault point and the log spell it.
const char* name_of(Op op);
// Where answers are recorded (the daemon's state); before the first request.
void attach(StateFile& state);
// The request this thread processes next (its unique as the kernel sent it).
void set_current(std::uint64_t unique);
// Whether the current request was resent by the kernel (a takeover).
bool resent();
// Inside the operation's write transaction, before the commit.
void record(Op op, core::Ino ino);
// For a resent request: the inode the dead daemon recorded for it doing `op`.
std::optional<core::Ino> recorded(Op op);
// After the commit, before the reply: the fault point (see above).
void after_commit();
// Before the reply to `op`, whatever its outcome: both fault points (see above).
void before_reply(Op op);

}  // namespace kcache::fsd::resend
