// libFuzzer target for the shared tier's value decoders (remote/src/protocol.cpp),
// which read bytes that come from the network (built by tests/support/run_fuzz.sh
// with clang++-14; core's sources and protocol.cpp compiled in).
//
// Input: one selector byte, then the value. Selector bit 0x40 clear: a manifest, blob
// header or chunk (modulo 3); set: a frame value (even) or a dictionary value (odd),
// with core's frame-header parser behind them (core/frames.hpp: a frame cut anywhere
// in its header, its Dictionary_ID included, must be EBADMSG).
// A malformed value must decode to an EBADMSG error with a message, never crash, read
// past the end or allocate without bound. A manifest or blob header that decodes must
// encode back to a value that decodes to the same thing (what a node pulls is what
// was pushed), and core::check_image (the rules a bundle's entries meet too) refuses
// it with EINVAL or takes it; a signed manifest (KCM2) keeps its signature section
// through encode and decode and always has a signed statement; a chunk decodes to at most
// kChunkBytes and leaves `out` as it was when it fails.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kcache/core/entry_image.hpp"
#include "kcache/core/frames.hpp"
#include "protocol.hpp"

namespace {

namespace proto = kcache::remote::proto;

void check(bool condition, const char* what) {
    if (!condition) {
        std::fprintf(stderr, "fuzz_remote_values: contract broken: %s\n", what);
        std::abort();
    }
}

template <class T>
bool failed_cleanly(const kcache::core::Result<T>& r) {
    if (r) return false;
    check(r.error().code == EBADMSG && !r.error().message.empty(), "error is not EBADMSG");
    return true;
}

bool same(const proto::Manifest& a, const proto::Manifest& b) {
    if (a.name != b.name || a.kind != b.kind || a.stem != b.stem || a.dir_mode != b.dir_mode ||
        a.producer != b.producer || a.writer != b.writer || a.created_ns != b.created_ns ||
        a.files.size() != b.files.size())
        return false;
    for (std::size_t i = 0; i < a.files.size(); ++i) {
        const proto::Node& x = a.files[i];
        const proto::Node& y = b.files[i];
        if (x.path != y.path || x.type != y.type || x.mode != y.mode || x.mtime_ns != y.mtime_ns ||
            x.size != y.size || !(x.digest == y.digest) || x.has_content != y.has_content ||
            x.content != y.content || x.target != y.target)
            return false;
    }
    // A signed manifest (KCM2) keeps its key, signature and SHA-256s.
    if (a.signature.has_value() != b.signature.has_value()) return false;
    if (a.signature &&
        (a.signature->key != b.signature->key || a.signature->signature != b.signature->signature ||
         a.signature->sha256 != b.signature->sha256))
        return false;
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
    if (data[0] & 0x40) {
        if (data[0] % 2 == 0) {
            const auto f = proto::decode_frame(in);
            if (failed_cleanly(f)) return 0;
            // A frame that decodes has a header whose Dictionary_ID can be rewritten to
            // any id and read back, and re-encodes to its value.
            check(proto::encode_frame(f->raw_size, f->dictionary, f->frame) == in,
                  "frame value does not re-encode to its input");
            const std::uint32_t ids[] = {0, 0x7f, 0x8001, 0x12345678};
            const std::uint32_t id = ids[(data[0] >> 1) % 4];
            const auto rewritten = kcache::core::with_frame_dictionary(f->frame, id);
            check(rewritten.has_value(), "a parsed header does not take another id");
            const auto named = kcache::core::frame_dictionary(*rewritten);
            check(named && *named == id, "a rewritten id does not read back");
            // Decompressing it is refused cleanly or gives exactly the size declared.
            const auto raw = kcache::core::decompress_frame(f->frame, {}, f->raw_size);
            if (!failed_cleanly(raw)) check(raw->size() == f->raw_size, "frame size differs");
        } else {
            // The digest the key would name: of the value's bytes, or a wrong one.
            const std::string_view bytes = in.size() > 4 ? in.substr(4) : std::string_view();
            kcache::core::Digest digest = kcache::core::dictionary_digest(bytes);
            if (data[0] & 0x80) digest.low ^= 1;
            const auto d = proto::decode_dictionary(in, digest);
            if (!failed_cleanly(d)) check(*d == bytes, "a dictionary is not its value's bytes");
        }
        return 0;
    }
    switch (data[0] % 3) {
        case 0: {
            const auto m = proto::decode_manifest(in);
            if (failed_cleanly(m)) break;
            const auto again = proto::decode_manifest(proto::encode(*m));
            check(again && same(*m, *again), "manifest does not survive encode and decode");
            // A signed one that decodes has the statement its signer signed: one SHA-256
            // per regular file, so the puller can always ask whether the signature holds.
            if (m->signature) {
                check(m->signature->key.size() == 32 && m->signature->signature.size() == 64,
                      "a signature section of the wrong shape decoded");
                check(proto::signed_statement("ns", *m).has_value(),
                      "a decoded signed manifest has no statement");
            }
            // The image's checks (a puller's, and a bundle's) take any decoded manifest.
            if (const auto checked = kcache::core::check_image(*m); !checked) {
                check(checked.error().code == EINVAL && !checked.error().message.empty(),
                      "a refused image is not EINVAL with a message");
            }
            break;
        }
        case 1: {
            const auto h = proto::decode_blob_header(in);
            if (failed_cleanly(h)) break;
            check(proto::encode(*h) == in, "blob header does not re-encode to its input");
            break;
        }
        case 2: {
            std::string out = "prefix";
            // What the blob header would have said: the length the value declares
            // (so that decoding can succeed), or a wrong one when the selector says.
            std::size_t expected = 0;
            for (std::size_t i = 0; i < 4 && 1 + i < in.size(); ++i)
                expected |= std::size_t{static_cast<unsigned char>(in[1 + i])} << (8 * i);
            if (data[0] & 0x80) ++expected;
            if (auto s = proto::decode_chunk(in, expected, out); !s) {
                check(s.error().code == EBADMSG, "chunk error is not EBADMSG");
                check(out == "prefix", "a failed chunk changed its output");
            } else {
                check(out.size() == 6 + expected, "chunk decoded to another length");
            }
            break;
        }
    }
    return 0;
}
