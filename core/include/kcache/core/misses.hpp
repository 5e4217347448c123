// Why did it miss? Every miss (an entry populated: EventKind::populate) classified
// after the fact, with evidence (docs/misses.md):
//
//   first         no entry of this kernel (its family) is in the cache, and this entry
//                 was never evicted: a new kernel, nothing to fix
//   capacity      this very entry (its name) was evicted or removed before: the events
//                 log says when and why; the size bound was too small
//   changed_key   an entry of the same family is in the cache and what went into the
//                 key differs: metadata fields, source or IR lines
//   unstable_key  the compile produced a binary an entry of the same family already
//                 holds: the key changed and the output did not (a wasted compile)
//
// A *family* names "the same kernel" across keys, decided per layout from the files
// the compiler stores (family_of): Triton's metadata `name` (also Inductor's Triton
// kernels), Wave's kernel_info `func_name`, JAX's `jit_<function>` key prefix,
// kcache's own kernel.json `kernel`. Layouts whose files name no kernel (Inductor's
// pickled FX graphs and generated modules, CuTe DSL's MLIR bytecode, Helion, ccache)
// have no family: their misses are first or capacity.
//
// Classification runs in the background, never on a request path: classify_pending()
// follows the events log from where it last stopped (a position kept in the db) and
// keeps one record per miss (the `misses` table, newest Config::max_events kept), the
// evictions it saw (`evictions`, by entry name) and each entry's family (`families`).
// A miss is classified once its entry settled (no publish for kSettleNs and no write in
// flight, or kMaxWaitNs after the miss), so the files a compiler publishes one after
// another are all there. A batch compares from a read snapshot for about 5 ms at most,
// then writes what it decided in one short write transaction: LMDB's writer lock, which
// every store needs, is held for the writes only. The next call goes on where it stopped.
//
// Thread-safety: free functions over a Store or a Txn; classify_pending may run in
// several processes at once (a batch writes only if the position it read is still the
// db's, checked inside its write transaction; otherwise it is dropped and the next call
// goes on from the new position). Failures: core's storage errors; a record that does
// not decode is EIO.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

enum class MissCause : std::uint8_t { first = 1, capacity = 2, changed_key = 3, unstable_key = 4 };
std::string_view miss_cause_name(MissCause cause);  // "first", "capacity", "changed_key", ...
std::optional<MissCause> parse_miss_cause(std::string_view name);  // also "changed", "unstable"
Counter miss_cause_counter(MissCause cause);                       // Counter::misses_first, ...

// A metadata field that differs between the entry compared with and the missed one.
struct FieldDiff {
    std::string file;  // the metadata file, with the entry's key as "{key}"
    std::string field;
    std::string before;  // the compared entry's value ("" when absent)
    std::string after;   // the missed entry's value
};

// The first differing line of an IR or source file present in both entries.
struct LineDiff {
    std::string file;
    std::uint32_t line = 0;  // 1-based
    std::string before;
    std::string after;
};

// One classified miss.
struct Miss {
    std::uint64_t seq = 0;  // the populate event's sequence number
    std::int64_t time_ns = 0;
    Ino entry = 0;
    std::string name;  // the entry's name (EntryInfo::name)
    Producer producer = Producer::unknown;
    std::string family;  // "" when its layout names no family
    MissCause cause = MissCause::first;
    std::uint64_t stored_bytes = 0;  // the entry's stored bytes when classified
    // changed_key, unstable_key: the entry of the same family it was compared with
    Ino compared = 0;
    std::string compared_name;
    std::vector<FieldDiff> fields;  // at most kMaxFields
    std::vector<LineDiff> lines;    // at most one per file, kMaxLineFiles files
    std::string same_binary;        // unstable_key: the file whose content both hold
    // capacity: when this entry went and why ("evicted", "removed")
    std::int64_t gone_ns = 0;
    std::string gone_why;
    // capacity: LRU stack distance estimate, the stored bytes of the distinct entries
    // used between this entry's last use and its eviction plus its own: a bound at
    // least this large would have kept it (0: unknown)
    std::uint64_t stack_distance = 0;
    std::string note;  // what could not be told ("gone before it was classified", ...)
    // Explained across nodes (explain_with_members): the entry compared with is another
    // node's, known from its family member in the shared tier. Empty for a local one.
    std::string compared_host;       // the node that pushed it (its host name)
    std::string compared_namespace;  // the shared tier's namespace it was found in
};

inline constexpr std::size_t kMaxFields = 32;
inline constexpr std::size_t kMaxLineFiles = 4;
inline constexpr std::size_t kMaxLineBytes = 240;           // longer lines are cut
inline constexpr std::int64_t kSettleNs = 1'000'000'000;    // quiet time before classifying
inline constexpr std::int64_t kMaxWaitNs = 30'000'000'000;  // classified by then whatever

// The family of `entry` (see the file comment): "triton:add_kernel", "jax:jit_f", ...;
// "" when its layout names none or its files are not there.
Result<std::string> family_of(const Txn& txn, const EntryInfo& entry);

// Compares `missed` with `other` (an entry of the same family): the metadata fields and
// the first differing lines that differ, and whether both hold one binary (unstable).
// Fills the comparison fields of `out` (compared, fields, lines, same_binary, cause:
// unstable_key when a binary is shared, else changed_key).
Status compare_entries(const Txn& txn, const EntryInfo& missed, const EntryInfo& other, Miss& out);

// Classifies the misses logged since the last call (up to `max_events` events of the
// log per call, about 5 ms of comparing, then one write transaction): returns how many
// misses it classified. A
// miss whose entry has not settled stops the batch there (the next call goes on).
// Read-only stores and dbs without the tables (opened read-only before an upgrade)
// classify nothing.
Result<std::size_t> classify_pending(Store& store, std::size_t max_events = 512);

// The classified misses, newest first, from `since_ns` on (0: all kept); `fn` returns
// false to stop.
Status for_each_miss(const Txn& txn, std::int64_t since_ns,
                     const std::function<bool(const Miss&)>& fn);
// The newest classified miss of the entry called `name`; nullopt when none is kept.
Result<std::optional<Miss>> find_miss(const Txn& txn, std::string_view name);
// Populate events not classified yet (waiting to settle, or no classifier ran).
Result<std::uint64_t> pending_misses(const Txn& txn);

// ---- across nodes ---------------------------------------------------------------------
// A *family member* is what the comparison of two entries reads, kept small enough to
// travel: per file (its path with the key normalized) its kind, size and digest, the
// whole of a metadata file up to kMemberMetadataBytes, the first whole lines of source
// and IR up to kMemberTextBytes, binaries by digest only; at most kMemberMaxFiles files
// and kMemberMaxBytes of text (past them, files keep their digest only). The shared
// tier keeps the members of each family that nodes pushed (remote/src/families.hpp),
// and the daemon compares its "first" misses with them (explain_with_members).
enum class MemberKind : std::uint8_t { metadata = 1, text = 2, binary = 3 };
struct MemberFile {
    std::string path;  // in the entry, its key as "{key}"
    MemberKind kind = MemberKind::binary;
    std::uint64_t size = 0;
    Digest digest;
    std::string text;    // what is held of its content (binaries: nothing)
    bool whole = false;  // `text` is the whole file
};
struct FamilyMember {
    std::string entry;   // its name in the cache (EntryInfo::name)
    std::string family;  // family_of()
    std::string host;    // the node that pushed it (set by the shared tier)
    std::int64_t time_ns = 0;
    std::vector<MemberFile> files;
};
inline constexpr std::size_t kMemberMetadataBytes = 16 << 10;
inline constexpr std::size_t kMemberTextBytes = 2 << 10;
inline constexpr std::size_t kMemberMaxFiles = 32;
inline constexpr std::size_t kMemberMaxBytes = 64 << 10;

// The family member of `entry` in `txn`; nullopt when its layout names no family.
Result<std::optional<FamilyMember>> family_member(const Txn& txn, const EntryInfo& entry);

// Misses classified first whose layout names a family, logged after `after_seq`, oldest
// first, at most `max`: the ones another node's entries may explain.
Result<std::vector<Miss>> first_misses(const Txn& txn, std::uint64_t after_seq, std::size_t max);

// Compares miss `seq` (still classified first, its entry still in the cache) with the
// closest of `members` (another node's entries of its family, from the shared tier
// namespace `ns`; members of another family or of the entry's own name are passed
// over) as classify_pending compares with local entries: changed key or unstable key.
// The comparison reads from a snapshot; one short write transaction then rewrites the
// miss (if it is still first) and moves its count from misses_first to the new cause.
// True when it did; false when nothing changed (not first any more, gone, no member).
Result<bool> explain_with_members(Store& store, std::uint64_t seq,
                                  const std::vector<FamilyMember>& members, std::string_view ns);

// Records in the classifier's tables (all 0 before schema 4).
struct MissTables {
    std::uint64_t misses = 0;
    std::uint64_t evictions = 0;  // evicted entry names not compiled again (yet)
    std::uint64_t families = 0;   // (family, entry) rows
};
Result<MissTables> miss_tables(const Txn& txn);

// Sizing from capacity misses: how many misses re-compiled evicted entries, and the
// miss-ratio curve of the LRU stack distances: at each size, how many of them a bound
// that large would still have missed.
struct SizingPoint {
    std::uint64_t bytes = 0;
    std::uint64_t capacity_misses = 0;  // capacity misses a bound of `bytes` would still have
};
struct Sizing {
    std::uint64_t misses = 0;  // classified misses in the window
    std::uint64_t capacity = 0;
    std::uint64_t bound = 0;         // Config::max_bytes now (0: none)
    std::uint64_t avoid_all = 0;     // the smallest bound that would have avoided them all
    std::vector<SizingPoint> curve;  // at the bound x 1, 1.5, 2, 4 and avoid_all x 1/4, 1/2, 1
};
Result<Sizing> capacity_sizing(const Txn& txn, std::int64_t since_ns);

}  // namespace kcache::core
