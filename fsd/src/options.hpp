// Command line of kcache-fsd, also in the form mount(8) passes (fstab: type
// fuse.kcache-fsd, options in -o).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"

namespace kcache::fsd {

struct Options {
    std::string db;                       // --db or the first positional; default_db_path()
    std::string mountpoint;
    std::uint64_t max_bytes = 0;          // --max-size: 0 keeps the db's setting
    std::uint64_t max_entries = 0;        // --max-entries: 0 keeps the db's setting
    std::uint32_t entry_depth = 0;        // --entry-depth: 0 keeps the db's (1 for a new db)
    std::optional<std::string> layout_rules;  // --layout-rules FILE: its text becomes the db's
    std::uint64_t max_file_size = std::uint64_t{2} << 30;  // --max-file-size: EFBIG past it
    core::Durability durability = core::Durability::none;  // --durability; see docs/operations.md
    double sync_interval_s = 1.0;         // batched durability: sync at least this often
    bool foreground = false;              // -f
    bool debug = false;                   // -d: libfuse's request log
    bool read_only = false;               // --read-only or -o ro: serve the db, change nothing
    std::vector<std::string> fuse_options;  // -o options that are not ours, for libfuse
};

// Parses argv; kcache's own -o options (db=, max_size=, max_entries=, entry_depth=,
// max_file_size=, durability=) are taken out of the FUSE option list.
core::Result<Options> parse_options(int argc, char** argv);

}  // namespace kcache::fsd
