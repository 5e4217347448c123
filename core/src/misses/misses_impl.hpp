// What the files of core/src/misses/ share (kcache/core/misses.hpp is the interface):
// an entry's files as the comparison sees them (sides.cpp), family keys
// (families.cpp) and the comparison (compare.cpp), used by the classifier
// (classify.cpp), the tables' readers (tables.cpp) and the comparison across nodes
// (members.cpp). The records of the tables are records.hpp's (encode, decode_miss,
// decode_eviction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/misses.hpp"
#include "store_impl.hpp"

namespace kcache::core::misses {

// Metadata and IR files larger than this are compared by digest only.
inline constexpr std::uint64_t kMaxTextBytes = 4 << 20;

// ---- sides (sides.cpp) ------------------------------------------------------------

// What a file is to the comparison.
enum class Kind { metadata, text, binary, skip };

struct File {
    EntryFile info;
    Kind kind = Kind::binary;
    // A family member's file: what it holds of the content (nullopt: a local file,
    // read from the transaction), and whether that is the whole file.
    std::optional<std::string> held;
    bool whole = true;
};

// One side of a comparison: a local entry's regular files, by their path with the key
// normalized, read from `txn`; or a family member's (no txn: what each file holds).
struct Side {
    const Txn* txn = nullptr;
    std::map<std::string, File> files;
};

std::string_view base_name(std::string_view path);
// The regular files of an entry, by their path with the key normalized.
Result<Side> files_of(const Txn& txn, const EntryInfo& entry);
// Whether the comparison has `f`'s text (all of it, or a member's first lines).
bool has_text(const File& f);
Result<std::string> content_of(const Side& side, const File& f);
// A JSON object's top-level fields as text; nullopt when the bytes are not one.
std::optional<std::map<std::string, std::string>> json_fields(std::string_view bytes);

// ---- families (families.cpp) --------------------------------------------------------

// LMDB keys hold at most 511 bytes; names and families up to 400 bytes are their own
// key, longer ones are keyed by their digest ("#" + 32 hex digits).
std::string text_key(std::string_view text);
// The families table's keys: family's text key, NUL, entry (u64_key).
std::string family_prefix(std::string_view family);
std::string family_key(std::string_view family, Ino entry);

// ---- the comparison (compare.cpp) -------------------------------------------------

// IR files in the order a compile produces them, so the first difference named is the
// one nearest the key's inputs: source, then Triton's stages, then anything else.
int ir_rank(std::string_view path);

// An entry of the family to compare with: a local one (ino) or another node's member.
struct Other {
    Side side;
    Ino ino = 0;
    std::string name;
};

// The closest of `others` (newest first) to `mine`, compared in full, on top of `base`:
// by digests and metadata fields, one that holds this entry's binary (unstable) first,
// else the fewest differing fields, then files, the newest on a tie; the best few of
// them are compared in full and the closest kept. nullopt when `others` is empty.
Result<std::optional<Miss>> closest(const Side& mine, const std::vector<Other>& others,
                                    const Miss& base);

// ---- the classifier's tables (classify.cpp, tables.cpp) -----------------------------

// How many records table `dbi` holds; an error names it as `table`.
Result<std::uint64_t> records_in(const Tx& tx, MDB_dbi dbi, std::string_view table);

// The sequence number of the events log the classifier goes on from (0: never ran).
Result<std::uint64_t> classified_up_to(const Tx& tx);

}  // namespace kcache::core::misses
