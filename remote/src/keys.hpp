// The shared tier's Redis keys and the magic words of its values, spelled in one place:
// the versioned prefix, the namespace, and the one or two letters that name each kind of
// key after them; then the four bytes each kind of value starts with.
//
//   kc2:<ns>:<kind>:...   every key (the containers set is kc2:<ns>:k, nothing after)
//
// What each key holds and why its hash tag is what it is: protocol.hpp (entries, blobs,
// dictionaries, jobs, containers) and families.hpp (family members). Settings' help
// text and the tests spell the prefix as users see it.
#pragma once

#include <cstddef>
#include <iterator>
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

// The magic words: each names one format (protocol.hpp, families.hpp), so that a value
// found under the wrong key is refused, not misread.
inline constexpr std::string_view kManifestMagic = "KCM1";
inline constexpr std::string_view kSignedManifestMagic = "KCM2";
inline constexpr std::string_view kBlobMagic = "KCB1";
inline constexpr std::string_view kFrameMagic = "KCF1";
inline constexpr std::string_view kDictionaryMagic = "KCD1";
inline constexpr std::string_view kFamilyMemberMagic = "KCG1";
// What family members were written with before they had a magic of their own (it was the
// frame's): still read, never written, so that the members older nodes recorded keep
// explaining misses. Never a frame there: members live only under family keys.
inline constexpr std::string_view kLegacyFamilyMemberMagic = "KCF1";

namespace detail {
inline constexpr std::string_view kMagics[] = {kManifestMagic,   kSignedManifestMagic,
                                               kBlobMagic,       kFrameMagic,
                                               kDictionaryMagic, kFamilyMemberMagic};
constexpr bool magics_distinct() {
    for (std::size_t i = 0; i < std::size(kMagics); ++i) {
        if (kMagics[i].size() != 4) return false;
        for (std::size_t j = i + 1; j < std::size(kMagics); ++j) {
            if (kMagics[i] == kMagics[j]) return false;
        }
    }
    return true;
}
}  // namespace detail
static_assert(detail::magics_distinct(), "each magic names one format: four bytes, no two alike");

}  // namespace kcache::remote::keys
