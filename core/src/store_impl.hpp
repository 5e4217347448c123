// Internals shared by the core's implementation files: the LMDB handles of a Store
// and Tx, the typed view of one transaction every operation is written against.
//
// The core in layers. A file calls only into files below it, never up: no call cycle
// between files (files on one line call none of each other).
//
//   commands   the public Txn / WriteTxn / Store methods: tree.cpp's (the namespace,
//              links), rename.cpp, eviction.cpp, staged.cpp, frames.cpp, holds.cpp,
//              training.cpp (training, gc's recompression), verify.cpp, bundle_*.cpp;
//              entries.cpp's (hits, pins, leases, write) and content_read.cpp's (reads) call
//              only their own layer and below
//   namespace  ops:: of tree.cpp (removal) -> placement.cpp -> links.cpp, xattrs.cpp
//   entries    ops:: of entries.cpp: entry records, stem entries, members, a file's
//              accounting in its entry, write_file, population, the LRU, leases
//   content    ops:: of content.cpp (storing blobs: addresses, references, compression)
//              -> content_read.cpp (reading them) -> dictionaries.cpp (kinds,
//              dictionaries, their accounting)
//   Tx         tx.cpp: typed access to the tables (records.hpp: their encodings)
//
// Transactions (txn.cpp; a commit calls entries.cpp's log_updates) and the environment
// (store.cpp) are opened by the commands.
#pragma once

#include <lmdb.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kcache/core/store.hpp"
#include "kcache/core/thread_annotations.hpp"
#include "lmdb.hpp"
#include "records.hpp"

struct ZSTD_CDict_s;  // zstd.h
struct ZSTD_DDict_s;

namespace kcache::core {

// A trained dictionary ready for zstd: both digested forms, made once per process
// (dictionaries.cpp).
struct LoadedDictionary {
    std::uint32_t id = 0;
    ZSTD_CDict_s* compress = nullptr;
    ZSTD_DDict_s* decompress = nullptr;
    LoadedDictionary() = default;
    LoadedDictionary(const LoadedDictionary&) = delete;
    LoadedDictionary& operator=(const LoadedDictionary&) = delete;
    ~LoadedDictionary();
};

struct DigestHash {
    std::size_t operator()(const Digest& d) const {
        return static_cast<std::size_t>(d.low ^ d.high);
    }
};

// One per LMDB environment per process: LMDB forbids opening an environment twice
// in one process (closing the second would drop the first's locks), so every Store
// on the same db shares one Impl (see the registry in store.cpp).
struct Store::Impl {
    MDB_env* env = nullptr;
    MDB_dbi inodes = 0;      // ino -> Inode
    MDB_dbi dirents = 0;     // parent + name -> Dirent
    MDB_dbi blob_refs = 0;   // digest -> BlobRef (small, rewritten on every refcount change)
    MDB_dbi blob_data = 0;   // digest -> stored bytes (written once; only gc recompresses)
    MDB_dbi entries = 0;     // entry ino -> EntryInfo
    MDB_dbi lru = 0;         // last access + entry ino -> "" (unpinned entries only)
    MDB_dbi leases = 0;      // file ino + pid -> write count (writes in flight)
    MDB_dbi stats = 0;       // counter id -> u64
    MDB_dbi events = 0;      // seq -> Event
    MDB_dbi meta = 0;        // name -> value
    MDB_dbi stems = 0;       // parent ino + stem -> stem entry id (schema 2)
    bool has_stems = false;  // false: a schema-1 db opened read-only (no stem entries)
    MDB_dbi dicts = 0;       // kinds and trained dictionaries (schema 4, records.hpp)
    bool has_dicts = false;  // false: an older db opened read-only (nothing classified)
    // Dictionaries loaded for compression and decompression, by id. An id is never
    // reused and a dictionary never changes, so an entry stays right for as long as
    // the process lives. `mutex` is a leaf: held only to find or add an entry.
    struct LoadedDictionaries {
        Mutex mutex;
        std::unordered_map<std::uint32_t, std::shared_ptr<const LoadedDictionary>> by_id
            GUARDED_BY(mutex);
    } dictionaries;
    // The config as last decoded (txn.cpp): a transaction reads the stored bytes (another
    // process may have changed them: WriteTxn::set_config) and decodes them only when
    // they differ from `bytes`, the first transaction of the environment and the first
    // after a change. `mutex` is a leaf: held only to compare the bytes and share `config`.
    struct DecodedConfig {
        Mutex mutex;
        std::string bytes GUARDED_BY(mutex);
        std::shared_ptr<const Config> config GUARDED_BY(mutex);
    } decoded_config;
    MDB_dbi links = 0;       // node ino + parent ino + name -> "" (further names; schema 4)
    bool has_links = false;  // false: an older db opened read-only (no node has two names)
    int lock_fd = -1;        // shared flock on kcache.lock: compaction takes it exclusively
    bool read_only = false;
    std::string path;

    // Schema 4 (misses.cpp): classified misses, evictions seen, family members.
    MDB_dbi misses = 0;       // populate seq -> Miss
    MDB_dbi evictions = 0;    // entry name (or its digest) -> when and why it went
    MDB_dbi families = 0;     // family + entry ino -> ""
    bool has_misses = false;  // false: a db before schema 4 opened read-only

    // Extended attributes (xattrs.hpp): inode + name -> value. Added to any db by the
    // first process that opens it for writing (no schema change: a program without it
    // ignores the table, and rows it leaves of removed inodes are only garbage: inode
    // numbers are never reused; `kcache verify` names them).
    MDB_dbi xattrs = 0;
    bool has_xattrs = false;  // false: a db without the table opened read-only

    ~Impl();
};

// Pending state of a write transaction: the first storage error poisons it. It also
// notes which entry records were written and which entries had events logged, so the
// commit can log `update` for the rest (ops::log_updates).
struct WriteState {
    std::optional<Error> poisoned;
    std::vector<Ino> written_entries;  // Tx::put_entry, in call order (may repeat)
    std::vector<Ino> logged_entries;   // Tx::log's entry, in call order (may repeat)
};

// Meta record names.
inline constexpr std::string_view kMetaSchema = "schema";
inline constexpr std::string_view kMetaConfig = "config";
inline constexpr std::string_view kMetaNextIno = "next_ino";
inline constexpr std::string_view kMetaNextEvent = "next_event";
inline constexpr std::string_view kMetaResetTime = "reset_ns";
inline constexpr std::string_view kMetaCreated = "created_ns";
inline constexpr std::string_view kMetaNextDictionary = "next_dictionary";
// zstd's dictionary ids below 32768 are reserved for a registrar; kcache's start there.
inline constexpr std::uint32_t kFirstDictionaryId = 32768;
inline constexpr std::string_view kMetaMissesSeq = "misses_seq";  // the classifier's position
inline constexpr std::string_view kMetaHoldPrefix = "hold/";      // holds.cpp: digest key -> count

// The typed view of one transaction. Read methods work on both kinds; write
// methods require `write` (a WriteTxn) and record the first storage error there.
class Tx {
  public:
    Tx(Store& owner, MDB_txn* handle, const Config& settings, WriteState* state);

    Store& store;
    Store::Impl& db;
    MDB_txn* txn;
    const Config& config;
    WriteState* write;

    std::int64_t now() const { return store.now_ns(); }

    // ---- raw access ----
    Result<std::optional<std::string_view>> get(MDB_dbi dbi, std::string_view key) const;
    Status put(MDB_dbi dbi, std::string_view key, std::string_view value);
    // Reserves `size` bytes for the value and returns where to write them.
    Result<char*> reserve(MDB_dbi dbi, std::string_view key, std::size_t size);
    Status del(MDB_dbi dbi, std::string_view key);  // a missing key is not an error
    // Calls fn(key, value) for keys starting with `prefix`, from `start` (>= prefix).
    Status scan(MDB_dbi dbi, std::string_view prefix, std::string_view start,
                const std::function<bool(std::string_view, std::string_view)>& fn) const;
    // scan() with a callback that can fail (a record that does not decode): `fn`
    // returns whether to go on, or an error, which ends the scan and is returned.
    Status scan_checked(
        MDB_dbi dbi, std::string_view prefix, std::string_view start,
        const std::function<Result<bool>(std::string_view, std::string_view)>& fn) const;
    // A storage failure: poisons the write transaction and returns the error.
    tl::unexpected<Error> storage_error(int rc, std::string_view what);

    // ---- typed access ----
    Result<records::Inode> inode(Ino ino) const;  // ENOENT if absent
    Status put_inode(const records::Inode& inode);
    // The directory `ino`: ENOENT when it is gone, ENOTDIR when it is not a directory.
    Result<records::Inode> directory(Ino ino) const;
    // A directory changed: its mtime and ctime are now, its link count moves by `nlink_delta`.
    Status touch_dir(records::Inode& dir, int nlink_delta);
    Result<std::optional<records::Dirent>> child(Ino parent, std::string_view name) const;
    Result<bool> has_children(Ino dir) const;
    // The children of `dir` in name order, collected (safe to modify the tree after).
    Result<std::vector<std::pair<std::string, records::Dirent>>> children(Ino dir) const;
    Result<std::optional<EntryInfo>> find_entry_record(Ino entry) const;
    Result<EntryInfo> entry(Ino entry) const;  // ENOENT if absent
    Status put_entry(const EntryInfo& entry);
    Result<std::optional<records::BlobRef>> blob_ref(const Digest& digest) const;
    Result<std::uint64_t> counter(Counter counter) const;
    Status add(Counter counter, std::int64_t delta);
    Status log(EventKind kind, Ino entry, Ino parent, std::string_view name);
    Result<Ino> next_ino();
    Result<std::string> path_of(Ino ino) const;  // path from the root
};

// Accessors for the implementation files (Txn's and Store's members are private).
struct TxnAccess {
    static Store::Impl& impl(const Store& store) { return store.impl(); }
    static Tx tx(const Txn& t) { return Tx(*t.m_store, t.m_txn, *t.m_config, nullptr); }
    static Tx tx(WriteTxn& t) { return Tx(*t.m_store, t.m_txn, *t.m_config, t.m_state.get()); }
};

inline Tx::Tx(Store& owner, MDB_txn* handle, const Config& settings, WriteState* state)
    : store(owner), db(TxnAccess::impl(owner)), txn(handle), config(settings), write(state) {}

// ---- operations implemented across the core's files, on a Tx, by layer (above) ----
namespace ops {

// ---- namespace: tree.cpp ----
// Removes the name `name` in `parent` of a node that has no children: with its last
// name the node, its content and accounting; a node with other names keeps them.
// `keep_entry`: a stem entry it leaves empty stays (a rename is replacing the file).
Status remove_node(Tx& tx, records::Inode& parent, const records::Inode& node,
                   std::string_view name, EventKind why, bool keep_entry = false);
// Removes `ino` (named `name` in `parent`) and everything below it: inodes, dirents,
// blob references and accounting. Entry records inside it are dropped with `why`.
Status remove_subtree(Tx& tx, Ino parent, std::string_view name, EventKind why);
// ---- namespace: placement.cpp ----
// Where a node named `name` in `parent` belongs (layout.hpp): inside an entry it joins
// it; in a container the layout rules say whether it forms an entry of its own (a
// directory), joins the entry of its stem (a file; the entry is made if new), or
// stays outside every entry.
struct Place {
    Ino entry = 0;             // the entry it joins; 0: none, or it forms its own
    bool forms_entry = false;  // a directory that is an entry
    bool bookkeeping = false;
    Producer producer = Producer::unknown;
    bool by_rule = false;
};
Result<Place> place(Tx& tx, const records::Inode& parent, std::string_view name, FileType type);
// Whether a node of `type` named `name` in `parent` would be in the entry `entry` (0:
// outside every entry) as place() would put it, without changing anything (no stem
// entry made, no fallback entry dissolved).
Result<bool> would_be_in(const Tx& tx, const records::Inode& parent, std::string_view name,
                         FileType type, Ino entry);
// A directory the depth fallback made an entry turns out to hold a compiler's cache
// (`name` of `type` is being made in it): it becomes a container and what it holds is
// placed again. `dir` is updated in place.
Status dissolve_if_container(Tx& tx, records::Inode& dir, std::string_view name, FileType type);
// After `moved` got its new parent and name, places it and its subtree again; a file
// that joins an entry populates it on behalf of `origin` (null: this process).
Status retag(Tx& tx, Ino moved, const Origin* origin);
// ---- namespace: links.cpp (schema 4: a node's further names, records::link_key) ----
// Removes `name` in `parent`, one of the several names of `node` (nlink > 1): the node
// keeps the others (its own parent and name pass to a further one when it was those).
// `why` evict: a stem entry's name is logged for the daemon to forget.
Status forget_name(Tx& tx, records::Inode& parent, const records::Inode& node,
                   std::string_view name, EventKind why);
// Moves `node`'s name `name` in `parent` to `new_name` in `new_parent` (free: the caller
// checked), for a node with several names.
Status move_name(Tx& tx, records::Inode& node, Ino parent, std::string_view name, Ino new_parent,
                 std::string_view new_name);
// Whether `ino` (a directory: anything below it) has a node with several names.
Result<bool> holds_linked_node(const Tx& tx, Ino ino);
// ---- namespace: xattrs.cpp ----
// Removes every extended attribute of `ino` (its inode is going).
Status drop_xattrs(Tx& tx, Ino ino);
// ---- entries: entries.cpp ----
// Makes `node` (a directory, or a file of a schema-1 db) an entry of its own.
Status create_entry_record(Tx& tx, const records::Inode& node,
                           Producer producer = Producer::unknown, bool by_rule = false);
// The stem entry `stem` of directory `parent`, made (empty) if it does not exist.
Result<Ino> stem_entry(Tx& tx, const records::Inode& parent, std::string_view stem,
                       Producer producer, bool by_rule);
Result<std::optional<Ino>> find_stem_entry(const Tx& tx, Ino parent, std::string_view stem);
// Calls fn(member) for the top nodes of an entry: its directory, or its stem's files.
Status for_each_member(const Tx& tx, const EntryInfo& entry,
                       const std::function<bool(const records::Inode&)>& fn);
// An entry's first published non-bookkeeping file populates it: one miss, one event.
Status populate(Tx& tx, EntryInfo& entry, const Origin& origin);
Status drop_entry_record(Tx& tx, Ino entry, EventKind why, Ino parent, std::string_view name);
// Where an event about `entry` points the daemon: the directory and the entry's name in it.
std::pair<Ino, std::string> event_target(const Tx& tx, const EntryInfo& entry);
// After `node` left stem entry `entry` (removed, or moved elsewhere): the entry goes
// when no file of it is left, unless `keep` (a rename replaces its file).
Status left_stem_entry(Tx& tx, Ino entry, const records::Inode& node, EventKind why, bool keep);
// Whether a file of `entry` is being written (a live process holds a write lease on it).
Result<bool> entry_in_flight(const Tx& tx, Ino entry);
Status move_in_lru(Tx& tx, EntryInfo& entry, std::int64_t new_time);
// Before a write transaction commits: one `update` event for each entry whose record it
// wrote (and that still exists) when it logged no event for that entry, so followers
// of the log see every change of an entry (a file published into a populated entry).
Status log_updates(Tx& tx);
Status drop_leases(Tx& tx, Ino file);  // the file is gone
// A file joins (`sign` +1) or leaves (-1) entry `entry`: its count, bytes and stored
// bytes; an entry left empty is unpopulated (its next store is a miss).
Status add_file_to_entry(Tx& tx, Ino entry, const records::Inode& file, int sign);
// Replaces `file`'s content: its blob (content.cpp's store_content), then its inode
// record, the statistics, its entry's accounting and population (the caller checked it
// is a regular file). `digests` must be digests_of(content).
struct ContentDigests;  // content.cpp
Result<Attr> write_file(Tx& tx, records::Inode& file, std::string_view content,
                        const ContentDigests& digests, const Origin& origin);
// ---- content: content.cpp ----
// What a new blob is stored for: the name of the file that brings it and its entry's
// producer; kind_for (dictionaries.cpp) classifies it.
struct BlobOwner {
    std::string_view name;
    Producer producer = Producer::unknown;
};
// The digests content is keyed by: its digest_of, and for segmented content (size of
// kSegmentedSize or more) its segments' digests, in order.
struct ContentDigests {
    Digest digest;
    std::vector<Digest> segments;
};
ContentDigests digests_of(std::string_view content);
// A blob's address (its key in blob_refs and blob_data) is the digest of its content
// (flat_digest_of; a segment list's: digest_of_segments) unless that address holds
// other bytes: XXH3 collisions can be constructed, so a store that finds a blob under
// its digest compares bytes (content.cpp) and deduplicates only onto the same bytes;
// content that collides is stored at its first alternative address (probe 1, 2, ...
// up to kMaxProbes) that is free or holds the same bytes. An alternative address is
// the XXH3-128 of the same bytes under a seed per probe, in a domain of its own (flat
// blobs, lists). The file's digest (Attr::digest) is then that address. Nothing
// records the probe: a read's content check (integrity.hpp) tries the digest, then
// the alternatives (only a blob that fails its digest costs more than one hash).
inline constexpr std::uint32_t kMaxProbes = 32;
Digest alternative_address(std::string_view bytes, std::uint32_t probe);  // a flat blob's
Digest alternative_list_address(const std::vector<Digest>& segments, std::uint32_t probe);
// Whether `address` is one of the addresses of the flat blob holding `pieces` (its
// bytes, in the pieces they are read in): its flat digest or an alternative address.
bool is_flat_address(const Digest& address, const std::vector<std::string_view>& pieces);
// Whether `address` is one of the addresses of the list of `segments`.
bool is_list_address(const Digest& address, const std::vector<Digest>& segments);
// Stores `stored` (the bytes of a new blob, as `ref` describes them) and its reference,
// with the statistics and its kind's and dictionary's accounting. A reference count of
// 0 is a blob no file holds yet (frames.hpp's offer_frame): the next write of its
// content takes it as its first reference.
Status put_blob(Tx& tx, const Digest& digest, std::string_view stored, const records::BlobRef& ref);
// One reference fewer; the last one frees the blob (and a list's segment references).
Status release_blob(Tx& tx, const Digest& digest);
// The blob side of replacing `file`'s content (`digests`: digests_of(content)): the
// content is placed at its address, the file's reference taken (deduplicated onto the
// same bytes, or stored as a blob of the file's kind) and the reference to its old
// content released. The caller (entries.cpp's write_file) records the rest.
struct StoredContent {
    Digest address;        // the file's new digest
    records::BlobRef ref;  // the blob that now holds its content
};
Result<StoredContent> store_content(Tx& tx, const records::Inode& file, std::string_view content,
                                    const ContentDigests& digests);
// `file` as a regular file whose content may be replaced: EISDIR, EINVAL otherwise.
Result<records::Inode> writable_file(const Tx& tx, Ino file);
// The zstd form of `content` when it saves space, else empty (content.cpp's rule):
// with `dictionary` when given (its id then in the frame).
std::string compressed_form(std::string_view content, const LoadedDictionary* dictionary = nullptr);
// ---- content: content_read.cpp ----
// Decompresses the zstd frame `stored` of blob `digest` into `raw` (sized to the
// content): with its dictionary when `ref` names one, which the frame must name too.
Status decompress(const Tx& tx, const Digest& digest, const records::BlobRef& ref,
                  std::string_view stored, std::string& raw);
Result<Content> read_blob(const Tx& tx, const Digest& digest, std::uint64_t size);
// Calls fn with the pieces of a blob's content in order: zero-copy views of raw
// chunks, decompressed blobs, a list's segments. Checks sizes and digests (a list's
// own and each segment's) before fn sees a piece of the blob or segment. A
// segment is never a list itself (`in_list`).
Status for_each_piece(const Tx& tx, const Digest& digest, std::uint64_t size,
                      const std::function<void(std::string_view)>& fn, bool in_list = false);
// The views of a blob's stored chunks, in order, their pages not yet touched (but for
// the header of each overflow page).
Result<std::vector<std::string_view>> chunk_views(const Tx& tx, const Digest& digest,
                                                  const records::BlobRef& ref);
// Asks the kernel to read ahead the map pages behind `pieces` (a blob's chunks).
void prefetch(const std::vector<std::string_view>& pieces);
// The raw content of a zstd blob.
Result<std::string> decompressed(const Tx& tx, const Digest& digest, const records::BlobRef& ref);
// The header of the overflow page a blob chunk (`key`, `value` of blob_data) lives on, if
// it lives on one: kCorruptDb when it is not the page's own (content_read.cpp).
Status check_chunk_page(const Tx& tx, std::string_view key, std::string_view value);
// A segmented blob's segment digests, in order; nullopt for a blob stored whole.
Result<std::optional<std::vector<Digest>>> segment_list(const Tx& tx, const Digest& digest);
// A blob's bytes as stored (compressed or not), zero-copy when they fit one chunk.
// Not for Codec::segments (its stored bytes are a list, not content).
Result<Content> stored_form(const Tx& tx, const Digest& digest, const records::BlobRef& ref);
// ---- content: dictionaries.cpp (dictionaries.hpp) ----
// The kind record `id`; nullopt when there is none.
Result<std::optional<records::Kind>> find_kind(const Tx& tx, std::uint32_t id);
// Every kind record, by id (none on a db without the dicts table).
Result<std::map<std::uint32_t, records::Kind>> all_kinds(const Tx& tx);
// The record of dictionary `id`; nullopt when there is none.
Result<std::optional<records::Dictionary>> find_dictionary(const Tx& tx, std::uint32_t id);
// Deletes dictionary `id` (its record `d`) and its bytes.
Status drop_dictionary(Tx& tx, std::uint32_t id, const records::Dictionary& d);
// The zstd dictionary `bytes` digested for compression and decompression, as id `id`;
// null when zstd refuses them.
std::shared_ptr<LoadedDictionary> make_loaded(std::uint32_t id, std::string_view bytes);
// The kind of a new blob of `owner` with `content` (made if new); 0 on a db without the
// dicts table (an older db opened read-only).
Result<std::uint32_t> kind_for(Tx& tx, const BlobOwner& owner, std::string_view content);
// The dictionary `kind`'s new blobs are compressed with; null when it has none.
Result<std::shared_ptr<const LoadedDictionary>> current_dictionary(const Tx& tx,
                                                                   std::uint32_t kind);
// Dictionary `id`, loaded once per process (EIO when the db lacks it).
Result<std::shared_ptr<const LoadedDictionary>> load_dictionary(const Tx& tx, std::uint32_t id);
// Dictionary `id`'s bytes as stored; nullopt when the db has no such dictionary.
Result<std::optional<std::string>> stored_dictionary(const Tx& tx, std::uint32_t id);
// Stores the zstd dictionary `bytes` of `kind` under the next id (ids are never reused),
// written into `bytes` (4..8) as zstd wants it, with no users yet: the id.
Result<std::uint32_t> store_dictionary(Tx& tx, std::uint32_t kind, std::string& bytes,
                                       std::uint64_t samples, std::uint64_t sample_bytes);
// Dictionary `id` becomes `kind`'s current one if the kind has none.
Status adopt_dictionary(Tx& tx, std::uint32_t kind, std::uint32_t id);
// A blob of `ref` was stored (+1) or dropped (-1): its kind's accounting and its
// dictionary's users follow; a replaced dictionary goes with its last user.
Status account_blob(Tx& tx, const records::BlobRef& ref, int sign);
// The bytes a blob `ref` occupies, replaced by `stored` (zstd with `dictionary`), in
// place: same digest, same content. Returns the new reference (the caller fixes the
// stored bytes of entries whose files hold it).
Result<records::BlobRef> rewrite_blob(Tx& tx, const Digest& digest, const records::BlobRef& ref,
                                      std::string_view stored, std::uint32_t dictionary);
}  // namespace ops

}  // namespace kcache::core
