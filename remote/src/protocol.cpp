#include "protocol.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/core.h>
#include <zstd.h>

#include "kcache/core/byte_reader.hpp"
#include "kcache/core/byte_writer.hpp"
#include "kcache/core/frames.hpp"
#include "keys.hpp"

namespace kcache::remote::proto {
using core::ByteReader;
using core::ByteWriter;

namespace {

using keys::kManifestMagic;
using keys::kSignedManifestMagic;
constexpr std::uint8_t kEd25519 = 1;  // the signature section's algorithm
using keys::kBlobMagic;
using keys::kDictionaryMagic;
using keys::kFrameMagic;
constexpr std::uint8_t kRaw = 0;
constexpr std::uint8_t kZstd = 1;
constexpr int kZstdLevel = 3;  // as core stores content

tl::unexpected<core::Error> bad(std::string_view what) {
    return core::fail(EBADMSG, fmt::format("corrupt remote value: {}", what));
}

// The hash tag of an entry's keys (manifest, lease): 16 hex digits of the XXH3 of its
// name, so that the tag never holds a brace an entry name might contain and spreads
// entries evenly over the slots.
std::string entry_tag(std::string_view entry) {
    return fmt::format("{{{:016x}}}:", core::digest_of(entry).low);
}

// zstd when it is smaller, else raw: [codec u8][raw length u32][payload].
std::string pack(std::string_view raw) {
    std::string out;
    ByteWriter w(out);
    std::string compressed(ZSTD_compressBound(raw.size()), '\0');
    const std::size_t n =
        ZSTD_compress(compressed.data(), compressed.size(), raw.data(), raw.size(), kZstdLevel);
    const bool use_zstd = !ZSTD_isError(n) && n < raw.size();
    w.u8(use_zstd ? kZstd : kRaw);
    w.u32(static_cast<std::uint32_t>(raw.size()));
    w.bytes(use_zstd ? std::string_view(compressed.data(), n) : raw);
    return out;
}

// The inverse of pack(), refusing a raw length over `limit`.
core::Status unpack(std::string_view value, std::size_t limit, std::string& out) {
    ByteReader r(value, "remote value");
    std::uint8_t codec = 0;
    std::uint32_t raw = 0;
    if (!r.read(codec, raw)) return bad("truncated header");
    if (raw > limit) return bad(fmt::format("{} raw bytes is over the limit of {}", raw, limit));
    const std::string_view payload = value.substr(5);
    const std::size_t at = out.size();
    if (codec == kRaw) {
        if (payload.size() != raw) return bad("raw length does not match");
        out.append(payload);
        return {};
    }
    if (codec != kZstd) return bad(fmt::format("unknown codec {}", codec));
    const unsigned long long frame = ZSTD_getFrameContentSize(payload.data(), payload.size());
    if (frame != raw) return bad("compressed frame does not declare its raw length");
    out.resize(at + raw);
    const std::size_t n = ZSTD_decompress(out.data() + at, raw, payload.data(), payload.size());
    if (ZSTD_isError(n) || n != raw) {
        out.resize(at);
        return bad("does not decompress");
    }
    return {};
}

}  // namespace

std::string manifest_key(std::string_view ns, std::string_view entry) {
    return keys::prefix(ns, keys::kManifest).append(entry_tag(entry)).append(entry);
}
std::string lease_key(std::string_view ns, std::string_view entry) {
    return keys::prefix(ns, keys::kLease).append(entry_tag(entry)).append(entry);
}
std::string blob_key(std::string_view ns, const core::Digest& digest) {
    return keys::prefix(ns, keys::kBlob).append(fmt::format("{{{}}}", digest.hex()));
}
std::string chunk_key(std::string_view ns, const core::Digest& digest, std::uint32_t index) {
    return keys::prefix(ns, keys::kChunk).append(fmt::format("{{{}}}:{}", digest.hex(), index));
}
std::string job_key(std::string_view ns, std::string_view tag) {
    return keys::prefix(ns, keys::kJob).append(tag);
}
std::string containers_key(std::string_view ns) {
    return keys::name(ns, keys::kContainers);  // kc2:<ns>:k, no trailing ':'
}

std::string dictionary_key(std::string_view ns, const core::Digest& digest) {
    return keys::prefix(ns, keys::kDictionary).append(fmt::format("{{{}}}", digest.hex()));
}

std::uint32_t chunk_count(std::uint64_t raw_size) {
    return static_cast<std::uint32_t>((raw_size + kChunkBytes - 1) / kChunkBytes);
}

std::string encode(const Manifest& m) {
    std::string body;
    ByteWriter w(body);
    w.str16(m.name);
    w.u8(static_cast<std::uint8_t>(m.kind));
    w.str16(m.stem);
    w.u32(m.dir_mode);
    w.u8(static_cast<std::uint8_t>(m.producer));
    w.str16(m.writer);
    w.u64(static_cast<std::uint64_t>(m.created_ns));
    w.u32(static_cast<std::uint32_t>(m.files.size()));
    for (const Node& n : m.files) {
        w.str16(n.path);
        w.u8(static_cast<std::uint8_t>(n.type));
        w.u32(n.mode);
        w.u64(static_cast<std::uint64_t>(n.mtime_ns));
        if (n.type == core::FileType::regular) {
            w.u64(n.size);
            w.u64(n.digest.high);
            w.u64(n.digest.low);
            w.u8(n.has_content ? 1 : 0);
            if (n.has_content) w.str32(n.content);
        } else if (n.type == core::FileType::symlink) {
            w.str16(n.target);
        }
    }
    if (m.signature) {
        w.u8(kEd25519);
        w.bytes(m.signature->key);
        w.bytes(m.signature->signature);
        w.u32(static_cast<std::uint32_t>(m.signature->sha256.size()));
        for (const std::string& sha : m.signature->sha256) w.bytes(sha);
    }
    const core::Digest sum = core::digest_of(body);
    w.u64(sum.high);
    w.u64(sum.low);
    std::string out(m.signature ? kSignedManifestMagic : kManifestMagic);
    out += pack(body);
    return out;
}

Result<std::string> signed_statement(std::string_view ns, const Manifest& m) {
    if (!m.signature) return core::fail(EINVAL, "the manifest is not signed");
    std::string out("kcache signed entry v1");
    out.push_back('\0');
    ByteWriter w(out);
    w.str16(ns);
    w.str16(m.name);
    w.u8(static_cast<std::uint8_t>(m.kind));
    w.str16(m.stem);
    w.u32(m.dir_mode & 07777);
    w.str16(m.writer);
    w.u32(static_cast<std::uint32_t>(m.files.size()));
    std::size_t regular = 0;
    for (const Node& n : m.files) {
        w.str16(n.path);
        w.u8(static_cast<std::uint8_t>(n.type));
        w.u32(n.mode & 07777);
        if (n.type == core::FileType::regular) {
            if (regular >= m.signature->sha256.size())
                return core::fail(EINVAL, "the signature has fewer SHA-256s than regular files");
            w.u64(n.size);
            w.bytes(m.signature->sha256[regular++]);
        } else if (n.type == core::FileType::symlink) {
            w.str16(n.target);
        }
    }
    if (regular != m.signature->sha256.size())
        return core::fail(EINVAL, "the signature has more SHA-256s than regular files");
    return out;
}

namespace {

// One node of a manifest's body (its path, type, mode, time, then by type).
Result<Node> decode_node(ByteReader& r) {
    Node n;
    auto path = r.str16();
    std::uint8_t type = 0;
    std::uint32_t mode = 0;
    if (!path || !r.read(type, mode, n.mtime_ns)) return bad("manifest: truncated node");
    n.path.assign(*path);
    n.mode = mode & 07777;
    if (type < 1 || type > 3) return bad("manifest: unknown node type");
    n.type = static_cast<core::FileType>(type);
    if (n.type == core::FileType::regular) {
        std::uint8_t inlined = 0;
        if (!r.read(n.size, n.digest.high, n.digest.low, inlined))
            return bad("manifest: truncated file");
        if (n.size > core::kMaxFileSize) return bad("manifest: file size over the limit");
        if (inlined > 1) return bad("manifest: bad inline flag");
        n.has_content = inlined == 1;
        if (n.has_content) {
            auto content = r.str32();
            if (!content) return bad("manifest: truncated inline content");
            n.content.assign(*content);
            // Empty content has no digest to check (core keeps it all-zero).
            if (n.content.size() != n.size ||
                (n.size != 0 && !(core::digest_of(n.content) == n.digest))) {
                return bad("manifest: inline content does not match its digest");
            }
        }
    } else if (n.type == core::FileType::symlink) {
        auto target = r.str16();
        if (!target) return bad("manifest: truncated symlink");
        n.target.assign(*target);
    }
    return n;
}

}  // namespace

Result<Manifest> decode_manifest(std::string_view value) {
    const bool is_signed = value.starts_with(kSignedManifestMagic);
    if (!is_signed && !value.starts_with(kManifestMagic)) return bad("manifest: bad magic");
    std::string body;
    if (auto s = unpack(value.substr(kManifestMagic.size()), kMaxManifestBytes, body); !s) {
        return tl::unexpected(core::with_context(s.error(), "manifest"));
    }
    if (body.size() < 16) return bad("manifest: too short");
    const std::string_view content = std::string_view(body).substr(0, body.size() - 16);
    {
        ByteReader sum(std::string_view(body).substr(content.size()), "manifest checksum");
        core::Digest stored;
        if (!sum.read(stored.high, stored.low) || !(stored == core::digest_of(content))) {
            return bad("manifest: checksum mismatch");
        }
    }
    ByteReader r(content, "manifest");
    Manifest m;
    auto entry = r.str16();
    std::uint8_t kind = 0;
    if (!entry || !r.read(kind)) return bad("manifest: truncated header");
    m.name.assign(*entry);
    auto stem = r.str16();
    std::uint8_t producer = 0;
    if (!stem || !r.read(m.dir_mode, producer)) return bad("manifest: truncated header");
    m.stem.assign(*stem);
    auto writer = r.str16();
    std::uint32_t count = 0;
    if (!writer || !r.read(m.created_ns, count)) return bad("manifest: truncated header");
    m.writer.assign(*writer);
    if (kind > static_cast<std::uint8_t>(core::EntryKind::stem))
        return bad("manifest: unknown entry kind");
    m.kind = static_cast<core::EntryKind>(kind);
    m.producer = producer <= static_cast<std::uint8_t>(core::Producer::kcache)
                     ? static_cast<core::Producer>(producer)
                     : core::Producer::unknown;
    if (count > kMaxNodes) return bad(fmt::format("manifest: {} nodes is over the limit", count));
    m.files.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i) {
        auto node = decode_node(r);
        if (!node) return tl::unexpected(node.error());
        m.files.push_back(std::move(*node));
    }
    if (is_signed) {
        std::uint8_t algorithm = 0;
        std::uint32_t shas = 0;
        Signature sig;
        if (!r.read(algorithm)) return bad("manifest: truncated signature");
        if (algorithm != kEd25519) return bad("manifest: unknown signature algorithm");
        auto key = r.bytes(32);
        auto signature = r.bytes(64);
        if (!key || !signature || !r.read(shas)) return bad("manifest: truncated signature");
        const auto regular = static_cast<std::size_t>(
            std::count_if(m.files.begin(), m.files.end(),
                          [](const Node& n) { return n.type == core::FileType::regular; }));
        if (shas != regular)
            return bad("manifest: the signature's SHA-256 count is not its regular file count");
        sig.key.assign(*key);
        sig.signature.assign(*signature);
        for (std::uint32_t i = 0; i < shas; ++i) {
            auto sha = r.bytes(32);
            if (!sha) return bad("manifest: truncated SHA-256");
            sig.sha256.emplace_back(*sha);
        }
        m.signature = std::move(sig);
    }
    if (!r.at_end()) return bad("manifest: trailing or missing bytes");
    return m;
}

std::string encode(const BlobHeader& h) {
    std::string out(kBlobMagic);
    ByteWriter w(out);
    w.u64(h.raw_size);
    w.u32(h.chunks);
    return out;
}

Result<BlobHeader> decode_blob_header(std::string_view value) {
    if (!value.starts_with(kBlobMagic)) return bad("blob header: bad magic");
    ByteReader r(value.substr(kBlobMagic.size()), "blob header");
    BlobHeader h;
    if (!r.read(h.raw_size, h.chunks) || !r.at_end()) return bad("blob header: wrong length");
    if (h.raw_size > core::kMaxFileSize || h.chunks != chunk_count(h.raw_size)) {
        return bad("blob header: size and chunk count do not fit");
    }
    return h;
}

std::string encode_chunk(std::string_view raw_chunk) {
    return pack(raw_chunk);
}

core::Status decode_chunk(std::string_view value, std::size_t expected_raw, std::string& out) {
    const std::size_t before = out.size();
    if (auto s = unpack(value, kChunkBytes, out); !s) return s;
    if (out.size() - before != expected_raw) {
        out.resize(before);
        return bad("chunk: wrong raw length");
    }
    return {};
}

bool is_frame(std::string_view value) {
    return value.starts_with(kFrameMagic);
}

std::string encode_frame(std::uint64_t raw_size, const core::Digest& dictionary,
                         std::string_view frame) {
    std::string out(kFrameMagic);
    ByteWriter w(out);
    w.u64(raw_size);
    w.u64(dictionary.high);
    w.u64(dictionary.low);
    w.bytes(frame);
    return out;
}

Result<FrameValue> decode_frame(std::string_view value) {
    if (!is_frame(value)) return bad("frame: bad magic");
    ByteReader r(value.substr(kFrameMagic.size()), "frame");
    FrameValue f;
    if (!r.read(f.raw_size, f.dictionary.high, f.dictionary.low)) return bad("frame: truncated");
    if (f.raw_size >= core::kSegmentedSize) return bad("frame: raw size over the limit");
    f.frame = value.substr(kFrameMagic.size() + 24);
    auto named = core::frame_dictionary(f.frame);
    if (!named) return bad(fmt::format("frame: {}", named.error().message));
    if ((*named == 0) != f.dictionary.empty())
        return bad("frame: its header and its value disagree on a dictionary");
    return f;
}

std::string encode_dictionary(std::string_view dictionary) {
    std::string out(kDictionaryMagic);
    out.append(dictionary);
    return out;
}

Result<std::string_view> decode_dictionary(std::string_view value, const core::Digest& digest) {
    if (!value.starts_with(kDictionaryMagic)) return bad("dictionary: bad magic");
    const std::string_view bytes = value.substr(kDictionaryMagic.size());
    if (bytes.size() < 8 || bytes.size() > kMaxDictionaryBytes ||
        !bytes.starts_with(std::string_view("\x37\xa4\x30\xec", 4))) {
        return bad("dictionary: not a zstd dictionary");
    }
    if (!(core::dictionary_digest(bytes) == digest)) return bad("dictionary: digest mismatch");
    return bytes;
}

}  // namespace kcache::remote::proto
