// Family members in the shared tier: keys, the value's encoding and its checks
// (families.hpp). No I/O here: family_store.cpp talks to Redis.
#include "families.hpp"

#include <cerrno>

#include <fmt/core.h>

#include "kcache/core/byte_reader.hpp"
#include "kcache/core/byte_writer.hpp"
#include "keys.hpp"

namespace kcache::remote::families {
namespace {

tl::unexpected<core::Error> bad(std::string_view what) {
    return core::fail(EBADMSG, fmt::format("corrupt family member: {}", what));
}

std::string family_tag(std::string_view family) {
    return fmt::format("{{{}}}", core::digest_of(family).hex());
}

}  // namespace

std::string member_key(std::string_view ns, std::string_view family) {
    return keys::prefix(ns, keys::kFamilyMembers) + family_tag(family);
}

std::string order_key(std::string_view ns, std::string_view family) {
    return keys::prefix(ns, keys::kFamilyOrder) + family_tag(family);
}

std::string encode_member(const core::FamilyMember& m) {
    std::string out(keys::kFamilyMemberMagic);
    core::ByteWriter w(out);
    w.str16(m.family.substr(0, kMaxNameBytes));
    w.str16(m.host.substr(0, kMaxNameBytes));
    w.i64(m.time_ns);
    const std::size_t n = std::min(m.files.size(), core::kMemberMaxFiles);
    w.u16(static_cast<std::uint16_t>(n));
    for (std::size_t i = 0; i < n; ++i) {
        const core::MemberFile& f = m.files[i];
        w.str16(f.path.substr(0, kMaxPathBytes));
        w.u8(static_cast<std::uint8_t>(f.kind));
        w.u8(f.whole ? 1 : 0);
        w.write(f.size, f.digest.high, f.digest.low);
        w.str32(f.text);
    }
    return out;
}

core::Result<core::FamilyMember> decode_member(std::string_view entry, std::string_view value) {
    if (entry.empty() || entry.size() > kMaxNameBytes) return bad("entry name length");
    if (value.size() > kMaxValueBytes) return bad("value too large");
    if (!value.starts_with(keys::kFamilyMemberMagic) &&
        !value.starts_with(keys::kLegacyFamilyMemberMagic))
        return bad("bad magic");
    core::ByteReader r(value.substr(keys::kFamilyMemberMagic.size()), "family member");
    core::FamilyMember m;
    m.entry = std::string(entry);
    auto family = r.str16();
    auto host = family ? r.str16() : family;
    if (!family || !host) return bad("names past the end");
    if (family->empty() || family->size() > kMaxNameBytes || host->size() > kMaxNameBytes)
        return bad("name lengths");
    m.family = std::string(*family);
    m.host = std::string(*host);
    std::uint16_t n = 0;
    if (!r.read(m.time_ns, n)) return bad("header past the end");
    if (n > core::kMemberMaxFiles) return bad("too many files");
    std::size_t text_bytes = 0;
    for (std::uint16_t i = 0; i < n; ++i) {
        core::MemberFile f;
        auto path = r.str16();
        if (!path) return bad("path past the end");
        if (path->empty() || path->size() > kMaxPathBytes) return bad("path length");
        std::uint8_t kind = 0, whole = 0;
        if (!r.read(kind, whole, f.size, f.digest.high, f.digest.low))
            return bad("file past the end");
        if (kind < 1 || kind > 3 || whole > 1) return bad("file kind");
        auto text = r.str32();
        if (!text) return bad("text past the end");
        f.path = std::string(*path);
        f.kind = static_cast<core::MemberKind>(kind);
        f.whole = whole == 1;
        text_bytes += text->size();
        if (text_bytes > core::kMemberMaxBytes) return bad("texts over the limit");
        if (text->size() > f.size || (f.whole && text->size() != f.size))
            return bad("text and size disagree");
        if (f.kind == core::MemberKind::binary && !text->empty()) return bad("a binary's text");
        if (f.kind == core::MemberKind::metadata && text->size() > core::kMemberMetadataBytes)
            return bad("metadata over the limit");
        if (f.kind == core::MemberKind::text && text->size() > core::kMemberTextBytes)
            return bad("text over the limit");
        f.text = std::string(*text);
        m.files.push_back(std::move(f));
    }
    if (!r.at_end()) return bad("trailing bytes");
    return m;
}

// KEYS: member hash, order set. ARGV: entry, value, now (ms), max members, ttl (s).
const char* const kRecordScript = R"lua(
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  local old = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  for _, name in ipairs(old) do redis.call('HDEL', KEYS[1], name) end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return redis.call('HLEN', KEYS[1])
)lua";

}  // namespace kcache::remote::families
