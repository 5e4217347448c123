// The bundle format, shared by export (bundle_export.cpp), parsing
// (bundle_parse.cpp) and import (bundle_import.cpp): entries in one file, imported
// only after all of it checks out.
//
// Layout (all integers little-endian):
//   header   "KCBUNDL1" u32 format (3; 2 is read too: its files of 1 MiB or more carry
//            flat digests (flat_digest_of); 1 also: it had no entry kind either)
//   records  'E' str16 entry-path u8 kind               an entry starts (kind: EntryKind)
//            'N' str16 path u8 type u32 mode i64 mtime  a node of the current entry:
//                file:    u64 raw-size u64 digest-high u64 digest-low u8 codec str32 bytes
//                symlink: str16 target
//   trailer  'Z' u64 entries u64 nodes, then 16 bytes: XXH3-128 of everything before them
// Paths are relative to the cache root, at any depth. A mode is the node's permission
// bits (older bundles: its whole st_mode, read as its permission bits). A node entry's nodes are
// its node first, then the nodes below it in depth-first order, each path under the entry's path. A
// stem entry (path: its directory and stem) has its files, each a sibling named with the stem, and
// nothing below them.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <xxhash.h>

#include "kcache/core/entry_image.hpp"
#include "store_impl.hpp"

namespace kcache::core::bundle {

inline constexpr std::string_view kMagic = "KCBUNDL1";
inline constexpr std::uint32_t kFormat = 3;
inline constexpr std::uint32_t kFormatFlatDigests = 2;  // files of any size digested flat
inline constexpr std::uint32_t kFormatNodeEntries = 1;  // before stem entries
// Longest path a bundle record holds (str16). Longer than kMaxPathLength: the tree has
// no path limit (clients build deep trees with openat), so neither has export/import.
inline constexpr std::size_t kMaxBundlePath = 0xffff;

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

// Parses the whole bundle, calling on_image for each entry, decoded into its image
// (entry_image.hpp: paths made relative, contents decompressed and digest-checked) and
// checked by check_image; fails on the first malformed record, wrong digest, image that
// fails its checks, or a bad checksum. One entry's contents are in memory at a time.
Status parse_bundle(const std::string& path, const std::function<Status(EntryImage&&)>& on_image,
                    const ProgressFn& progress);

}  // namespace kcache::core::bundle
