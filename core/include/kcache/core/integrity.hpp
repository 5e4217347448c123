// Damage: what core checks of a db, and how it reports what it finds.
//
// Two kinds of damage, two error codes (the ones Linux file systems use for the same
// findings: ext4's EFSBADCRC and EFSCORRUPTED), so that a caller tells them apart from
// the EIO of a failing disk:
//
// - kDamagedContent (EBADMSG): a blob's bytes do not match its digest (a torn write or
//   bit rot inside a blob's pages, which LMDB cannot see). Every read of content
//   checks it: Txn::read, Txn::read_pieces, Txn::read_blob, and with them `kcache cat`,
//   bundle export and push (which read through them). Only the file is bad: kcache-fsd
//   evicts its entry (a miss), the rest of the db serves on.
// - kCorruptDb (EUCLEAN): LMDB found its own structure broken (MDB_CORRUPTED,
//   MDB_PAGE_NOTFOUND, MDB_INVALID): any operation may fail, so kcache-fsd sets the db
//   aside (set_aside) and serves a fresh one.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>

#include "kcache/core/error.hpp"

namespace kcache::core {

class Store;
class WriteTxn;

inline constexpr int kDamagedContent = EBADMSG;
inline constexpr int kCorruptDb = EUCLEAN;

// Whether reads check content against its digest (default: on). Off only to measure
// what the check costs (bench/); process-wide, meant to be set before any read.
void set_content_checks(bool on);
bool content_checks();

// The start-up check of a db (kcache-fsd runs it before it serves): walks the keys of
// every table (each branch and leaf page of the db, not the blobs' overflow pages,
// which reads check) and reads the root directory; `deep` also reads the header of
// every blob chunk's overflow page (a page read per chunk: after a crash, since LMDB
// aborts on a damaged one when it frees it). kCorruptDb if LMDB reports damage, the
// error of the walk otherwise. A page bad enough to make LMDB read outside the map
// kills the process instead (SIGSEGV, SIGBUS): callers run it in a child process.
Status check_structure(const Store& store, bool deep = false);

// Sets the damaged db at `path` aside: data.mdb and lock.mdb move to a new directory
// `<path>.damaged-<UTC time, to the second>[-N]` beside it, with a kcache.lock, so that
// `kcache verify --db` (read-only) can open it and a person can look; the db directory
// itself (its locks, fsd.log) stays, and the next Store::open makes a fresh db in it.
// Returns the new directory. Nothing is deleted.
Result<std::string> set_aside(const std::string& path, std::int64_t now_ns);

// Makes the db hand out inode numbers from `floor` on (if it is not there already). A
// fresh db that replaces a set-aside one under a live mount starts far above anything
// the old one used: the kernel may still know old numbers, and none may name a new node.
Status start_inodes_at(WriteTxn& txn, std::uint64_t floor);

}  // namespace kcache::core
