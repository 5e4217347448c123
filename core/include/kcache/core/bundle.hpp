// Export/import of entries as one self-contained bundle file (format in
// docs/core.md, "Bundles"): entries with their files, modes, times and content
// (compressed as stored), each file's digest, and a checksum over the whole bundle.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kcache/core/store.hpp"

namespace kcache::core {

struct ExportReport {
    std::uint64_t entries = 0;
    std::uint64_t files = 0;
    std::uint64_t bytes = 0;         // logical bytes of the exported files
    std::uint64_t bundle_bytes = 0;  // size of the bundle file
};

// Writes the named entries (all when `names` is empty) to `out_path`, through a
// temporary file renamed into place, so a failed export leaves nothing behind.
Result<ExportReport> export_bundle(const Store& store, const std::vector<std::string>& names,
                                   const std::string& out_path, const ProgressFn& progress = {});

struct ImportReport {
    std::uint64_t entries_added = 0;
    std::uint64_t entries_replaced = 0;
    std::uint64_t entries_skipped = 0;  // already present (without `replace`)
    std::uint64_t files = 0;
    std::uint64_t bytes = 0;
};

// Validates the whole bundle first (format, checksum, every name, every digest),
// then writes all of it in one transaction: on any error nothing is changed.
// Names that could escape the cache ("..", absolute, empty components) are refused.
Result<ImportReport> import_bundle(Store& store, const std::string& path, bool replace = false,
                                   const ProgressFn& progress = {});

}  // namespace kcache::core
