// On-disk encoding of kcache's LMDB records and keys.
//
// Integer keys are big-endian so that LMDB's byte order is numeric order (cursor
// scans of dirents by parent, of the LRU by time, of events by sequence). Values are
// little-endian with a leading format version byte. Every decoder checks lengths:
// a damaged record is a kCorruptDb (EUCLEAN) error naming the record, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kcache/core/byte_reader.hpp"
#include "kcache/core/byte_writer.hpp"
#include "kcache/core/error.hpp"
#include "kcache/core/misses.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core::records {

// ---- keys -------------------------------------------------------------------
std::string u64_key(std::uint64_t value);  // 8 bytes, big-endian
// Key decoders read the key's first bytes (big-endian, through ByteReader); a key too
// short for them (only a damaged db holds one) decodes as 0, which is no inode, entry
// or digest of any record.
std::uint64_t u64_from_key(std::string_view key);           // key's first 8 bytes
std::string dirent_key(Ino parent, std::string_view name);  // parent + name
std::string lru_key(std::int64_t time_ns, Ino entry);       // time + entry
std::string lease_key(Ino file, std::uint32_t pid);         // file + pid
std::string digest_key(const Digest& digest);               // 16 bytes
Digest digest_from_key(std::string_view key);               // key's first 16 bytes
// A blob's stored bytes are kept in chunks of at most one LMDB page each: a value of
// several pages would need a contiguous run of free pages, which a churning cache's
// free list rarely has, so the file would keep growing. Single pages always fit.
inline constexpr std::size_t kChunkSize = 4080;                    // an overflow page's payload
std::string chunk_key(const Digest& digest, std::uint32_t index);  // digest + index
inline std::uint64_t chunk_count(std::uint64_t stored_size) {
    return (stored_size + kChunkSize - 1) / kChunkSize;
}
std::string counter_key(Counter counter);                 // 4 bytes, big-endian
std::string stem_key(Ino parent, std::string_view stem);  // parent + stem
// A further name of a node (schema 4): node + parent + name; links_prefix(node) is the
// prefix of all of them.
std::string link_key(Ino node, Ino parent, std::string_view name);
inline std::string links_prefix(Ino node) {
    return u64_key(node);
}
struct LinkName {
    Ino parent = 0;
    std::string name;
};
LinkName decode_link_key(std::string_view key);  // a key too short decodes as parent 0

// ---- values -----------------------------------------------------------------
// An inode. A node's first parent and name are kept here, so that its path can be found
// from its number; a file, symlink or special node linked under more names (nlink > 1,
// schema 4) has each further name in the `links` table (link_key), inside its entry.
struct Inode {
    Ino ino = 0;  // the key, not encoded in the value
    std::uint32_t mode = 0;
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    std::uint32_t nlink = 1;
    std::uint64_t size = 0;
    std::int64_t atime_ns = 0;
    std::int64_t mtime_ns = 0;
    std::int64_t ctime_ns = 0;
    Ino parent = 0;
    Ino entry = 0;
    std::uint16_t depth = 0;
    Digest digest;
    std::string name;
    std::string target;        // symlinks
    bool bookkeeping = false;  // layout.hpp: never forms or populates an entry
    std::uint64_t rdev = 0;    // devices; recorded only when not 0 (format 3)

    Attr attr() const;
};
std::string encode(const Inode& inode);
Result<Inode> decode_inode(Ino ino, std::string_view bytes);

struct Dirent {
    Ino child = 0;
    FileType type = FileType::regular;
};
std::string encode(const Dirent& dirent);
Result<Dirent> decode_dirent(std::string_view bytes);

// How a blob's bytes are stored. `segments` (schema 3): content of kSegmentedSize or
// more, stored as the list of its segments' digests (16 bytes each, digest_key form);
// each segment is a blob of its own, holding one reference per occurrence in a list.
enum class Codec : std::uint8_t { raw = 0, zstd = 1, segments = 2 };

struct BlobRef {
    std::uint64_t refcount = 0;
    std::uint64_t raw_size = 0;     // the content's size
    std::uint64_t stored_size = 0;  // bytes in blob_data (for segments: the list's)
    Codec codec = Codec::raw;
    std::uint64_t segment_footprint = 0;  // segments: the sum of its segments' footprints
    // Schema 4 (dictionaries.hpp): the file kind the blob was classified as (0: none:
    // segments, lists, blobs stored before schema 4 until `kcache gc` classifies them),
    // and the trained dictionary its zstd frame was compressed with (0: none; the
    // frame's own dictID names the same one).
    std::uint32_t kind = 0;
    std::uint32_t dictionary = 0;
};
std::string encode(const BlobRef& ref);
// Bytes a blob of `stored_size` occupies in data.mdb: each full chunk one page, a
// small last chunk its share of a leaf page (LMDB's layout for 4 KiB pages). This,
// not the byte count, is what the disk holds and the size bound counts.
std::uint64_t footprint(std::uint64_t stored_size);
// A blob's own pages (what Counter::stored_bytes sums over all blobs, each once).
inline std::uint64_t footprint(const BlobRef& ref) {
    return footprint(ref.stored_size);
}
// The pages behind a file of this content (what its entry's stored_bytes counts): for
// segmented content, its list and its segments.
inline std::uint64_t file_footprint(const BlobRef& ref) {
    return footprint(ref) + ref.segment_footprint;
}
// The raw bytes a blob adds to Counter::blob_raw_bytes: a list adds none of its own
// (its segments count theirs).
inline std::uint64_t raw_counted(const BlobRef& ref) {
    return ref.codec == Codec::segments ? 0 : ref.raw_size;
}
Result<BlobRef> decode_blob_ref(std::string_view bytes);

// ---- the dicts table (schema 4; dictionaries.hpp) ---------------------------------
// One table, four kinds of keys, each a one-byte tag and big-endian numbers:
//   'K' kind id (u32)             -> Kind         a file kind's accounting, its dictionary
//   'N' name                      -> kind id (u32, little-endian)
//   'D' dictionary id (u32)       -> Dictionary   who uses it
//   'B' dictionary id + chunk u32 -> bytes        the dictionary, in chunks of kChunkSize
std::string kind_key(std::uint32_t kind);
std::string kind_name_key(std::string_view name);
std::string dictionary_key(std::uint32_t id);
std::string dictionary_chunk_key(std::uint32_t id, std::uint32_t index);

struct Kind {
    std::string name;                // "triton/cubin-sm_90", dictionaries.hpp
    std::uint64_t blobs = 0;         // blobs of this kind
    std::uint64_t raw_bytes = 0;     // their raw sizes
    std::uint64_t stored_bytes = 0;  // their footprints
    std::uint32_t dictionary = 0;    // the one new blobs use (0: none yet)
    std::uint64_t trained_at = 0;    // raw_bytes when training was last tried (0: never)
};
std::string encode(const Kind& kind);
Result<Kind> decode_kind(std::string_view bytes);

struct Dictionary {
    std::uint32_t kind = 0;
    std::uint64_t users = 0;  // blobs compressed with it: it is kept while any is
    std::uint64_t size = 0;   // bytes, in 'B' chunks
    std::uint64_t samples = 0;
    std::uint64_t sample_bytes = 0;
    std::int64_t created_ns = 0;
};
std::string encode(const Dictionary& dictionary);
Result<Dictionary> decode_dictionary(std::string_view bytes);

std::string encode(const EntryInfo& entry);  // ino is the key, not encoded
Result<EntryInfo> decode_entry(Ino ino, std::string_view bytes);

std::string encode(const Event& event);  // seq is the key, not encoded
Result<Event> decode_event(std::uint64_t seq, std::string_view bytes);

std::string encode(const Config& config);
Result<Config> decode_config(std::string_view bytes);

std::string encode_u64(std::uint64_t value);  // 8 bytes, little-endian
Result<std::uint64_t> decode_u64(std::string_view bytes, std::string_view what);
Result<std::uint32_t> decode_u32(std::string_view bytes,
                                 std::string_view what);  // 4 bytes, little-endian

// ---- writing ---------------------------------------------------------------------
// Records, keys and the bundle format are written with kcache/core/byte_writer.hpp's
// ByteWriter, the mirror of the ByteReader that reads them back.
using Writer = ByteWriter;

// Reading is kcache/core/byte_reader.hpp's ByteReader (the one bounds-checked reader
// of records, bundles and the loader's parsers).
// A u16 / u32 length-prefixed string into `out`; all or nothing, as ByteReader's.
inline Status str16(ByteReader& r, std::string& out) {
    auto s = KCACHE_TRY(r.str16());
    out.assign(s);
    return {};
}
inline Status str32(ByteReader& r, std::string& out) {
    auto s = KCACHE_TRY(r.str32());
    out.assign(s);
    return {};
}

// Legacy shim for two callers outside this change (entries.cpp: a lease count,
// stats.cpp: a counter) that check the value's size (4, 8) before reading it; what they
// read is the ByteReader's. Out of range it yields 0: do not use it anywhere else (use
// ByteReader, decode_u32 or decode_u64), and replace those two calls with decode_u32 /
// decode_u64 when those files are next edited.
class Reader {
  public:
    explicit Reader(std::string_view in) : m_in(in, "value") {}
    std::uint32_t u32() { return m_in.u32().value_or(0); }
    std::uint64_t u64() { return m_in.u64().value_or(0); }

  private:
    ByteReader m_in;
};

// ---- the misses' tables (schema 4; kcache/core/misses.hpp; records_misses.cpp) ----
// `misses`: u64_key(seq) -> a classified Miss (format 2; format 1, before misses were
// explained across nodes, decodes without the compared host and namespace).
// `evictions`: an evicted or removed entry's name -> its Eviction, until the name is
// classified as a capacity miss. A damaged record of either is EIO (misses.hpp), not
// kCorruptDb: the classifier's tables are evidence, not the cache.
//
// A miss record keeps lines and values up to kMaxLineBytes: cut_line cuts a longer one
// to that, "..." at its end; names are cut to kMaxPathLength, the family to 1,000 bytes.
std::string cut_line(std::string_view line);
std::string encode(const Miss& miss);  // seq is the key, not encoded
Result<Miss> decode_miss(std::uint64_t seq, std::string_view bytes);

struct Eviction {
    std::uint64_t seq = 0;  // the evict or remove event's
    std::int64_t time_ns = 0;
    Ino entry = 0;
    EventKind why = EventKind::evict;  // evict or remove
};
std::string encode(const Eviction& eviction);
Result<Eviction> decode_eviction(std::string_view bytes);

}  // namespace kcache::core::records
