// Reading a bundle (bundle_format.hpp): every record, length, path, digest and the
// checksum checked before a caller acts on any of it.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <zstd.h>

#include "bundle_format.hpp"
#include "kcache/core/byte_reader.hpp"
#include "kcache/core/names.hpp"

namespace kcache::core::bundle {
using records::Codec;

namespace {

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
        KCACHE_TRY(read(n));
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
        auto piece = KCACHE_TRY(bytes(total, hashed));
        m_piece = std::move(piece);
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

// An entry record after its tag: its name and kind (format kFormatFlatDigests on), as
// a new image; `prefix` gets what its nodes' paths start with ("entry/" or "dir/").
Result<EntryImage> read_entry_header(BundleReader& in, std::uint32_t format, std::string& prefix) {
    auto name = KCACHE_TRY(in.str16());
    if (auto s = check_path(name, kMaxBundlePath); !s)
        return in.bad("refused entry: " + s.error().message);
    EntryKind kind = EntryKind::node;
    if (format >= kFormatFlatDigests) {
        std::uint8_t k = 0;
        if (auto s = in.read(k); !s) return tl::unexpected(s.error());
        if (k > static_cast<std::uint8_t>(EntryKind::stem)) return in.bad("unknown entry kind");
        kind = static_cast<EntryKind>(k);
    }
    EntryImage image;
    image.name = std::move(name);
    image.kind = kind;
    const auto slash = image.name.rfind('/');
    const std::string dir =
        slash == std::string::npos ? std::string() : image.name.substr(0, slash + 1);
    if (kind == EntryKind::stem) image.stem = image.name.substr(dir.size());
    prefix = kind == EntryKind::stem ? dir : image.name + "/";
    return image;
}

// A node of `image` other than a node entry's own: `p` must be below `prefix` (a stem
// entry's: a sibling file of the entry's name) and the entry not a single file; its
// path in the image is what follows the prefix.
Status place_in_entry(const BundleReader& in, const EntryImage& image, const std::string& prefix,
                      const std::string& p, ImageFile& node) {
    if (p.size() <= prefix.size() || p.compare(0, prefix.size(), prefix) != 0 ||
        (image.kind == EntryKind::stem && p.find('/', prefix.size()) != std::string::npos)) {
        return in.bad(
            image.kind == EntryKind::stem
                ? fmt::format("node '{}' is not a file of stem entry '{}'", p, image.name)
                : fmt::format("node '{}' is not under a directory of entry '{}'", p, image.name));
    }
    if (image.single) {
        return in.bad(
            fmt::format("node '{}' is not under a directory of entry '{}'", p, image.name));
    }
    node.path = p.substr(prefix.size());
    return {};
}

// A regular file's content (`p` its path, for errors): read, decompressed when stored
// so, and checked against its digest (the flat digest in a format before kFormat,
// whose node then gets the db's digest).
Status read_file_content(BundleReader& in, ImageFile& node, std::uint32_t format,
                         const std::string& p) {
    std::uint8_t codec = 0;
    std::uint32_t stored_len = 0;
    if (auto s = in.read(node.size, node.digest.high, node.digest.low, codec, stored_len); !s)
        return s;
    auto stored = KCACHE_TRY(in.bytes(stored_len));
    if (codec == static_cast<std::uint8_t>(Codec::zstd)) {
        if (node.size > in.size() * 1024 + (1u << 20)) return in.bad("implausible file size");
        node.content.assign(node.size, '\0');
        const std::size_t n =
            ZSTD_decompress(node.content.data(), node.content.size(), stored.data(), stored.size());
        if (ZSTD_isError(n) || n != node.size)
            return in.bad(fmt::format("'{}' does not decompress", p));
    } else if (codec == static_cast<std::uint8_t>(Codec::raw)) {
        node.content = std::move(stored);
    } else {
        return in.bad("unknown codec");
    }
    const Digest digest =
        format >= kFormat ? digest_of(node.content) : flat_digest_of(node.content);
    if (node.content.size() != node.size || !(digest == node.digest)) {
        return in.bad(fmt::format("content of '{}' does not match its digest", p));
    }
    if (format < kFormat) node.digest = digest_of(node.content);  // the db's digest
    node.has_content = true;
    return {};
}

// The bundle's end: its record counts (`entries`, `nodes` were read) and checksum, and
// nothing after them.
Status check_trailer(BundleReader& in, const std::string& path, std::uint64_t entries,
                     std::uint64_t nodes) {
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

Status parse_bundle(const std::string& path, const std::function<Status(EntryImage&&)>& on_image,
                    const ProgressFn& progress) {
    auto opened = KCACHE_TRY(BundleReader::open(path));
    BundleReader& in = opened;
    auto magic = in.bytes(kMagic.size());
    if (!magic || *magic != kMagic)
        return fail(EINVAL, fmt::format("{}: not a kcache bundle", path));
    std::uint32_t format = 0;
    if (auto s = in.read(format); !s) return s;
    if (format != kFormat && format != kFormatFlatDigests && format != kFormatNodeEntries) {
        return in.bad(fmt::format("unsupported format {}", format));
    }

    std::optional<EntryImage> image;  // the current entry's
    bool own_node = false;            // a node entry's own node has been read
    std::string prefix;               // what its paths start with: "entry/" or "dir/"
    std::uint64_t entries = 0, nodes = 0;
    // The entry read so far, checked whole and handed on.
    auto finish = [&]() -> Status {
        if (!image) return {};
        if (auto s = check_image(*image); !s) return in.bad(s.error().message);
        Status s = on_image(std::move(*image));
        image.reset();
        return s;
    };
    for (;;) {
        std::uint8_t tag = 0;
        if (auto s = in.read(tag); !s) return s;
        if (tag == 'Z') break;
        if (tag == 'E') {
            if (auto s = finish(); !s) return s;
            auto header = KCACHE_TRY(read_entry_header(in, format, prefix));
            image.emplace(std::move(header));
            own_node = false;
            ++entries;
            continue;
        }
        if (tag != 'N' || !image) return in.bad("unexpected record");
        ImageFile node;
        auto p = KCACHE_TRY(in.str16());
        std::uint8_t type = 0;
        if (auto s = in.read(type, node.mode, node.mtime_ns); !s) return s;
        if (type < 1 || type > 3) return in.bad("unknown node type");
        node.type = static_cast<FileType>(type);
        node.mode &= 07777;
        // A node entry's own node first, then nodes below it; a stem entry's files,
        // siblings of the entry's name (the image's checks do the rest).
        if (image->kind == EntryKind::node && !own_node) {
            if (p != image->name) return in.bad("entry must start with its own node");
            own_node = true;
            if (node.type == FileType::directory) {
                image->dir_mode = node.mode;
                image->dir_mtime_ns = node.mtime_ns;
                ++nodes;
                if (progress) progress(in.pos(), in.size());
                continue;
            }
            image->single = true;  // a schema-1 entry that is one file
            node.path = image->name.substr(image->name.rfind('/') + 1);
        } else if (auto s = place_in_entry(in, *image, prefix, p, node); !s) {
            return s;
        }
        if (node.type == FileType::regular) {
            if (auto st = read_file_content(in, node, format, p); !st) return st;
        } else if (node.type == FileType::symlink) {
            auto target = KCACHE_TRY(in.str16());
            if (target.empty()) return in.bad("empty symlink target");
            node.target = std::move(target);
        }
        image->files.push_back(std::move(node));
        ++nodes;
        if (progress) progress(in.pos(), in.size());
    }
    if (auto s = finish(); !s) return s;
    return check_trailer(in, path, entries, nodes);
}

}  // namespace kcache::core::bundle
