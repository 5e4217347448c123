// Checking and tidying a db: verify, garbage collection, compaction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kcache/core/dictionaries.hpp"
#include "kcache/core/store.hpp"

namespace kcache::core {

struct VerifyReport {
    std::uint64_t blobs = 0;
    std::uint64_t inodes = 0;
    std::uint64_t entries = 0;
    std::uint64_t holds = 0;            // blobs held for open files (holds.hpp), not entries
    std::vector<std::string> problems;  // one line each: what is damaged and how
    bool ok() const { return problems.empty(); }
};

// Reads every blob and checks it against its digest and size, recomputes every
// refcount and every entry's and gauge's accounting from the tree, and checks the
// tree's links. Works on a snapshot: it never blocks the daemon.
Result<VerifyReport> verify(const Store& store, const ProgressFn& progress = {});

struct GcReport {
    std::uint64_t stale_readers = 0;  // reader slots of dead processes cleared
    std::uint64_t stale_leases = 0;   // write leases of dead processes dropped
    std::uint64_t free_pages = 0;     // LMDB pages free for reuse after gc
    std::uint64_t file_bytes = 0;     // size of data.mdb
    RecompressReport dictionaries;    // kinds, training, blobs rewritten (dictionaries.hpp)
};

// Clears stale reader slots and write leases, then classifies, trains and recompresses
// blobs (recompress_blobs), then counts the free pages.
Result<GcReport> collect_garbage(Store& store);

struct CompactReport {
    std::uint64_t bytes_before = 0;
    std::uint64_t bytes_after = 0;
};

// Rewrites data.mdb without free pages. Needs the db to itself: fails with EBUSY
// while any other process (daemon, GUI, CLI) has it open.
Result<CompactReport> compact(const std::string& db_path);

}  // namespace kcache::core
