// Holds: a blob kept in the db for readers that outlive every file naming it.
//
// A file unlinked, renamed over or rewritten while a process still has it open keeps
// its old content for that process until it closes (POSIX). The FUSE daemon serves
// such a reader from memory, but a new daemon that takes the mount over after a crash
// or an upgrade rebuilds its readers from the db by (ino, digest): the content must
// still be there. A hold is one more reference to the blob (so it is not freed), with
// a record saying it is a hold and not a file's. Take it in the same write transaction
// that drops the blob's last file reference, so no crash can come between the two.
//
// Holds are not entries: they appear in no listing, statistics counter or eviction;
// the blob's bytes stay counted in stored_bytes while held. `kcache verify` counts a
// hold as a reference. Holds belong to the mount that took them: the daemon clears
// them all when it mounts afresh (the kernel then knows no open file), never at a
// takeover.
#pragma once

#include <cstdint>
#include <functional>

#include "kcache/core/store.hpp"

namespace kcache::core {

// One more hold on the blob `digest` (the empty digest: a no-op). ENOENT when the db
// has no such blob (its last reference is already gone: take the hold first).
Status hold_blob(WriteTxn& txn, const Digest& digest);
// One hold fewer; the last reference of any kind frees the blob. ENOENT when `digest`
// has no hold (a second release is a caller's bug, and must not free a file's blob).
Status release_hold(WriteTxn& txn, const Digest& digest);
// Drops every hold (a fresh mount); returns how many were dropped. Blobs that only
// holds kept are freed.
Result<std::uint64_t> clear_holds(WriteTxn& txn);
// The holds, in digest order: `fn(digest, count)` returns false to stop.
Status for_each_hold(const Txn& txn, const std::function<bool(const Digest&, std::uint64_t)>& fn);

}  // namespace kcache::core
