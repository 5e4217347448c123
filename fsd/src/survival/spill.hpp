// Spill files: a writer's staged content mirrored on disk, so that it outlives the daemon.
//
// A file being written lives in the daemon's memory (core::StagedFile, one per Version,
// versions.hpp) until a close or fsync publishes it. So that a `kill -9` of the daemon
// does not lose what a WRITE was told it wrote (the writer used to get EIO at close and
// its file kept the previous version), each version mirrors its content, from its first
// change, into `<db>/spill/<ino>.<id>` (core::StagedMirror). Its key (SpillKey) is in the
// state memfd's handle records (state.hpp), so the daemon that takes the mount over
// rebuilds such a writer from the file (Versions::adopt) and the writer's next write,
// fsync or close goes on as if nothing happened.
//
// - The first change writes the whole content under `<name>.new` and renames it: a file
//   under its name always holds a whole content. Later changes are pwrite/ftruncate of
//   it. A change is mirrored before its request is answered; one cut short by a crash
//   was not answered, and the kernel resends it to the successor (takeover.hpp), which
//   applies it again (writes and truncates are idempotent).
// - No fsync: a writer is promised what a local disk promises it after a crash of a
//   process (the page cache keeps the bytes), not after a power loss.
// - A mirror that fails (ENOSPC, EIO on the db's disk) is dropped and its file removed,
//   with an error logged: that version's bytes live on in memory, and a crash then
//   loses them (the writer gets EIO, as before).
// - A version's file is removed when the version ends (published by its last handle);
//   a fresh mount removes every spill file (no handle of a dead mount can be used
//   again), a takeover those no inherited writer names.
//
// Ids are unique within a mount: the daemon's number (StateHeader::daemons) in the high
// bits, a counter in the low ones; the top bit of a key says "a private rewrite" (else
// the inode's shared version, versions.hpp).
//
// Thread safety: Spills' methods may be called from any thread (the counter and the directory flag
// are atomic; the rest are file system calls on distinct names). A mirror is used under the mutex
// of the Version whose StagedFile holds it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "kcache/core/staged.hpp"
#include "kcache/core/types.hpp"

namespace kcache::fsd {

// A version's spill key, as handle records keep it: its id, with kRewrite set for a
// private rewrite. 0: none.
using SpillKey = std::uint32_t;
inline constexpr SpillKey kRewrite = 1u << 31;

class Spills {
  public:
    // `dir` is made when first needed (empty: no spill files, e.g. a read-only mount);
    // `daemon` is this daemon's number within its mount.
    Spills(std::string dir, std::uint32_t daemon);

    // A new version's id (never 0, never kRewrite's bit).
    std::uint32_t next_id();
    // The mirror of version `id` of `ino` (nothing on disk until its first change); null
    // without a directory.
    std::shared_ptr<core::StagedMirror> mirror(core::Ino ino, std::uint32_t id);
    // The content a predecessor spilled for version `id` of `ino`, and a mirror that
    // holds it; nullopt when there is none (the version never changed, or its mirror
    // was dropped) or it cannot be read (logged).
    struct Spilled {
        std::string content;
        std::shared_ptr<core::StagedMirror> mirror;
    };
    std::optional<Spilled> load(core::Ino ino, std::uint32_t id);
    void remove(core::Ino ino, std::uint32_t id);
    bool exists(core::Ino ino, std::uint32_t id) const;
    // Removes every spill file but those of `keep` ((ino, id) pairs); logs how many.
    void sweep(const std::set<std::pair<core::Ino, std::uint32_t>>& keep);

    std::string path(core::Ino ino, std::uint32_t id) const;
    // Makes the directory once (a writer's first change used to pay a mkdir); `again`:
    // once more, after a file could not be made in it (someone removed it).
    bool make_dir(bool again = false);

  private:
    const std::string m_dir;
    std::atomic<std::uint32_t> m_next;
    std::atomic<bool> m_dir_made{false};
};

}  // namespace kcache::fsd
