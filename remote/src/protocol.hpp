// The shared tier's protocol, version 2: keys and value formats in Redis.
//
// Keys (all under a versioned prefix and a namespace, so they coexist with other
// tools' keys such as `triton:` or `ccache:` on one server; version 1's `kc1:` keys are
// never read: after an upgrade they simply miss, and expire or are evicted):
//   kc2:<ns>:m:{<E>}:<entry name>  manifest of an entry (written last, SET NX)
//   kc2:<ns>:l:{<E>}:<entry name>  compile lease of an entry (SET NX PX; kcache-fsd
//                                  --remote-lease-ms): who compiles it while others wait
//   kc2:<ns>:b:{<digest hex>}      blob header: raw size and chunk count (written after
//                                  every chunk of the blob)
//   kc2:<ns>:c:{<digest hex>}:<i>  chunk i of a blob (1 MiB of raw bytes, zstd or raw)
//   kc2:<ns>:b:{<digest hex>}      or: a blob as its stored zstd frame, whole, naming the
//                                  dictionary it needs by digest (no chunks)
//   kc2:<ns>:d:{<digest hex>}      a trained dictionary, by core::dictionary_digest
//                                  (written before any frame that needs it, SET NX)
//   kc2:<ns>:j:<job tag>           set of entry names a job pushed
//   kc2:<ns>:k                     set of container paths: every directory above an
//                                  entry pushed ("inductor", "inductor/fxgraph",
//                                  "inductor/fxgraph/ch"), so that a node that lacks
//                                  them finds the entries below (kcache-fsd's read-through)
// where E is 16 hex digits of the XXH3 of the entry's name.
//
// Why these hash tags (Redis Cluster puts a key in the slot of the text between its
// first '{' and the next '}', or of the whole key without one; client-side shards pick
// a server by the same text, remote.cpp's shard()):
//  - No tag spans a namespace: a `{<ns>}` tag would put a whole namespace, the whole
//    fleet's cache, on one node.
//  - An entry's manifest and its lease share the entry's tag: they live on one node, so
//    a lease and the manifest it waits for are asked of the same node (and could be read
//    together, in one pipeline or script), and a failover loses or keeps both.
//  - A blob's header and chunks share the blob's own digest as tag and nothing else (no
//    namespace, no entry): every blob lands on its own slot, spread over the cluster and
//    shared by every entry that uses it, while one blob is still read in one pipeline
//    from one node and dropped in one DEL. Dictionaries take the same shape.
//  - A job set is untagged: one key, anywhere. So is the container set: one small key
//    per namespace (a few thousand paths), added to once per new directory and read
//    by every node about once a second (SCARD; SMEMBERS when it grew).
// The entry's tag is a digest, not the name itself, because a name may hold '{' or '}'.
// Values are little-endian with a magic word. Decoding treats every value as hostile:
// every length is bounds-checked against the value and against fixed limits, and a
// value that fails is EBADMSG (corrupt), never a crash or an unbounded allocation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/entry_image.hpp"
#include "kcache/core/error.hpp"
#include "kcache/core/types.hpp"

namespace kcache::remote::proto {

using core::Result;

inline constexpr std::size_t kChunkBytes = std::size_t{1} << 20;  // raw bytes per chunk
inline constexpr std::size_t kInlineMax = 8 * 1024;  // files up to this size ride in the manifest
inline constexpr std::size_t kMaxManifestBytes = std::size_t{64} << 20;  // decoded
inline constexpr std::uint32_t kMaxNodes = 100'000;

// Orders digests, for maps of blobs by digest.
struct DigestLess {
    bool operator()(const core::Digest& a, const core::Digest& b) const {
        return a.high != b.high ? a.high < b.high : a.low < b.low;
    }
};

std::string manifest_key(std::string_view ns, std::string_view entry);
std::string blob_key(std::string_view ns, const core::Digest& digest);
std::string chunk_key(std::string_view ns, const core::Digest& digest, std::uint32_t index);
std::string job_key(std::string_view ns, std::string_view tag);
std::string containers_key(std::string_view ns);
std::string lease_key(std::string_view ns, std::string_view entry);
std::string dictionary_key(std::string_view ns, const core::Digest& digest);

// Chunks a blob of `raw_size` bytes takes (0 for empty content).
std::uint32_t chunk_count(std::uint64_t raw_size);

// A manifest is one encoding of an entry image (kcache/core/entry_image.hpp; a bundle is
// the other): its files carry their content (`has_content`, files up to kInlineMax)
// or name the blob `digest`. The entry directory's time is not carried.
using Node = core::ImageFile;
// A signed entry's signature (kcache/remote/trust.hpp): its producer's Ed25519 public
// key, the signature of signed_statement(), and the SHA-256 of each regular file, in
// the order of the manifest's files, which the statement binds and the puller checks
// against the bytes it fetched before any is written.
struct Signature {
    std::string key;                  // 32 raw bytes of the public key
    std::string signature;            // 64 bytes
    std::vector<std::string> sha256;  // 32 raw bytes each, one per regular file
};
struct Manifest : core::EntryImage {
    std::string writer;                  // host (and mount point, from the daemon) that wrote it
    std::optional<Signature> signature;  // a KCM2 value's; nullopt: unsigned (KCM1)
};

// The manifest's value: body zstd-compressed, with an XXH3-128 checksum of the body.
// Magic "KCM1" for an unsigned manifest (as every kcache before signing wrote), "KCM2"
// for a signed one: the KCM1 body followed by the signature section (key, signature,
// a count of SHA-256s and the SHA-256s), all under the checksum. A node built before
// signing reads a KCM2 value as a corrupt manifest (docs/operations.md, "Trust model").
std::string encode(const Manifest& manifest);
// EBADMSG naming the fault for anything malformed: bad magic, lengths past the end,
// counts over the limits, an inlined file whose bytes do not match its digest, a
// checksum mismatch, or (KCM2) a signature section of the wrong shape or whose SHA-256
// count is not the number of regular files. Names, paths and targets are
// core::check_image's (the puller's). Whether the signature holds is not decode's to say.
Result<Manifest> decode_manifest(std::string_view value);

// The bytes a producer signs for `manifest` under namespace `ns`: a fixed tag, the
// namespace, the entry's name, kind, stem, directory mode and writer, then per file its
// path, type and permission bits, and a regular file's size and SHA-256 (from
// manifest.signature->sha256) or a symlink's target. Binding the namespace and the name
// keeps a valid manifest from being replayed under another entry or namespace; the
// SHA-256s bind the bytes (the XXH3 digests only name the blobs). EINVAL when the
// signature's SHA-256 count is not the number of regular files.
Result<std::string> signed_statement(std::string_view ns, const Manifest& manifest);

struct BlobHeader {
    std::uint64_t raw_size = 0;
    std::uint32_t chunks = 0;
};
std::string encode(const BlobHeader& header);
Result<BlobHeader> decode_blob_header(std::string_view value);

// Chunk i of `raw`: [i*kChunkBytes, ...), zstd-compressed when that is smaller.
std::string encode_chunk(std::string_view raw_chunk);
// Appends the chunk's raw bytes to `out`; EBADMSG unless it decodes to exactly
// `expected_raw` bytes.
core::Status decode_chunk(std::string_view value, std::size_t expected_raw, std::string& out);

// A blob sent as the zstd frame its pusher stores (core/frames.hpp), at its blob key in
// place of a header: "KCF1", raw size u64, the digest of the dictionary it needs
// (core::dictionary_digest; all-zero: none), then the frame. Content of kSegmentedSize
// or more is a segment list and travels as a header and chunks. A node built before
// frames reads this value as a corrupt blob header (docs/operations.md).
struct FrameValue {
    std::uint64_t raw_size = 0;
    core::Digest dictionary;  // empty: none
    std::string_view frame;   // a view into the decoded value
};
bool is_frame(std::string_view value);
std::string encode_frame(std::uint64_t raw_size, const core::Digest& dictionary,
                         std::string_view frame);
// EBADMSG for a bad magic, a raw size of kSegmentedSize or more, a frame header that does
// not parse, or a frame that names a dictionary when the value names none (or none when
// it names one). Whether the frame decompresses is core::decompress_frame's to check.
Result<FrameValue> decode_frame(std::string_view value);

// A dictionary's value: "KCD1", then its bytes (as its pusher stores them, its own id in
// them). EBADMSG unless the bytes are a zstd dictionary of at most kMaxDictionaryBytes
// whose dictionary_digest is `digest` (the key it was read from).
inline constexpr std::size_t kMaxDictionaryBytes = std::size_t{1} << 20;
std::string encode_dictionary(std::string_view dictionary);
Result<std::string_view> decode_dictionary(std::string_view value, const core::Digest& digest);

}  // namespace kcache::remote::proto
