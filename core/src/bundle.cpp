// The bundle: entries exported to one file, imported only after all of it checks out.
//
// Layout (all integers little-endian):
//   header   "KCBUNDL1" u32 format (3; 2 is read too: its files of 1 MiB or more carry
//            flat digests (flat_digest_of); 1 also: it had no entry kind either)
//   records  'E' str16 entry-path u8 kind               an entry starts (kind: EntryKind)
//            'N' str16 path u8 type u32 mode i64 mtime  a node of the current entry:
//                file:    u64 raw-size u64 digest-high u64 digest-low u8 codec str32 bytes
//                symlink: str16 target
//   trailer  'Z' u64 entries u64 nodes, then 16 bytes: XXH3-128 of everything before them
// Paths are relative to the cache root, at any depth. A node entry's nodes are its
// node first, then the nodes below it in depth-first order, each path under the
// entry's path. A stem entry (path: its directory and stem) has its files, each a
// sibling named with the stem, and nothing below them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>
#include <xxhash.h>
#include <zstd.h>

#include "kcache/core/bundle.hpp"
#include "kcache/core/byte_reader.hpp"
#include "kcache/core/names.hpp"
#include "store_impl.hpp"

namespace kcache::core {
using records::Codec;

namespace {

constexpr std::string_view kMagic = "KCBUNDL1";
constexpr std::uint32_t kFormat = 3;
constexpr std::uint32_t kFormatFlatDigests = 2;  // files of any size digested flat
constexpr std::uint32_t kFormatNodeEntries = 1;  // before stem entries
// Longest path a bundle record holds (str16). Longer than kMaxPathLength: the tree has
// no path limit (clients build deep trees with openat), so neither has export/import.
constexpr std::size_t kMaxBundlePath = 0xffff;

struct HashState {
    XXH3_state_t* state = XXH3_createState();
    HashState() { XXH3_128bits_reset(state); }
    ~HashState() { XXH3_freeState(state); }
    void update(const void* p, std::size_t n) { XXH3_128bits_update(state, p, n); }
    Digest digest() const {
        const XXH128_hash_t h = XXH3_128bits_digest(state);
        return {h.high64, h.low64};
    }
};

struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// ---- writing ----------------------------------------------------------------------

class BundleWriter {
  public:
    BundleWriter(std::FILE* out, std::string path) : m_out(out), m_path(std::move(path)) {}
    Status put(std::string_view bytes) {
        if (bytes.empty()) return {};  // (an empty view may have no data pointer at all)
        m_hash.update(bytes.data(), bytes.size());
        if (std::fwrite(bytes.data(), 1, bytes.size(), m_out) != bytes.size()) {
            return fail(errno ? errno : EIO,
                        fmt::format("{}: write failed: {}", m_path, std::strerror(errno)));
        }
        m_written += bytes.size();
        return {};
    }
    Status finish(std::uint64_t entries, std::uint64_t nodes) {
        std::string trailer;
        records::Writer w(trailer);
        w.u8('Z');
        w.u64(entries);
        w.u64(nodes);
        if (auto s = put(trailer); !s) return s;
        const Digest d = m_hash.digest();
        std::string sum;
        records::Writer(sum).u64(d.high);
        records::Writer(sum).u64(d.low);
        if (std::fwrite(sum.data(), 1, sum.size(), m_out) != sum.size()) {
            return fail(errno ? errno : EIO,
                        fmt::format("{}: write failed: {}", m_path, std::strerror(errno)));
        }
        m_written += sum.size();
        return {};
    }
    std::uint64_t written() const { return m_written; }

  private:
    std::FILE* m_out;
    std::string m_path;
    HashState m_hash;
    std::uint64_t m_written = 0;
};

// Writes one node record and, for a directory, pushes its children.
Status export_node(const Tx& tx, BundleWriter& out, Ino ino, const std::string& path,
                   ExportReport& report) {
    auto node = tx.inode(ino);
    if (!node) return tl::unexpected(node.error());
    if (path.size() > kMaxBundlePath) {  // str16 would truncate its length
        return fail(ENAMETOOLONG,
                    fmt::format("'{}...': path too long for a bundle", path.substr(0, 64)));
    }
    std::string rec;
    records::Writer w(rec);
    w.u8('N');
    w.str16(path);
    const Attr attr = node->attr();
    w.u8(static_cast<std::uint8_t>(attr.type()));
    w.u32(node->mode);
    w.i64(node->mtime_ns);
    if (attr.is_regular()) {
        Content stored_content;
        Codec codec = Codec::raw;
        if (!node->digest.empty()) {
            auto r = tx.blob_ref(node->digest);
            if (!r) return tl::unexpected(r.error());
            if (!*r) return fail(EIO, fmt::format("blob of '{}' is missing", path));
            codec = (*r)->codec;
            if (codec == Codec::segments) {
                // Segments stay in the db: the bundle carries the content, compressed
                // whole when that saves space.
                auto raw = ops::read_blob(tx, node->digest, node->size);
                if (!raw) return tl::unexpected(with_context(raw.error(), path));
                std::string compressed = ops::compressed_form(raw->bytes());
                codec = compressed.empty() ? Codec::raw : Codec::zstd;
                stored_content =
                    compressed.empty() ? std::move(*raw) : Content::owned(std::move(compressed));
            } else {
                auto data = ops::stored_form(tx, node->digest, **r);
                if (!data) return tl::unexpected(with_context(data.error(), path));
                stored_content = std::move(*data);
            }
        }
        const std::string_view stored = stored_content.bytes();
        w.u64(node->size);
        w.u64(node->digest.high);
        w.u64(node->digest.low);
        w.u8(static_cast<std::uint8_t>(codec));
        w.u32(static_cast<std::uint32_t>(stored.size()));
        if (auto s = out.put(rec); !s) return s;
        if (auto s = out.put(stored); !s) return s;  // no copy of the content
        ++report.files;
        report.bytes += node->size;
        return {};
    }
    if (attr.is_symlink()) w.str16(node->target);
    return out.put(rec);
}

Status export_entry(const Tx& tx, BundleWriter& out, const EntryInfo& entry, ExportReport& report,
                    std::uint64_t& nodes) {
    std::string rec;
    records::Writer w(rec);
    w.u8('E');
    w.str16(entry.name);
    w.u8(static_cast<std::uint8_t>(entry.kind));
    if (auto s = out.put(rec); !s) return s;
    const auto slash = entry.name.rfind('/');
    const std::string dir =
        slash == std::string::npos ? std::string() : entry.name.substr(0, slash + 1);
    std::vector<std::pair<Ino, std::string>> work;
    auto listed = ops::for_each_member(tx, entry, [&](const records::Inode& member) {
        work.emplace_back(member.ino,
                          entry.kind == EntryKind::node ? entry.name : dir + member.name);
        return true;
    });
    if (!listed) return listed;
    std::reverse(work.begin(), work.end());  // name order on pop
    while (!work.empty()) {
        auto [ino, path] = std::move(work.back());
        work.pop_back();
        if (auto s = export_node(tx, out, ino, path, report); !s) return s;
        ++nodes;
        auto children = tx.children(ino);
        if (!children) return tl::unexpected(children.error());
        for (auto it = children->rbegin(); it != children->rend(); ++it) {  // name order on pop
            work.emplace_back(it->second.child, path + "/" + it->first);
        }
    }
    return {};
}

// ---- reading ----------------------------------------------------------------------

// Streams a bundle, hashing what it reads; every length is checked against what is
// left in the file before anything is allocated for it. Each piece read from the file
// is decoded by a ByteReader (kcache/core/byte_reader.hpp); reading past the end of the
// file is that reader's error ("<path>: 8 bytes at offset 120 run past the end (123
// bytes)"), with EINVAL, the code of every invalid bundle.
class BundleReader {
  public:
    static Result<BundleReader> open(const std::string& path) {
        BundleReader r;
        r.m_path = path;
        r.m_file.reset(std::fopen(path.c_str(), "rb"));
        if (!r.m_file) return fail(errno, fmt::format("{}: {}", path, std::strerror(errno)));
        struct stat st {};
        if (fstat(fileno(r.m_file.get()), &st) != 0 || !S_ISREG(st.st_mode)) {
            return fail(EINVAL, fmt::format("{}: not a regular file", path));
        }
        r.m_size = static_cast<std::uint64_t>(st.st_size);
        return r;
    }
    // The next `n` bytes of the file, owned (file contents: no second copy).
    Result<std::string> bytes(std::uint64_t n, bool hashed = true) {
        if (n > m_size - m_pos) return invalid(past_end_error(m_path, m_pos, n, m_size));
        std::string out(static_cast<std::size_t>(n), '\0');
        if (const std::size_t got = std::fread(out.data(), 1, out.size(), m_file.get());
            got != out.size()) {
            // The file shrank while being read (or the read failed): it ends sooner.
            return invalid(past_end_error(m_path, m_pos, n, m_pos + got));
        }
        if (hashed && !out.empty()) m_hash->update(out.data(), out.size());
        m_pos += n;
        return out;
    }
    // Reads each field in turn (ByteReader::read) from the next bytes of the file.
    template <class... Ts>
    Status read(Ts&... fields) {
        return read_from(true, fields...);
    }
    template <class... Ts>
    Status read_unhashed(Ts&... fields) {
        return read_from(false, fields...);
    }
    // A u16 length, then that many bytes.
    Result<std::string> str16() {
        std::uint16_t n = 0;
        if (auto s = read(n); !s) return tl::unexpected(s.error());
        return bytes(n);
    }
    tl::unexpected<Error> bad(std::string_view why) const {
        return fail(EINVAL, fmt::format("{}: invalid bundle at byte {}: {}", m_path, m_pos, why));
    }
    Digest digest() const { return m_hash->digest(); }
    std::uint64_t pos() const { return m_pos; }
    std::uint64_t size() const { return m_size; }

  private:
    BundleReader() = default;
    static tl::unexpected<Error> invalid(Error e) { return fail(EINVAL, std::move(e.message)); }
    template <class... Ts>
    Status read_from(bool hashed, Ts&... fields) {
        constexpr std::uint64_t total = (std::uint64_t{0} + ... + sizeof(Ts));
        const std::uint64_t at = m_pos;
        auto piece = bytes(total, hashed);
        if (!piece) return tl::unexpected(piece.error());
        m_piece = std::move(*piece);
        if (auto s = ByteReader(m_piece, m_path, at).read(fields...); !s) return invalid(s.error());
        return {};
    }
    std::string m_path;
    File m_file;
    std::unique_ptr<HashState> m_hash = std::make_unique<HashState>();
    std::uint64_t m_size = 0;
    std::uint64_t m_pos = 0;
    std::string m_piece;  // the fields read last
};

struct BundleNode {
    std::string path;
    FileType type = FileType::regular;
    std::uint32_t mode = 0;
    std::int64_t mtime_ns = 0;
    std::string content;  // raw (decompressed and digest-checked) for files
    std::string target;   // symlinks
};

// Parses the whole bundle, calling on_entry / on_node for each record; fails on the
// first malformed record, wrong digest or a bad checksum.
Status parse_bundle(const std::string& path,
                    const std::function<Status(const std::string&, EntryKind)>& on_entry,
                    const std::function<Status(const BundleNode&)>& on_node,
                    const ProgressFn& progress) {
    auto opened = BundleReader::open(path);
    if (!opened) return tl::unexpected(opened.error());
    BundleReader& in = *opened;
    auto magic = in.bytes(kMagic.size());
    if (!magic || *magic != kMagic)
        return fail(EINVAL, fmt::format("{}: not a kcache bundle", path));
    std::uint32_t format = 0;
    if (auto s = in.read(format); !s) return s;
    if (format != kFormat && format != kFormatFlatDigests && format != kFormatNodeEntries) {
        return in.bad(fmt::format("unsupported format {}", format));
    }

    std::string entry;  // current entry path
    EntryKind kind = EntryKind::node;
    std::string stem_dir, stem;  // stem entries: "dir/" and the stem
    std::uint64_t entries = 0, nodes = 0;
    std::unordered_map<std::string, FileType> seen;  // paths of this entry
    for (;;) {
        std::uint8_t tag = 0;
        if (auto s = in.read(tag); !s) return s;
        if (tag == 'Z') break;
        if (tag == 'E') {
            auto name = in.str16();
            if (!name) return tl::unexpected(name.error());
            if (auto s = check_path(*name, kMaxBundlePath); !s)
                return in.bad("refused " + s.error().message);
            kind = EntryKind::node;
            if (format >= kFormatFlatDigests) {
                std::uint8_t k = 0;
                if (auto s = in.read(k); !s) return s;
                if (k > static_cast<std::uint8_t>(EntryKind::stem))
                    return in.bad("unknown entry kind");
                kind = static_cast<EntryKind>(k);
            }
            entry = std::move(*name);
            const auto slash = entry.rfind('/');
            stem_dir = slash == std::string::npos ? std::string() : entry.substr(0, slash + 1);
            stem = entry.substr(stem_dir.size());
            seen.clear();
            ++entries;
            if (auto s = on_entry(entry, kind); !s) return s;
            continue;
        }
        if (tag != 'N' || entry.empty()) return in.bad("unexpected record");
        BundleNode node;
        auto p = in.str16();
        if (!p) return tl::unexpected(p.error());
        node.path = std::move(*p);
        std::uint8_t type = 0;
        if (auto s = in.read(type, node.mode, node.mtime_ns); !s) return s;
        if (type < 1 || type > 3) return in.bad("unknown node type");
        node.type = static_cast<FileType>(type);
        if (auto s = check_path(node.path, kMaxBundlePath); !s)
            return in.bad("refused " + s.error().message);
        // A node entry's node first, then nodes whose parent came before in this entry;
        // a stem entry's files, siblings named with its stem.
        const bool stem_file = kind == EntryKind::stem && node.type != FileType::directory &&
                               node.path.size() > stem_dir.size() &&
                               node.path.compare(0, stem_dir.size(), stem_dir) == 0 &&
                               node.path.find('/', stem_dir.size()) == std::string::npos &&
                               node.path.compare(stem_dir.size(), stem.size(), stem) == 0;
        if (kind == EntryKind::stem) {
            if (!stem_file || seen.count(node.path)) {
                return in.bad(
                    fmt::format("node '{}' is not a file of stem entry '{}'", node.path, entry));
            }
        } else if (seen.empty() ? node.path != entry : false) {
            return in.bad("entry must start with its own node");
        } else if (!seen.empty()) {
            const std::string parent = node.path.substr(0, node.path.rfind('/'));
            auto it = seen.find(parent);
            if (node.path.substr(0, entry.size() + 1) != entry + "/" || it == seen.end() ||
                it->second != FileType::directory || seen.count(node.path)) {
                return in.bad(fmt::format("node '{}' is not under a directory of entry '{}'",
                                          node.path, entry));
            }
        }
        seen.emplace(node.path, node.type);
        if (node.type == FileType::regular) {
            std::uint64_t raw_size = 0;
            Digest declared;
            std::uint8_t codec = 0;
            std::uint32_t stored_len = 0;
            if (auto s = in.read(raw_size, declared.high, declared.low, codec, stored_len); !s)
                return s;
            auto stored = in.bytes(stored_len);
            if (!stored) return tl::unexpected(stored.error());
            if (codec == static_cast<std::uint8_t>(Codec::zstd)) {
                if (raw_size > in.size() * 1024 + (1u << 20))
                    return in.bad("implausible file size");
                node.content.assign(raw_size, '\0');
                const std::size_t n = ZSTD_decompress(node.content.data(), node.content.size(),
                                                      stored->data(), stored->size());
                if (ZSTD_isError(n) || n != raw_size)
                    return in.bad(fmt::format("'{}' does not decompress", node.path));
            } else if (codec == static_cast<std::uint8_t>(Codec::raw)) {
                node.content = std::move(*stored);
            } else {
                return in.bad("unknown codec");
            }
            const Digest digest =
                format >= kFormat ? digest_of(node.content) : flat_digest_of(node.content);
            if (node.content.size() != raw_size || !(digest == declared)) {
                return in.bad(fmt::format("content of '{}' does not match its digest", node.path));
            }
        } else if (node.type == FileType::symlink) {
            auto target = in.str16();
            if (!target) return tl::unexpected(target.error());
            if (target->empty()) return in.bad("empty symlink target");
            if (auto s = check_link_target(node.path, *target); !s) {
                return in.bad("refused " + s.error().message);
            }
            node.target = std::move(*target);
        }
        ++nodes;
        if (auto s = on_node(node); !s) return s;
        if (progress) progress(in.pos(), in.size());
    }
    std::uint64_t count_entries = 0, count_nodes = 0;
    if (auto s = in.read(count_entries, count_nodes); !s) return s;
    const Digest computed = in.digest();
    Digest stored;
    if (auto s = in.read_unhashed(stored.high, stored.low); !s) return s;
    if (!(stored == computed))
        return fail(EINVAL, fmt::format("{}: checksum mismatch: the bundle is damaged", path));
    if (count_entries != entries || count_nodes != nodes)
        return in.bad("record counts do not match");
    if (in.pos() != in.size()) return in.bad("trailing bytes after the checksum");
    return {};
}

}  // namespace

Result<ExportReport> export_bundle(const Store& store, const std::vector<std::string>& names,
                                   const std::string& out_path, const ProgressFn& progress) {
    auto txn = store.read();
    if (!txn) return tl::unexpected(txn.error());
    std::vector<EntryInfo> selected;
    if (names.empty()) {
        auto s = txn->for_each_entry([&](const EntryInfo& e) {
            selected.push_back(e);
            return true;
        });
        if (!s) return tl::unexpected(s.error());
    } else {
        for (const auto& name : names) {
            auto e = txn->find_entry(name);
            if (!e) return tl::unexpected(with_context(e.error(), "export"));
            selected.push_back(std::move(*e));
        }
    }
    const std::string tmp = fmt::format("{}.tmp.{}", out_path, getpid());
    File out(std::fopen(tmp.c_str(), "wb"));
    if (!out) return fail(errno, fmt::format("{}: {}", out_path, std::strerror(errno)));
    auto cleanup = [&](Error e) {
        out.reset();
        std::remove(tmp.c_str());
        return tl::unexpected(std::move(e));
    };
    BundleWriter writer(out.get(), out_path);
    std::string header(kMagic);
    records::Writer(header).u32(kFormat);
    if (auto s = writer.put(header); !s) return cleanup(s.error());
    ExportReport report;
    std::uint64_t nodes = 0;
    Tx tx = TxnAccess::tx(*txn);
    for (const auto& entry : selected) {
        if (auto s = export_entry(tx, writer, entry, report, nodes); !s) return cleanup(s.error());
        ++report.entries;
        if (progress) progress(report.entries, selected.size());
    }
    if (auto s = writer.finish(report.entries, nodes); !s) return cleanup(s.error());
    if (std::fflush(out.get()) != 0 || fsync(fileno(out.get())) != 0) {
        return cleanup({errno, fmt::format("{}: {}", out_path, std::strerror(errno))});
    }
    out.reset();
    if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
        return cleanup({errno, fmt::format("{}: {}", out_path, std::strerror(errno))});
    }
    report.bundle_bytes = writer.written();
    return report;
}

Result<ImportReport> import_bundle(Store& store, const std::string& path, bool replace,
                                   const ProgressFn& progress) {
    // Pass 1: validate everything; nothing is written.
    auto noop_entry = [](const std::string&, EntryKind) -> Status { return {}; };
    auto noop_node = [](const BundleNode&) -> Status { return {}; };
    if (auto s = parse_bundle(path, noop_entry, noop_node, progress); !s) {
        return tl::unexpected(s.error());
    }
    // Pass 2: write all of it in one transaction (aborted as a whole on any error).
    auto txn = store.write();
    if (!txn) return tl::unexpected(txn.error());
    ImportReport report;
    const Origin origin = Origin::current();
    bool skipping = false;
    std::unordered_map<std::string, Ino> made;  // path -> ino within the current entry
    EntryKind kind = EntryKind::node;
    auto on_entry = [&](const std::string& entry, EntryKind entry_kind) -> Status {
        made.clear();
        skipping = false;
        kind = entry_kind;
        auto existing = txn->find_entry(entry);
        if (existing) {
            if (!replace) {
                skipping = true;
                ++report.entries_skipped;
                return {};
            }
            Tx tx = TxnAccess::tx(*txn);
            std::vector<std::pair<Ino, std::string>> members;
            auto listed = ops::for_each_member(tx, *existing, [&](const records::Inode& member) {
                members.emplace_back(member.parent, member.name);
                return true;
            });
            if (!listed) return listed;
            for (const auto& [parent, name] : members) {
                if (auto s = ops::remove_subtree(tx, parent, name, EventKind::remove); !s) return s;
            }
            ++report.entries_replaced;
        } else if (existing.error().code != ENOENT) {
            return tl::unexpected(existing.error());
        } else {
            // A node of that name that is not an entry (e.g. a plain file) is in the way.
            auto ino = txn->resolve(entry);
            if (ino) return fail(EEXIST, fmt::format("'{}' exists and is not an entry", entry));
            ++report.entries_added;
        }
        if (auto s = txn->add(Counter::imported_entries, 1); !s) return s;
        return {};
    };
    auto on_node = [&](const BundleNode& node) -> Status {
        if (skipping) return {};
        const std::size_t slash = node.path.rfind('/');
        Ino parent;
        const bool top =
            made.empty() || kind == EntryKind::stem;  // an entry's own node, or a stem file
        if (top) {
            // The directories above the entry (entry depth > 1), like mkdir -p.
            auto p = txn->mkdirs(slash == std::string::npos
                                     ? std::string_view()
                                     : std::string_view(node.path).substr(0, slash));
            if (!p) return tl::unexpected(p.error());
            parent = *p;
        } else {
            parent = made.at(node.path.substr(0, slash));
        }
        const std::string_view name = slash == std::string::npos
                                          ? std::string_view(node.path)
                                          : std::string_view(node.path).substr(slash + 1);
        Result<Attr> attr = fail(EINVAL, "unknown node type");
        switch (node.type) {
            case FileType::directory:
                attr = txn->mkdir(parent, name, node.mode, getuid(), getgid());
                break;
            case FileType::symlink:
                attr = txn->symlink(parent, name, node.target, getuid(), getgid());
                break;
            case FileType::regular:
                attr = txn->create(parent, name, node.mode, getuid(), getgid(), true);
                if (attr) attr = txn->write(attr->ino, node.content, origin);
                ++report.files;
                report.bytes += node.content.size();
                break;
        }
        if (!attr) return tl::unexpected(with_context(attr.error(), node.path));
        SetAttr times;
        times.mtime_ns = node.mtime_ns;
        if (auto a = txn->setattr(attr->ino, times); !a) return tl::unexpected(a.error());
        if (top) {  // a name the daemon learns of from the log
            Tx tx = TxnAccess::tx(*txn);
            if (auto l =
                    tx.log(EventKind::import, attr->entry ? attr->entry : attr->ino, parent, name);
                !l) {
                return l;
            }
        }
        made[node.path] = attr->ino;
        return {};
    };
    if (auto s = parse_bundle(path, on_entry, on_node, {}); !s) return tl::unexpected(s.error());
    if (auto s = txn->commit(); !s) return tl::unexpected(s.error());
    return report;
}

}  // namespace kcache::core
