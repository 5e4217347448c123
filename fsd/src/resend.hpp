// Resent requests answered once (issue 20): a request the dead daemon had read comes
// to its successor again (takeover.hpp, bit 63 of `unique`). Idempotent ones are
// simply redone. A non-idempotent one (mkdir, symlink, an O_EXCL create, unlink,
// rmdir, rename) whose change the dead daemon had committed must get that change's
// answer, not the one a redo would give (EEXIST to the creator of a lock file, ENOENT
// to the renamer): so each records, inside its write transaction before the commit,
// its request's unique and the inode it made, removed or moved, in the state memfd
// (state.hpp, AnswerRecord). The successor proves from the db whether the commit
// happened: inode numbers are never reused, so "the name now holds that inode" (or no
// longer does, for a removal) is true only if it did. Proven: it answers as the dead
// daemon would have; not proven: it redoes the request.
//
// The current request: the custom io's read hook (and the io_uring ring threads) note
// the unique of the request a thread is about to process (set_current); the handler
// runs on that thread (libfuse processes a request on the thread that read it).
//
// Fault point for tests: KCACHE_FSD_FAULT=kill_after_commit=OP (OP: mkdir, symlink,
// create, unlink, rmdir, rename) kills the daemon (SIGKILL) after the commit of the
// first OP on the mount and before its reply; once per mount (the state remembers).
#pragma once

#include <cstdint>
#include <optional>

#include "kcache/core/types.hpp"
#include "state.hpp"

namespace kcache::fsd::resend {

enum class Op : std::uint8_t { none = 0, mkdir, symlink, create, unlink, rmdir, rename };

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

}  // namespace kcache::fsd::resend
