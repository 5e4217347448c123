// The shared tier's Redis keys, spelled in one place: the versioned prefix, the
// namespace, and the one or two letters that name each kind of key after them.
//
//   kc2:<ns>:<kind>:...   every key (the containers set is kc2:<ns>:k, nothing after)
//
// What each key holds and why its hash tag is what it is: protocol.hpp (entries, blobs,
// dictionaries, jobs, containers) and families.hpp (family members). Settings' help
// text and the tests spell the prefix as users see it.
#pragma once

#include <string>
#include <string_view>

namespace kcache::remote::keys {

// The protocol's version: a new version, a new prefix (old keys simply miss).
inline constexpr std::string_view kVersion = "kc2";

// The kinds of keys (protocol.hpp, families.hpp).
inline constexpr std::string_view kManifest = "m";
inline constexpr std::string_view kLease = "l";
inline constexpr std::string_view kBlob = "b";
inline constexpr std::string_view kChunk = "c";
inline constexpr std::string_view kDictionary = "d";
inline constexpr std::string_view kJob = "j";
inline constexpr std::string_view kContainers = "k";
inline constexpr std::string_view kFamilyMembers = "f";
inline constexpr std::string_view kFamilyOrder = "fo";

// "kc2:<ns>:<kind>": the key of a kind that has one key per namespace.
inline std::string name(std::string_view ns, std::string_view kind) {
    std::string key(kVersion);
    key.append(":").append(ns).append(":").append(kind);
    return key;
}
// "kc2:<ns>:<kind>:": what a kind's keys start with.
inline std::string prefix(std::string_view ns, std::string_view kind) {
    return name(ns, kind).append(":");
}

}  // namespace kcache::remote::keys
