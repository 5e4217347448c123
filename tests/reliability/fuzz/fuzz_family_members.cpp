// libFuzzer target for the family members other nodes leave in Redis (remote/src/
// families.cpp: misses explained across nodes), which a daemon reads with HGETALL: bytes
// from the network (built by tests/support/run_fuzz.sh with clang++-14; core's sources
// and families.cpp compiled in).
//
// Input: one byte n, then n bytes of the hash field (the entry name), then the value.
// A malformed member must fail with EBADMSG and a message, never crash, read past the
// end or allocate without bound. One that decodes keeps core/misses.hpp's limits (files,
// text per kind and in all, a whole text as long as its file, no binary's text) and
// encodes back to exactly its input (the format has one encoding), but for the magic: a
// member older nodes wrote with the legacy magic (keys.hpp) is written back with the
// member's own.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "families.hpp"
#include "keys.hpp"

namespace {

namespace core = kcache::core;
namespace families = kcache::remote::families;

void check(bool condition, const char* what) {
    if (!condition) {
        std::fprintf(stderr, "fuzz_family_members: contract broken: %s\n", what);
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    const std::size_t n = std::min<std::size_t>(data[0], size - 1);
    const std::string_view entry(reinterpret_cast<const char*>(data + 1), n);
    const std::string_view value(reinterpret_cast<const char*>(data + 1 + n), size - 1 - n);
    const auto m = families::decode_member(entry, value);
    if (!m) {
        check(m.error().code == EBADMSG && !m.error().message.empty(), "error is not EBADMSG");
        return 0;
    }
    check(m->entry == entry && !m->family.empty(), "names");
    check(m->files.size() <= core::kMemberMaxFiles, "too many files");
    std::size_t text = 0;
    for (const core::MemberFile& f : m->files) {
        text += f.text.size();
        check(!f.path.empty(), "an empty path");
        check(f.text.size() <= f.size, "a text longer than its file");
        check(!f.whole || f.text.size() == f.size, "a whole text not its file's size");
        check(f.kind != core::MemberKind::binary || f.text.empty(), "a binary's text");
        check(f.kind != core::MemberKind::metadata || f.text.size() <= core::kMemberMetadataBytes,
              "metadata over its limit");
        check(f.kind != core::MemberKind::text || f.text.size() <= core::kMemberTextBytes,
              "text over its limit");
    }
    check(text <= core::kMemberMaxBytes, "texts over the limit");
    std::string expected(value);
    if (value.starts_with(kcache::remote::keys::kLegacyFamilyMemberMagic))
        expected.replace(0, 4, kcache::remote::keys::kFamilyMemberMagic);
    check(families::encode_member(*m) == expected, "does not encode back to its input");
    return 0;
}
