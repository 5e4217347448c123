// Layout rules: which nodes of a cache tree form entries, and which are bookkeeping.
//
// An entry is what a compiler reads and writes as one kernel. Compilers lay their
// caches out differently, and several share one mount, each in its own subdirectory,
// so entries are found by the names along a node's path, not at a fixed depth:
//
//   Triton      <dir>/<hash>/                      (also Inductor's triton/<dev>/<hash>/)
//   Inductor    fxgraph/<xx>/<key>/, aotautograd/<key>/, <xx>/<stem>.{py,cpp,so,...}
//   JAX         <key>-cache + <key>-atime           (one entry: the pair)
//   ccache      <a>/<b>/<hash>R, <hash>M           (one entry per file)
//   Wave        <hash>/      CuTe DSL  <dsl>_<hash>.mlir      Helion  <hash>.best_config
//   kcache      <hash>/kernel.{cubin,fatbin,ptx,json}
//
// Directories that only hold entries (triton/, fxgraph/, two-letter shards, device
// numbers, ...) are containers. Bookkeeping (locks, statistics, configuration, temp
// files and temp directories, wherever they sit) never forms an entry and never counts
// as a miss or a hit. A tree no rule recognizes falls back to the depth rule: the
// first directory at or below the configured entry depth is an entry, and a file
// outside any entry is an entry of its own.
//
// classify() is a pure function of names: the store applies it when a node is made or
// moved (tree.cpp) and keeps the result in the node, so a rule change never moves
// existing nodes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

enum class Placement : std::uint8_t {
    container,    // a directory that holds entries; not an entry itself
    bookkeeping,  // locks, stats, config, temp files and dirs: never an entry, never counted
    entry_dir,    // a directory that is one entry with everything below it
    entry_stem,   // a file that belongs to the entry of its stem among its siblings
};

struct Classified {
    Placement placement = Placement::container;
    std::string stem;  // entry_stem: the name the sibling files of the entry share
    Producer producer = Producer::unknown;  // which compiler's layout matched
    bool by_rule = false;                   // false: only the depth fallback made it an entry
};

// A user's rule, for a compiler the built-in rules do not know. A rules file
// (`kcache config --layout-rules FILE`, `kcache-fsd --layout-rules FILE`, kept in the
// db's Config) holds one rule per line, `#` starts a comment:
//   entry GLOB       a directory or file whose path matches is an entry of its own
//   container GLOB   a directory that only holds entries
//   ignore GLOB      bookkeeping: never an entry, never counted
// GLOB is matched against the node's path from the cache root with fnmatch(3) and
// FNM_PATHNAME (`*` stays within one component), e.g. `entry mycc/*/*`. The first
// matching rule wins; user rules are checked before the built-in ones.
struct LayoutRule {
    Placement placement = Placement::container;  // entry_dir stands for `entry`
    std::string glob;
};
// EINVAL naming the line for an unknown word or a missing glob.
Result<std::vector<LayoutRule>> parse_layout_rules(std::string_view text);

// What is known of a node's place when it is classified. The parent is a container
// (nodes inside an entry belong to it and are not classified).
struct LayoutContext {
    std::vector<std::string_view> ancestors;         // names from the root down to the parent
    std::uint32_t entry_depth = 1;                   // the depth fallback (Config::entry_depth)
    const std::vector<LayoutRule>* rules = nullptr;  // the user's, if any
};

Classified classify(const LayoutContext& context, std::string_view name, FileType type);

// Locks, statistics, configuration, temp names (Inductor's <stem>_CxxBuild build directory
// too) and SQLite's journals (see the file comment).
bool is_bookkeeping_name(std::string_view name);
// True when `name` carries a content hash: a run of at least 16 letters and digits
// with both in it (hex, base32, base64url digests of any compiler).
bool looks_like_hash(std::string_view name);

}  // namespace kcache::core
