#include "records.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace kcache::core::records {
namespace {

constexpr std::uint8_t kFormat = 1;

// A key's big-endian integer at `at`; 0 when the key is too short (records.hpp).
std::uint64_t key_be(std::string_view key, std::uint64_t at) {
    return ByteReader(key, "key").be_at<std::uint64_t>(at).value_or(0);
}

// A record that does not decode is a damaged db (kCorruptDb, kcache/core/integrity.hpp),
// as a page LMDB finds broken is: kcache-fsd sets such a db aside.
tl::unexpected<Error> corrupt(std::string_view what) {
    return fail(EUCLEAN, fmt::format("corrupt {} record", what));
}
// A record the reader could not read (too short, or bytes left over).
tl::unexpected<Error> corrupt(std::string_view what, const Error& why) {
    return fail(EUCLEAN, fmt::format("corrupt {} record: {}", what, why.message));
}

// Inodes and entries gained fields with schema 2 (layouts): format 2 appends them to
// format 1, which schema-1 dbs still hold and which decodes with their defaults.
constexpr std::uint8_t kLayoutFormat = 2;
bool known_layout(std::uint8_t version) {
    return version == kFormat || version == kLayoutFormat;
}
// Schema 4: an inode of a device appends its rdev to format 2 (every other inode is still
// written in format 2, so a db without devices keeps its records as they were).
constexpr std::uint8_t kDeviceFormat = 3;

}  // namespace

std::string stem_key(Ino parent, std::string_view stem) {
    return dirent_key(parent, stem);
}

std::string link_key(Ino node, Ino parent, std::string_view name) {
    std::string key = u64_key(node);
    key += u64_key(parent);
    key.append(name);
    return key;
}

LinkName decode_link_key(std::string_view key) {
    if (key.size() < 16) return {};
    return {u64_from_key(key.substr(8)), std::string(key.substr(16))};
}

std::string u64_key(std::uint64_t value) {
    std::string key;
    ByteWriter(key).be<std::uint64_t>(value);
    return key;
}

std::uint64_t u64_from_key(std::string_view key) {
    return key_be(key, 0);
}

std::string dirent_key(Ino parent, std::string_view name) {
    std::string key = u64_key(parent);
    key.append(name);
    return key;
}

std::string lru_key(std::int64_t time_ns, Ino entry) {
    std::string key = u64_key(static_cast<std::uint64_t>(time_ns));
    ByteWriter(key).be<std::uint64_t>(entry);
    return key;
}

std::string lease_key(Ino file, std::uint32_t pid) {
    std::string key = u64_key(file);
    ByteWriter(key).be<std::uint32_t>(pid);
    return key;
}

std::string digest_key(const Digest& digest) {
    std::string key = u64_key(digest.high);
    ByteWriter(key).be<std::uint64_t>(digest.low);
    return key;
}

Digest digest_from_key(std::string_view key) {
    if (key.size() < 16) return Digest{};  // too short (records.hpp): no digest
    return Digest{key_be(key, 0), key_be(key, 8)};
}

std::string counter_key(Counter counter) {
    std::string key;
    ByteWriter(key).be<std::uint32_t>(static_cast<std::uint32_t>(counter));
    return key;
}

Attr Inode::attr() const {
    Attr a;
    a.ino = ino;
    a.mode = mode;
    a.uid = uid;
    a.gid = gid;
    a.nlink = nlink;
    a.size = size;
    a.atime_ns = atime_ns;
    a.mtime_ns = mtime_ns;
    a.ctime_ns = ctime_ns;
    a.parent = parent;
    a.entry = entry;
    a.depth = depth;
    a.digest = digest;
    a.bookkeeping = bookkeeping;
    a.rdev = rdev;
    return a;
}

std::string encode(const Inode& n) {
    std::string out;
    out.reserve(96 + n.name.size() + n.target.size());
    Writer w(out);
    w.u8(n.rdev ? kDeviceFormat : kLayoutFormat);
    w.u32(n.mode);
    w.u32(n.uid);
    w.u32(n.gid);
    w.u32(n.nlink);
    w.u64(n.size);
    w.i64(n.atime_ns);
    w.i64(n.mtime_ns);
    w.i64(n.ctime_ns);
    w.u64(n.parent);
    w.u64(n.entry);
    w.u16(n.depth);
    w.u64(n.digest.high);
    w.u64(n.digest.low);
    w.str16(n.name);
    w.str16(n.target);
    w.u8(n.bookkeeping ? 1 : 0);
    if (n.rdev) w.u64(n.rdev);
    return out;
}

Result<Inode> decode_inode(Ino ino, std::string_view bytes) {
    ByteReader r(bytes, "inode");
    Inode n;
    n.ino = ino;
    std::uint8_t version = 0;
    std::uint8_t flags = 0;
    Status s = r.read(version, n.mode, n.uid, n.gid, n.nlink, n.size, n.atime_ns, n.mtime_ns,
                      n.ctime_ns, n.parent, n.entry, n.depth, n.digest.high, n.digest.low);
    if (s) s = str16(r, n.name);
    if (s) s = str16(r, n.target);
    if (s && (version == kLayoutFormat || version == kDeviceFormat)) s = r.read(flags);
    if (s && version == kDeviceFormat) s = r.read(n.rdev);
    if (s) s = r.expect_end();
    if (!s) return corrupt(fmt::format("inode {}", ino), s.error());
    n.bookkeeping = flags & 1;
    const std::uint32_t type = n.mode & S_IFMT;
    const bool known_type = type == S_IFREG || type == S_IFDIR || type == S_IFLNK ||
                            type == S_IFIFO || type == S_IFSOCK || type == S_IFCHR ||
                            type == S_IFBLK;
    // Format 3 holds a device's rdev, never 0: one encoding per inode (it re-encodes as read).
    const bool device = type == S_IFCHR || type == S_IFBLK;
    const bool rdev_ok = version != kDeviceFormat || (device && n.rdev != 0);
    if ((!known_layout(version) && version != kDeviceFormat) || (flags & ~1u) != 0 || !known_type ||
        !rdev_ok || n.name.size() > kMaxNameLength) {
        return corrupt(fmt::format("inode {}", ino));
    }
    return n;
}

std::string encode(const Dirent& d) {
    std::string out;
    Writer w(out);
    w.u64(d.child);
    w.u8(static_cast<std::uint8_t>(d.type));
    return out;
}

Result<Dirent> decode_dirent(std::string_view bytes) {
    ByteReader r(bytes, "directory entry");
    Dirent d;
    std::uint8_t type = 0;
    Status s = r.read(d.child, type);
    if (s) s = r.expect_end();
    if (!s) return corrupt("directory entry", s.error());
    if (d.child == 0 || type < 1 || type > 4) {
        return corrupt("directory entry");
    }
    d.type = static_cast<FileType>(type);
    return d;
}

std::uint64_t footprint(std::uint64_t stored_size) {
    constexpr std::uint64_t kPage = 4096, kPageHeader = 16, kNodeHeader = 8, kKey = 20;
    constexpr std::uint64_t kNodeMax = ((kPage - kPageHeader) / 2 & ~std::uint64_t{1}) - 2;  // 2038
    const std::uint64_t rest = stored_size % kChunkSize;  // empty content has no blob: 0
    std::uint64_t bytes = stored_size / kChunkSize * kPage;
    if (rest)
        bytes += kNodeHeader + kKey + rest <= kNodeMax ? kNodeHeader + kKey + 2 + rest : kPage;
    return bytes;
}

std::string chunk_key(const Digest& digest, std::uint32_t index) {
    std::string key = digest_key(digest);
    ByteWriter(key).be<std::uint32_t>(index);
    return key;
}

// Blob references gained the kind and dictionary with schema 4: format 2 appends them
// to format 1, which older dbs hold and which decodes as kind 0, no dictionary.
constexpr std::uint8_t kKindFormat = 2;

std::string encode(const BlobRef& b) {
    std::string out;
    Writer w(out);
    w.u8(kKindFormat);
    w.u64(b.refcount);
    w.u64(b.raw_size);
    w.u64(b.stored_size);
    w.u8(static_cast<std::uint8_t>(b.codec));
    if (b.codec == Codec::segments) w.u64(b.segment_footprint);
    w.u32(b.kind);
    w.u32(b.dictionary);
    return out;
}

Result<BlobRef> decode_blob_ref(std::string_view bytes) {
    ByteReader r(bytes, "blob reference");
    BlobRef b;
    std::uint8_t version = 0;
    std::uint8_t codec = 0;
    Status s = r.read(version, b.refcount, b.raw_size, b.stored_size, codec);
    if (s && codec == static_cast<std::uint8_t>(Codec::segments)) s = r.read(b.segment_footprint);
    if (s && version == kKindFormat) s = r.read(b.kind, b.dictionary);
    if (s) s = r.expect_end();
    if (!s) return corrupt("blob reference", s.error());
    if ((version != kFormat && version != kKindFormat) || codec > 2) {
        return corrupt("blob reference");
    }
    // Only a zstd frame can name a dictionary.
    if (b.dictionary != 0 && codec != static_cast<std::uint8_t>(Codec::zstd)) {
        return corrupt("blob reference");
    }
    b.codec = static_cast<Codec>(codec);
    return b;
}

std::string kind_key(std::uint32_t kind) {
    std::string key("K");
    ByteWriter(key).be<std::uint32_t>(kind);
    return key;
}

std::string kind_name_key(std::string_view name) {
    return "N" + std::string(name);
}

std::string dictionary_key(std::uint32_t id) {
    std::string key("D");
    ByteWriter(key).be<std::uint32_t>(id);
    return key;
}

std::string dictionary_chunk_key(std::uint32_t id, std::uint32_t index) {
    std::string key = dictionary_key(id);
    key[0] = 'B';
    ByteWriter(key).be<std::uint32_t>(index);
    return key;
}

std::string encode(const Kind& k) {
    std::string out;
    Writer w(out);
    w.u8(kFormat);
    w.str16(k.name);
    w.u64(k.blobs);
    w.u64(k.raw_bytes);
    w.u64(k.stored_bytes);
    w.u32(k.dictionary);
    w.u64(k.trained_at);
    return out;
}

Result<Kind> decode_kind(std::string_view bytes) {
    ByteReader r(bytes, "kind");
    Kind k;
    std::uint8_t version = 0;
    Status s = r.read(version);
    if (s) s = str16(r, k.name);
    if (s) s = r.read(k.blobs, k.raw_bytes, k.stored_bytes, k.dictionary, k.trained_at);
    if (s) s = r.expect_end();
    if (!s) return corrupt("kind", s.error());
    if (version != kFormat) return corrupt("kind");
    return k;
}

std::string encode(const Dictionary& d) {
    std::string out;
    Writer w(out);
    w.u8(kFormat);
    w.u32(d.kind);
    w.u64(d.users);
    w.u64(d.size);
    w.u64(d.samples);
    w.u64(d.sample_bytes);
    w.i64(d.created_ns);
    return out;
}

Result<Dictionary> decode_dictionary(std::string_view bytes) {
    ByteReader r(bytes, "dictionary");
    Dictionary d;
    std::uint8_t version = 0;
    Status s = r.read(version, d.kind, d.users, d.size, d.samples, d.sample_bytes, d.created_ns);
    if (s) s = r.expect_end();
    if (!s) return corrupt("dictionary", s.error());
    if (version != kFormat) return corrupt("dictionary");
    return d;
}

std::string encode(const EntryInfo& e) {
    std::string out;
    out.reserve(112 + e.name.size() + e.populated_by_name.size() + e.stem.size());
    Writer w(out);
    w.u8(kLayoutFormat);
    w.str16(e.name);
    w.u64(e.bytes);
    w.u64(e.stored_bytes);
    w.u64(e.files);
    w.i64(e.created_ns);
    w.i64(e.last_access_ns);
    w.i64(e.last_hit_ns);
    w.u64(e.hits);
    w.u8(static_cast<std::uint8_t>((e.pinned ? 1 : 0) | (e.populated ? 2 : 0)));
    w.u32(e.populated_by_pid);
    w.str16(e.populated_by_name);
    w.u8(static_cast<std::uint8_t>(e.producer));
    w.u8(static_cast<std::uint8_t>(e.kind));
    w.u8(e.by_rule ? 1 : 0);
    w.u64(e.parent);
    w.str16(e.stem);
    return out;
}

Result<EntryInfo> decode_entry(Ino ino, std::string_view bytes) {
    ByteReader r(bytes, "entry");
    EntryInfo e;
    e.ino = ino;
    std::uint8_t version = 0;
    std::uint8_t flags = 0;
    std::uint8_t rule = 0;
    Status s = r.read(version);
    if (s) s = str16(r, e.name);
    if (s)
        s = r.read(e.bytes, e.stored_bytes, e.files, e.created_ns, e.last_access_ns, e.last_hit_ns,
                   e.hits, flags, e.populated_by_pid);
    if (s) s = str16(r, e.populated_by_name);
    if (s) s = r.read(e.producer);
    if (s && version == kLayoutFormat) {
        s = r.read(e.kind, rule, e.parent);
        if (s) s = str16(r, e.stem);
    }
    if (s) s = r.expect_end();
    if (!s) return corrupt(fmt::format("entry {}", ino), s.error());
    e.pinned = flags & 1;
    e.populated = flags & 2;
    e.by_rule = rule & 1;
    const bool known_kind = e.kind == EntryKind::node || e.kind == EntryKind::stem;
    if (!known_layout(version) || (flags & ~3u) != 0 || (rule & ~1u) != 0 || !known_kind) {
        return corrupt(fmt::format("entry {}", ino));
    }
    return e;
}

std::string encode(const Event& e) {
    std::string out;
    Writer w(out);
    w.u8(kFormat);
    w.i64(e.time_ns);
    w.u8(static_cast<std::uint8_t>(e.kind));
    w.u64(e.entry);
    w.u64(e.parent);
    w.str16(e.name);
    return out;
}

Result<Event> decode_event(std::uint64_t seq, std::string_view bytes) {
    ByteReader r(bytes, "event");
    Event e;
    e.seq = seq;
    std::uint8_t version = 0;
    Status s = r.read(version, e.time_ns, e.kind, e.entry, e.parent);
    if (s) s = str16(r, e.name);
    if (s) s = r.expect_end();
    if (!s) return corrupt(fmt::format("event {}", seq), s.error());
    if (version != kFormat) return corrupt(fmt::format("event {}", seq));
    return e;
}

std::string encode(const Config& c) {
    std::string out;
    Writer w(out);
    w.u8(kLayoutFormat);
    w.u32(c.entry_depth);
    w.u64(c.max_bytes);
    w.u64(c.max_entries);
    w.u32(c.low_mark_percent);
    w.u64(c.max_events);
    w.str32(c.layout_rules);
    return out;
}

Result<Config> decode_config(std::string_view bytes) {
    ByteReader r(bytes, "config");
    Config c;
    std::uint8_t version = 0;
    Status s = r.read(version, c.entry_depth, c.max_bytes, c.max_entries, c.low_mark_percent,
                      c.max_events);
    if (s && version == kLayoutFormat) s = str32(r, c.layout_rules);
    if (s) s = r.expect_end();
    if (!s) return corrupt("config", s.error());
    if (!known_layout(version) || c.entry_depth == 0 || c.low_mark_percent > 100) {
        return corrupt("config");
    }
    return c;
}

std::string encode_u64(std::uint64_t value) {
    std::string out;
    Writer(out).u64(value);
    return out;
}

Result<std::uint64_t> decode_u64(std::string_view bytes, std::string_view what) {
    ByteReader r(bytes, what);
    auto v = r.u64();
    if (v && !r.at_end()) return corrupt(what, r.expect_end().error());
    if (!v) return corrupt(what, v.error());
    return *v;
}

Result<std::uint32_t> decode_u32(std::string_view bytes, std::string_view what) {
    ByteReader r(bytes, what);
    auto v = r.u32();
    if (v && !r.at_end()) return corrupt(what, r.expect_end().error());
    if (!v) return corrupt(what, v.error());
    return *v;
}

}  // namespace kcache::core::records
