// The kcache store: one LMDB environment holding a cache's tree, content-addressed
// blobs, entries, LRU index, statistics and events log (see docs/core.md).
//
// Concurrency: any number of processes and threads may open the same db. Read
// transactions are MVCC snapshots and never block anyone; write transactions are
// serialized by LMDB (one writer at a time across all processes). A Store is
// thread-safe; a transaction belongs to one thread at a time (it may move between
// threads: the environment is opened with MDB_NOTLS).
//
// Failure: operations return Result/Status. Validation errors (ENOENT, EEXIST,
// ENOTEMPTY, ENAMETOOLONG, ...) are detected before a transaction is modified, so
// the transaction stays usable. Storage errors (ENOSPC on a full disk or a full map,
// EIO on corruption) poison the write transaction: commit() then fails with the
// first such error and nothing of the transaction is written.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kcache/core/error.hpp"
#include "kcache/core/types.hpp"

struct MDB_txn;

namespace kcache::core {

class Store;

// Nanoseconds since the Unix epoch. Tests inject a fake clock through OpenOptions.
using Clock = std::function<std::int64_t()>;
std::int64_t system_clock_ns();
// Nanoseconds of the monotonic clock (std::chrono::steady_clock's): deadlines, pacing
// and durations within one process; never stored.
std::int64_t steady_ns();

// Progress of a long operation: (done, total) in the operation's own unit.
using ProgressFn = std::function<void(std::uint64_t done, std::uint64_t total)>;

enum class Durability : std::uint8_t {
    full,          // every commit is synced: a power loss loses no committed data
    no_meta_sync,  // the meta page is not synced: a power loss may undo the last
                   // commits but never corrupts (MDB_NOMETASYNC)
    none,          // nothing is synced by commit: a process crash loses nothing, a
                   // power loss may lose recent commits (MDB_NOSYNC); Store::sync()
};

// Address space reserved for the map. It is not disk space: data.mdb grows only
// with what is stored, so a large reservation costs nothing but lets a cache grow
// to its configured maximum without ever failing on the map size.
inline constexpr std::uint64_t kDefaultMapSize = std::uint64_t{1} << 40;  // 1 TiB

struct OpenOptions {
    std::string path;        // the db directory (holds data.mdb and lock.mdb)
    bool create = true;      // create the directory and an empty db if missing
    bool read_only = false;  // open for reading only (write() fails with EROFS)
    Durability durability = Durability::full;
    std::uint64_t map_size = 0;   // 0: $KCACHE_MAP_SIZE (parse_size: "512G"), else kDefaultMapSize
    unsigned max_readers = 1024;  // concurrent read transactions, all processes
    std::uint32_t entry_depth = 1;  // used only when a new db is created
    Clock clock;                    // empty: system_clock_ns
};

// $KCACHE_DB, else $XDG_CACHE_HOME/kcache/db, else $HOME/.cache/kcache/db.
std::string default_db_path();

// The size bound a new db gets (ccache's default is 5 GiB, sccache's 10 GiB).
inline constexpr std::uint64_t kDefaultMaxBytes = std::uint64_t{10} << 30;

// Settings persisted in the db (meta record); shared by every process using it.
struct Config {
    std::uint32_t entry_depth = 1;  // the layout's depth fallback (layout.hpp): no entry above it
    std::uint64_t max_bytes = 0;    // bound on stored bytes; 0: none
    std::uint64_t max_entries = 0;  // bound on entries; 0: none
    std::uint32_t low_mark_percent = 90;  // eviction goes down to this share of a bound
    std::uint64_t max_events = 100000;    // the events log keeps this many newest
    std::string layout_rules;             // the user's layout rules (layout.hpp), checked first
};

// 2: layouts (stem entries, bookkeeping nodes); 3: segmented content (files of
// kSegmentedSize or more stored by segment, Codec::segments); 4: misses explained (the
// misses, evictions and families tables of misses.hpp), file kinds and trained zstd
// dictionaries (the `dicts` table, blob references of format 2: dictionaries.hpp; an
// older db's blobs stay as they are, kind 0 and no dictionary, until `kcache gc`
// classifies and recompresses them), special nodes (fifos, sockets, devices:
// WriteTxn::mknod) and hard links (WriteTxn::link, the `links` table), which a
// schema-3 binary would take for damage. An older db is upgraded
// when first opened for writing (nothing is rewritten: its big files keep their flat
// digests and blobs until they change) and still read as it is when opened read-only.
inline constexpr std::uint32_t kSchemaVersion = 4;

struct Stats {
    std::map<Counter, std::uint64_t> values;  // every known counter, 0 when unset
    std::int64_t reset_ns = 0;                // when counters were last reset (0: never)
    std::uint64_t get(Counter c) const;
};

// A file's content as read inside a transaction. Content stored uncompressed is a
// view into the map (zero-copy) and is valid only while its transaction is alive;
// compressed content is decompressed into a buffer the Content owns.
class Content {
  public:
    Content() = default;
    static Content view(std::string_view bytes);
    static Content owned(std::string bytes);
    std::string_view bytes() const { return m_is_owned ? std::string_view(m_owned) : m_view; }
    bool zero_copy() const { return !m_is_owned; }
    // The bytes as a string of the caller's: moved out when owned, copied from the map
    // when a view (then valid after the transaction too).
    std::string release() &&;

  private:
    bool m_is_owned = false;
    std::string m_owned;
    std::string_view m_view;
};

// Who publishes content; recorded as an entry's populating process.
struct Origin {
    std::uint32_t pid = 0;
    std::string name;  // process name (comm)
    // Compiled elsewhere and fetched from the shared tier (a pull, a read-through, a
    // prefetch): the entry it populates is no miss here, since no compile ran; its
    // populate is logged as an import, and its populating process is pid 0 named
    // kFleetOrigin + the writer's host (is_fleet_entry).
    bool fetched = false;
    static Origin current();  // this process
    // A fetch of what `writer` (the pushing node's host name, as the manifest says) wrote;
    // any byte outside printable ASCII in it becomes '?', and it is cut to 48 bytes.
    static Origin fleet(std::string_view writer);
};

struct SetAttr {
    std::optional<std::uint32_t> mode;  // permission bits only; the file type is kept
    std::optional<std::uint32_t> uid;
    std::optional<std::uint32_t> gid;
    std::optional<std::uint64_t> size;  // truncate or extend with zeros (regular files)
    std::optional<std::int64_t> atime_ns;
    std::optional<std::int64_t> mtime_ns;
};

// The most names one node may have (ext4's limit): link() fails with EMLINK past it.
inline constexpr std::uint32_t kMaxLinks = 65000;

// rename(2) flags, same meaning as RENAME_NOREPLACE / RENAME_EXCHANGE.
inline constexpr unsigned kRenameNoReplace = 1u << 0;
inline constexpr unsigned kRenameExchange = 1u << 1;  // not supported: EINVAL

// A snapshot of the db. Reads never block writers and see one consistent state.
class Txn {
  public:
    Txn(Txn&& other) noexcept;
    Txn& operator=(Txn&& other) noexcept;
    Txn(const Txn&) = delete;
    Txn& operator=(const Txn&) = delete;
    virtual ~Txn();  // aborts if still open

    Result<Attr> lookup(Ino parent, std::string_view name) const;
    Result<Attr> getattr(Ino ino) const;
    Result<std::string> readlink(Ino ino) const;
    // Path below the root, components separated by '/': "" is the root.
    Result<Ino> resolve(std::string_view path) const;
    // The inverse: the path of `ino` below the root ("" for the root), ENOENT if gone.
    Result<std::string> path(Ino ino) const;
    // Children of `dir` in name order, starting after `after` ("" from the first).
    // `fn` returns false to stop early.
    Status readdir(Ino dir, std::string_view after,
                   const std::function<bool(const DirEntry&)>& fn) const;
    // Whole content of a regular file (see Content for lifetime): zero-copy when it is
    // stored uncompressed in one chunk (up to 4080 bytes).
    Result<Content> read(Ino file) const;
    // The content in pieces, in order. Uncompressed content of any size is visited
    // zero-copy, one view into the map per chunk, valid while the transaction lives;
    // compressed content is decompressed into one piece.
    Status read_pieces(Ino file, const std::function<void(std::string_view)>& fn) const;
    // Whether the db holds the blob of `digest` (content keyed by digest_of, or a flat
    // digest of a schema-2 file): lets a pull fetch only the blobs the db lacks. The
    // empty digest (empty content) is always present.
    Result<bool> has_blob(const Digest& digest) const;
    // The content of a blob holding `size` raw bytes, as read() returns a file's (see
    // Content): ENOENT when the db lacks it, EIO when its stored size is another.
    Result<Content> read_blob(const Digest& digest, std::uint64_t size) const;

    Result<EntryInfo> entry(Ino entry) const;
    // By name (EntryInfo::name): a directory's path, or a directory's path and a stem.
    Result<EntryInfo> find_entry(std::string_view name) const;
    // Every node of an entry (EntryFile, types.hpp), directories before what they hold,
    // in name order; `fn` returns false to stop. entry_files.hpp: the files, collected.
    Status for_each_entry_file(const EntryInfo& entry,
                               const std::function<bool(const EntryFile&)>& fn) const;
    // All entries in ino (creation) order; `fn` returns false to stop.
    Status for_each_entry(const std::function<bool(const EntryInfo&)>& fn) const;
    // Unpinned entries, least recently used first.
    Status for_each_lru(const std::function<bool(const EntryInfo&)>& fn) const;
    // Events with seq > after_seq, oldest first.
    Status for_each_event(std::uint64_t after_seq,
                          const std::function<bool(const Event&)>& fn) const;
    // True while some live process holds a write lease on a file of the entry.
    Result<bool> in_flight(Ino entry) const;

    Result<Stats> stats() const;
    Result<std::uint64_t> counter(Counter c) const;
    const Config& config() const;
    std::uint64_t id() const;  // LMDB transaction id: differs iff the db changed
    Store& store() const { return *m_store; }

  protected:
    friend class Store;
    friend struct TxnAccess;
    Txn(Store* store, MDB_txn* txn);
    Store* m_store = nullptr;
    MDB_txn* m_txn = nullptr;
    // The config of the snapshot, as its meta record held it when the transaction began:
    // decoded once per environment and shared (txn.cpp), not decoded per transaction.
    std::shared_ptr<const Config> m_config;
};

using ReadTxn = Txn;

struct WriteState;  // pending counter deltas and events, applied at commit

// The single write transaction. Nothing is visible to others before commit().
class WriteTxn : public Txn {
  public:
    WriteTxn(WriteTxn&& other) noexcept;
    WriteTxn& operator=(WriteTxn&& other) noexcept;
    ~WriteTxn() override;

    Result<Attr> mkdir(Ino parent, std::string_view name, std::uint32_t mode, std::uint32_t uid = 0,
                       std::uint32_t gid = 0);
    // mkdir -p of `dir` ("a/b/c", "" for the root) from the root, as the calling
    // process's user, mode 0755: the directory's ino. ENOTDIR where a component is
    // not a directory.
    Result<Ino> mkdirs(std::string_view dir);
    // Creates an empty regular file. An existing file is returned as it is unless
    // `exclusive` (O_EXCL), which fails with EEXIST.
    Result<Attr> create(Ino parent, std::string_view name, std::uint32_t mode,
                        std::uint32_t uid = 0, std::uint32_t gid = 0, bool exclusive = false);
    Result<Attr> symlink(Ino parent, std::string_view name, std::string_view target,
                         std::uint32_t uid = 0, std::uint32_t gid = 0);
    // mknod(2): a fifo, socket, character or block device (`rdev`) node: a plain node
    // with no content that never forms, joins the accounting of or populates an entry
    // (it belongs to the entry it is made in, and goes with it). A regular `mode` is
    // create(..., exclusive); another type is EINVAL.
    Result<Attr> mknod(Ino parent, std::string_view name, std::uint32_t mode, std::uint64_t rdev,
                       std::uint32_t uid = 0, std::uint32_t gid = 0);
    // link(2): `new_name` in `new_parent` becomes another name of `ino` (a file, symlink or
    // special node; a directory is EPERM). Every name of a node stays inside its entry, so
    // that an eviction removes an entry whole and exactly: a name that would belong to
    // another entry (or form one) is EXDEV, as across file systems (ccache, cp and mv then
    // copy). Outside every entry (bookkeeping, containers) names may be anywhere outside.
    // EEXIST, EMLINK past kMaxLinks. The node's content and accounting are shared.
    Result<Attr> link(Ino ino, Ino new_parent, std::string_view new_name);
    // Removes one name; a node with other names keeps them (nlink drops).
    Status unlink(Ino parent, std::string_view name);
    Status rmdir(Ino parent, std::string_view name);
    // rename(2): replaces a target of the same kind (a directory only if empty:
    // ENOTEMPTY), EEXIST with kRenameNoReplace, EINVAL when moving a directory into
    // itself; two names of one node: nothing happens. A node with several names moves
    // only inside its entry, and so does a directory holding one (else EXDEV, see link). Moving a
    // subtree across entries moves its accounting with it; a file renamed into place populates its
    // entry (a miss) on behalf of `origin` (null: this process), replacing a file of an entry keeps
    // the entry (no miss).
    Status rename(Ino parent, std::string_view name, Ino new_parent, std::string_view new_name,
                  unsigned flags = 0, const Origin* origin = nullptr);
    Result<Attr> setattr(Ino ino, const SetAttr& changes);
    // Publishes the whole content of a regular file atomically: readers see the old
    // or the new content, never a mix. Identical content is stored once.
    Result<Attr> write(Ino file, std::string_view content, const Origin& origin);

    // Write leases mark a file, and so its entry, as having a write in flight
    // (eviction skips it). Leases are counted per (file, process), ignored once their
    // process is dead, and dropped with the file.
    Status begin_write(Ino file);
    Status end_write(Ino file);

    // Counts a hit on an entry: its hits, last hit and LRU position, the global hits.
    Status record_hit(Ino entry);
    Status set_pinned(Ino entry, bool pinned);
    // Removes an entry and its subtree now (EPERM if pinned, EBUSY if in flight,
    // unless `force`). Counts an eviction and logs an evict event.
    Status evict_entry(Ino entry, bool force = false);
    Status add(Counter c, std::uint64_t delta);
    Status reset_stats();
    Status set_config(const Config& config);

    Status commit();

  private:
    friend class Store;
    friend struct TxnAccess;
    WriteTxn(Store* store, MDB_txn* txn);
    std::unique_ptr<WriteState> m_state;
};

struct EvictRequest {
    std::optional<std::uint64_t> max_bytes;     // evict until stored bytes <= this
    std::optional<std::uint64_t> max_entries;   // evict until entries <= this
    std::optional<std::int64_t> older_than_ns;  // evict entries idle longer than this
};

struct EvictReport {
    std::uint64_t entries = 0;  // entries evicted
    std::uint64_t bytes = 0;    // their logical bytes
    std::uint64_t stored_bytes_freed = 0;
    std::uint64_t skipped_in_flight = 0;
    bool satisfied = true;  // false: bounds not reached (all left are busy/pinned)
};

class Store {
  public:
    // Opens (and with options.create, creates) the db. Fails with a message naming
    // the path and cause for a missing, corrupt, locked-for-compaction, newer-schema
    // or unwritable db. Clears reader slots left by dead processes.
    static Result<std::unique_ptr<Store>> open(const OpenOptions& options);
    ~Store();
    Store(const Store&) = delete;
    Store& operator=(const Store&) = delete;

    Result<ReadTxn> read() const;
    Result<WriteTxn> write();
    // Runs `fn` in a write transaction and commits if it succeeds.
    Status update(const std::function<Status(WriteTxn&)>& fn);

    // Evicts least-recently-used unpinned entries with no write in flight until every
    // bound of the request holds, in transactions of bounded size.
    Result<EvictReport> evict(const EvictRequest& request, const ProgressFn& progress = {});
    // Evicts down to the low marks if a configured bound (Config) is exceeded.
    Result<EvictReport> enforce_limits();

    Status sync();  // flushes to disk (meaningful with Durability::none/no_meta_sync)
    Result<std::uint64_t> clear_stale_readers();

    const std::string& path() const { return m_path; }
    bool read_only() const { return m_read_only; }
    std::int64_t now_ns() const { return m_clock ? m_clock() : system_clock_ns(); }
    std::uint64_t data_file_bytes() const;  // size of data.mdb on disk

    struct Impl;  // LMDB handles; defined in src/store_impl.hpp

  private:
    friend struct TxnAccess;  // core's implementation files reach Impl through it only
    Impl& impl() const { return *m_impl; }
    Store() = default;
    std::shared_ptr<Impl> m_impl;  // shared by every Store on this db in this process
    std::string m_path;
    bool m_read_only = false;
    Clock m_clock;
};

}  // namespace kcache::core
