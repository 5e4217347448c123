// Family members in the shared tier (docs/misses.md, "Across nodes"): what a node's
// classifier needs of another node's entries to explain its own misses.
//
// Keys (protocol.hpp's prefix and namespace; F is the 32 hex digits of the XXH3-128 of
// the family's name, so one family is one slot of a Redis Cluster and families spread
// over the slots):
//   kc2:<ns>:f:{<F>}    hash: entry name -> the entry's family member (encode_member)
//   kc2:<ns>:fo:{<F>}   sorted set: entry name -> when its member was recorded (ms);
//                       the order the script keeps the newest kMaxMembers by
// Both live kTtlSeconds after the family's last record. kRecordScript writes a member
// in one step: HSET, ZADD, drops the oldest past kMaxMembers from both, sets both TTLs.
//
// Values are hostile input: decode_member checks every length against the value and
// the limits of core/misses.hpp (kMemberMaxFiles, kMemberMaxBytes, ...), and fails
// with EBADMSG naming the fault; it never crashes or allocates without bound.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kcache/core/error.hpp"
#include "kcache/core/misses.hpp"

namespace kcache::remote::families {

inline constexpr std::size_t kMaxMembers = 32;                    // kept per family
inline constexpr std::int64_t kTtlSeconds = 30LL * 24 * 60 * 60;  // after the last record
inline constexpr std::size_t kMaxValueBytes = 256 << 10;          // a member's value, at most
inline constexpr std::size_t kMaxPathBytes = 4096;
inline constexpr std::size_t kMaxNameBytes = 4096;  // entry, family and host names

std::string member_key(std::string_view ns, std::string_view family);
std::string order_key(std::string_view ns, std::string_view family);

// The value of `member` (its entry name is the hash field, not in the value).
std::string encode_member(const core::FamilyMember& member);
// The member `entry` recorded as `value`; EBADMSG for anything malformed.
core::Result<core::FamilyMember> decode_member(std::string_view entry, std::string_view value);

// EVAL kRecordScript 2 <member key> <order key> <entry> <value> <now ms> <max> <ttl s>
extern const char* const kRecordScript;

}  // namespace kcache::remote::families
