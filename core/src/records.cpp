#include "records.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace kcache::core::records {
namespace {

constexpr std::uint8_t kFormat = 1;

void put_be(std::string& out, std::uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_be(std::string_view in, std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(in[at + i]);
    return v;
}

tl::unexpected<Error> corrupt(std::string_view what) {
    return fail(EIO, fmt::format("corrupt {} record", what));
}

// Checks the version byte and that the reader consumed exactly the record.
bool well_formed(Reader& r, std::uint8_t version) {
    return r.ok() && r.remaining() == 0 && version == kFormat;
}

// Inodes and entries gained fields with schema 2 (layouts): format 2 appends them to
// format 1, which schema-1 dbs still hold and which decodes with their defaults.
constexpr std::uint8_t kLayoutFormat = 2;
bool well_formed_layout(Reader& r, std::uint8_t version) {
    return r.ok() && r.remaining() == 0 && (version == kFormat || version == kLayoutFormat);
}

}  // namespace

std::string stem_key(Ino parent, std::string_view stem) { return dirent_key(parent, stem); }

std::string u64_key(std::uint64_t value) {
    std::string key;
    put_be(key, value, 8);
    return key;
}

std::uint64_t u64_from_key(std::string_view key) { return get_be(key, 0, 8); }

std::string dirent_key(Ino parent, std::string_view name) {
    std::string key = u64_key(parent);
    key.append(name);
    return key;
}

std::string lru_key(std::int64_t time_ns, Ino entry) {
    std::string key = u64_key(static_cast<std::uint64_t>(time_ns));
    put_be(key, entry, 8);
    return key;
}

std::string lease_key(Ino file, std::uint32_t pid) {
    std::string key = u64_key(file);
    put_be(key, pid, 4);
    return key;
}

std::string digest_key(const Digest& digest) {
    std::string key = u64_key(digest.high);
    put_be(key, digest.low, 8);
    return key;
}

Digest digest_from_key(std::string_view key) {
    return Digest{get_be(key, 0, 8), get_be(key, 8, 8)};
}

std::string counter_key(Counter counter) {
    std::string key;
    put_be(key, static_cast<std::uint32_t>(counter), 4);
    return key;
}

void Writer::str16(std::string_view s) {
    u16(static_cast<std::uint16_t>(s.size()));
    m_out.append(s);
}

void Writer::str32(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    m_out.append(s);
}

std::string_view Reader::take(std::size_t n) {
    if (!m_ok || n > m_in.size() - m_pos) {
        m_ok = false;
        return {};
    }
    std::string_view out = m_in.substr(m_pos, n);
    m_pos += n;
    return out;
}

std::uint64_t Reader::le(int n) {
    std::string_view b = take(static_cast<std::size_t>(n));
    if (b.empty()) return 0;
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[i]);
    return v;
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
    return a;
}

std::string encode(const Inode& n) {
    std::string out;
    out.reserve(96 + n.name.size() + n.target.size());
    Writer w(out);
    w.u8(kLayoutFormat);
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
    return out;
}

Result<Inode> decode_inode(Ino ino, std::string_view bytes) {
    Reader r(bytes);
    Inode n;
    n.ino = ino;
    std::uint8_t version = r.u8();
    n.mode = r.u32();
    n.uid = r.u32();
    n.gid = r.u32();
    n.nlink = r.u32();
    n.size = r.u64();
    n.atime_ns = r.i64();
    n.mtime_ns = r.i64();
    n.ctime_ns = r.i64();
    n.parent = r.u64();
    n.entry = r.u64();
    n.depth = r.u16();
    n.digest.high = r.u64();
    n.digest.low = r.u64();
    n.name = r.str16();
    n.target = r.str16();
    std::uint8_t flags = 0;
    if (version == kLayoutFormat) flags = r.u8();
    n.bookkeeping = flags & 1;
    const std::uint32_t type = n.mode & S_IFMT;
    if (!well_formed_layout(r, version) || (flags & ~1u) != 0 || (type != S_IFREG && type != S_IFDIR && type != S_IFLNK) ||
        n.name.size() > kMaxNameLength) {
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
    Reader r(bytes);
    Dirent d;
    d.child = r.u64();
    const std::uint8_t type = r.u8();
    if (!r.ok() || r.remaining() != 0 || d.child == 0 || type < 1 || type > 3) {
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
    if (rest) bytes += kNodeHeader + kKey + rest <= kNodeMax ? kNodeHeader + kKey + 2 + rest : kPage;
    return bytes;
}

std::string chunk_key(const Digest& digest, std::uint32_t index) {
    std::string key = digest_key(digest);
    put_be(key, index, 4);
    return key;
}

std::string encode(const BlobRef& b) {
    std::string out;
    Writer w(out);
    w.u8(kFormat);
    w.u64(b.refcount);
    w.u64(b.raw_size);
    w.u64(b.stored_size);
    w.u8(static_cast<std::uint8_t>(b.codec));
    if (b.codec == Codec::segments) w.u64(b.segment_footprint);
    return out;
}

Result<BlobRef> decode_blob_ref(std::string_view bytes) {
    Reader r(bytes);
    BlobRef b;
    std::uint8_t version = r.u8();
    b.refcount = r.u64();
    b.raw_size = r.u64();
    b.stored_size = r.u64();
    const std::uint8_t codec = r.u8();
    if (codec == static_cast<std::uint8_t>(Codec::segments)) b.segment_footprint = r.u64();
    if (!well_formed(r, version) || codec > 2) return corrupt("blob reference");
    b.codec = static_cast<Codec>(codec);
    return b;
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
    Reader r(bytes);
    EntryInfo e;
    e.ino = ino;
    std::uint8_t version = r.u8();
    e.name = r.str16();
    e.bytes = r.u64();
    e.stored_bytes = r.u64();
    e.files = r.u64();
    e.created_ns = r.i64();
    e.last_access_ns = r.i64();
    e.last_hit_ns = r.i64();
    e.hits = r.u64();
    const std::uint8_t flags = r.u8();
    e.pinned = flags & 1;
    e.populated = flags & 2;
    e.populated_by_pid = r.u32();
    e.populated_by_name = r.str16();
    e.producer = static_cast<Producer>(r.u8());
    std::uint8_t rule = 0;
    if (version == kLayoutFormat) {
        e.kind = static_cast<EntryKind>(r.u8());
        rule = r.u8();
        e.parent = r.u64();
        e.stem = r.str16();
    }
    e.by_rule = rule & 1;
    const bool known_kind = e.kind == EntryKind::node || e.kind == EntryKind::stem;
    if (!well_formed_layout(r, version) || (flags & ~3u) != 0 || (rule & ~1u) != 0 || !known_kind) {
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
    Reader r(bytes);
    Event e;
    e.seq = seq;
    std::uint8_t version = r.u8();
    e.time_ns = r.i64();
    e.kind = static_cast<EventKind>(r.u8());
    e.entry = r.u64();
    e.parent = r.u64();
    e.name = r.str16();
    if (!well_formed(r, version)) return corrupt(fmt::format("event {}", seq));
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
    Reader r(bytes);
    Config c;
    std::uint8_t version = r.u8();
    c.entry_depth = r.u32();
    c.max_bytes = r.u64();
    c.max_entries = r.u64();
    c.low_mark_percent = r.u32();
    c.max_events = r.u64();
    if (version == kLayoutFormat) c.layout_rules = r.str32();
    if (!well_formed_layout(r, version) || c.entry_depth == 0 || c.low_mark_percent > 100) {
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
    if (bytes.size() != 8) return corrupt(what);
    Reader r(bytes);
    return r.u64();
}

}  // namespace kcache::core::records
