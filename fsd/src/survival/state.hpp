// What a serving kcache-fsd leaves for the daemon that takes its mount over after a
// crash or an upgrade (keeper.hpp): the state memfd the keeper holds.
//
// It holds what the new daemon cannot learn from the db or the kernel:
// - the kernel's INIT request, once answered: the new daemon replays it to libfuse
//   (takeover.hpp), which has no API to resume a negotiated session;
// - the table of open handles. fuse_file_info::fh is a slot of this table and the
//   slot's generation (never a pointer), so a handle the kernel holds names something
//   the next daemon can rebuild: a reader reads its version again (by inode and
//   digest); a writer whose bytes were all published writes on; a writer whose
//   unpublished bytes died is answered EIO (files.cpp).
//
// Layout (kLayout; the keeper and its daemons are one binary, or an upgrade of it that
// checks kLayout): a StateHeader, then kHandleSlots HandleRecords, then kHitPairSlots
// hit pairs (hits.hpp: the (entry, process) pairs whose hit was counted, so that a new
// daemon does not count them again). The hit pairs came later within layout 1: a memfd
// made by an older keeper is shorter and map() grows it (its zeros are an empty set);
// an older daemon never looks past the records. The memfd is sparse: only the pages
// of slots in use cost memory. Without a keeper (--no-keeper, tests
// that drive a Filesystem directly) the same layout lives in private memory.
//
// Concurrency: a record is written by the thread that owns its slot (between
// HandleTable::add and take, nobody else writes it); `kind` is stored last with
// release order, so a successor that sees a kind sees the fields. The successor reads
// the mapping only after its predecessor died (the keeper's waitpid orders them).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/types.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

struct FileHandle;
struct DirHandle;

inline constexpr std::uint64_t kStateMagic = 0x6b63616368657374ull;  // "kcachest"
inline constexpr std::uint32_t kLayout = 1;
inline constexpr std::uint32_t kHandleSlots = 1u << 18;
inline constexpr std::size_t kMaxInitBytes = 1024;
inline constexpr std::uint32_t kHitPairSlots = 1u << 17;  // 1 MiB of 64-bit keys

enum class HandleKind : std::uint8_t { free = 0, file = 1, dir = 2 };

struct HandleRecord {
    std::atomic<std::uint32_t> generation{0};  // of the slot's current (or last) use
    std::atomic<HandleKind> kind{HandleKind::free};
    std::uint8_t readable = 0;
    std::uint8_t writable = 0;
    // A writer's bytes (or O_TRUNC) not yet published by this handle: the successor
    // answers its WRITE, FLUSH and FSYNC with EIO.
    std::atomic<std::uint8_t> unpublished{0};
    std::uint32_t opener = 0;  // a writer's process (process.hpp)
    // A writer's version's spill key (spill.hpp): its content outlives this daemon in
    // a spill file once it changed. In what was padding: daemons of layout 1 without it
    // leave 0 (none) and ignore it.
    std::uint32_t version = 0;
    std::uint64_t ino = 0;
    std::uint64_t size = 0;  // a reader's version: its size and digest
    core::Digest digest;
};

static_assert(sizeof(HandleRecord) == 48 && offsetof(HandleRecord, ino) == 16,
              "HandleRecord's layout is kLayout 1's");

// What a non-idempotent request did, recorded in its write transaction before the
// commit (resend.hpp): the successor that gets the request resent proves from the db
// whether the commit happened (inode numbers are never reused) and answers as the dead
// daemon would have.
inline constexpr std::uint32_t kAnswerSlots = 1024;
struct AnswerRecord {
    std::atomic<std::uint64_t> unique{0};  // the request's, without the resend bit; 0: none
    std::uint8_t op = 0;                   // resend::Op
    std::uint64_t ino = 0;                 // the inode it made, removed or moved
};

struct StateHeader {
    std::uint64_t magic;
    std::uint32_t layout;
    std::uint32_t slots;
    std::atomic<std::uint32_t> daemons;      // serving daemons started on this state
    std::atomic<std::uint32_t> init_size;    // 0 until the INIT reply was written
    std::atomic<std::uint32_t> fault_fired;  // the test fault point (resend.hpp) fired
    std::uint8_t init[kMaxInitBytes];        // the kernel's INIT request, as read
    AnswerRecord answers[kAnswerSlots];      // by unique (resend.hpp)
};

// The mapping of a state memfd (or private memory).
class StateFile {
  public:
    static constexpr std::size_t kRecordsEnd =
        sizeof(StateHeader) + sizeof(HandleRecord) * std::size_t{kHandleSlots};
    static constexpr std::size_t kSize =
        kRecordsEnd + sizeof(std::atomic<std::uint64_t>) * std::size_t{kHitPairSlots};

    // Maps the memfd `fd` (made by the keeper, kept open by it; grown to kSize bytes if
    // an older keeper made it shorter), or private memory when fd < 0. A mapping whose header is
    // set was left by a predecessor: inherited() is then true (EINVAL if its layout is another).
    static core::Result<std::unique_ptr<StateFile>> map(int fd);
    ~StateFile();
    StateFile(const StateFile&) = delete;
    StateFile& operator=(const StateFile&) = delete;

    StateHeader& header() { return *m_header; }
    HandleRecord* records() { return m_records; }
    // kHitPairSlots slots, 0 when free (hits.hpp's HitPairs).
    std::atomic<std::uint64_t>* hit_pairs() { return m_hit_pairs; }
    bool inherited() const { return m_inherited; }

  private:
    StateFile() = default;
    void* m_base = nullptr;
    StateHeader* m_header = nullptr;
    HandleRecord* m_records = nullptr;
    std::atomic<std::uint64_t>* m_hit_pairs = nullptr;
    bool m_inherited = false;
};

// The open handles: fh = generation << 32 | (slot + 1), never 0.
//
// Contract: add_* returns 0 when every slot is in use (the open is answered ENFILE).
// file() and dir() return the live handle of `fh`; for a slot a predecessor left, the
// handle is rebuilt once (the rebuild callbacks) and kept; nullptr for an fh that names
// no handle (freed, or an older use of its slot). take_*() ends the slot's use and
// hands the handle back (nullptr as file() would; a slot inherited and never used is
// freed too).
//
// Locks: m_mutex, level 8 (lock_order.hpp), a leaf except that the rebuild callbacks
// run under m_rebuild_mutex, level 1, taken with nothing of ours held (they read the
// db, join versions). Lookups of a live handle take no lock.
class HandleTable {
  public:
    // A file's rebuild may change its record's `version` (the version it joined).
    using RebuildFile = std::function<FileHandle*(HandleRecord&)>;
    using RebuildDir = std::function<DirHandle*(const HandleRecord&)>;

    explicit HandleTable(StateFile& state);
    ~HandleTable();
    HandleTable(const HandleTable&) = delete;
    HandleTable& operator=(const HandleTable&) = delete;

    void on_rebuild(RebuildFile file, RebuildDir dir);

    // Describes the slot by `record`'s fields (kind, readable, writable, opener, ino,
    // size, digest, unpublished) and stores `handle` in it.
    std::uint64_t add_file(FileHandle* handle, const HandleRecord& record);
    std::uint64_t add_dir(DirHandle* handle, core::Ino ino);
    FileHandle* file(std::uint64_t fh);
    DirHandle* dir(std::uint64_t fh);
    std::unique_ptr<FileHandle> take_file(std::uint64_t fh);
    std::unique_ptr<DirHandle> take_dir(std::uint64_t fh);
    // A writer's state for a successor (HandleRecord::unpublished).
    void set_unpublished(std::uint64_t fh, bool unpublished);

    // Handles of this daemon with unpublished bytes (an upgrade waits for none).
    std::int64_t unpublished() const { return m_unpublished.load(); }
    // Slots a predecessor left in use (counted at construction).
    std::size_t inherited() const { return m_inherited; }
    // Rebuilds every inherited file handle whose record `now` picks (the takeover's
    // start: a reader's version may leave the db before its next READ; the writers of
    // a spilled version must all count in it before one of them closes).
    void rebuild_inherited(const std::function<bool(const HandleRecord&)>& now);

  private:
    // A free slot, its generation advanced (never 0), and the fh naming both; nullopt
    // when every slot is taken. Takes m_mutex.
    struct TakenSlot {
        std::uint32_t slot;
        std::uint64_t fh;
    };
    std::optional<TakenSlot> take_slot();
    HandleRecord* record_of(std::uint64_t fh, HandleKind kind);
    void* live_or_rebuild(std::uint64_t fh, HandleKind kind);
    void release(std::uint64_t fh, bool counted);

    StateFile& m_state;
    std::unique_ptr<std::atomic<void*>[]> m_live;  // by slot; FileHandle* or DirHandle*
    Mutex m_mutex KCACHE_LEVEL(8);
    std::vector<std::uint32_t> m_free GUARDED_BY(m_mutex);  // free slots, lowest last
    Mutex m_rebuild_mutex KCACHE_LEVEL(1);
    RebuildFile m_rebuild_file;
    RebuildDir m_rebuild_dir;
    std::size_t m_inherited = 0;
    std::atomic<std::int64_t> m_unpublished{0};
};

}  // namespace kcache::fsd
