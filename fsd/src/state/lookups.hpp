// The kernel's lookup references in kcache-fsd, and the orphans they keep alive.
//
// Inode numbers are the store's (stable, never reused), so the daemon needs no table
// to translate them; it counts the kernel's lookup references (every entry reply
// takes one, FORGET drops them) for what it keeps per inode while the kernel knows
// it: a file removed (unlink, rename over it) while the kernel still knows its inode
// stays readable as an *orphan* until the kernel forgets it, as an unlinked inode does
// on a local disk; and the page-cache state of the inode (dropped at the last FORGET).
// Both are parts of the inode's record in the inode table (inodes.hpp).
//
// Contract: adopt() records an orphan only for an inode the kernel knows; forget()
// of the last reference drops the inode's orphan and its idle page-cache state.
// Nothing here fails or touches the db.
//
// Locks (lock_order.hpp): the inode table's, level 6; nothing else.
#pragma once

#include <cstdint>
#include <optional>

#include "inodes.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class Lookups {
  public:
    explicit Lookups(Inodes& inodes) : m_inodes(inodes) {}

    void remember(core::Ino ino);
    // Returns the digest of the orphan that goes with the last reference, if it held
    // its blob (the caller releases the hold: no I/O here).
    std::optional<core::Digest> forget(core::Ino ino, std::uint64_t count);
    bool known(core::Ino ino);

    // Records `orphan` of `ino` if the kernel still knows `ino`; false if it does not.
    bool adopt(core::Ino ino, const Orphan& orphan);
    void disown(core::Ino ino);
    std::optional<Orphan> find_orphan(core::Ino ino);

  private:
    Inodes& m_inodes;
};

}  // namespace kcache::fsd
