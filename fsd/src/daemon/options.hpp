// Command line of kcache-fsd, also in the form mount(8) passes (fstab: type
// fuse.kcache-fsd, options in -o).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/remote/settings.hpp"

namespace kcache::fsd {

inline constexpr double kBatchedSyncIntervalS = 1.0;

struct Options {
    std::string db;                 // --db or the first positional; default_db_path(); absolute
    std::string mountpoint;         // absolute
    std::uint64_t max_bytes = 0;    // --max-size: 0 keeps the db's setting
    std::uint64_t max_entries = 0;  // --max-entries: 0 keeps the db's setting
    std::uint32_t entry_depth = 0;  // --entry-depth: 0 keeps the db's (1 for a new db)
    std::optional<std::string> layout_rules;  // --layout-rules FILE: its text becomes the db's
    std::uint64_t max_file_size = std::uint64_t{2} << 30;  // --max-file-size: EFBIG past it
    // --durability: full (synced commits, no timer), batched (the default: unsynced
    // commits, synced every kBatchedSyncIntervalS), none. See docs/operations.md.
    core::Durability durability = core::Durability::none;
    double sync_interval_s = kBatchedSyncIntervalS;  // 0: the daemon never syncs on a timer
    bool foreground = false;                         // -f
    std::string help;        // --help: print this and exit 0 (nothing else is set)
    bool debug = false;      // -d: libfuse's request log
    bool read_only = false;  // --read-only or -o ro: serve the db, change nothing
    // --io-uring or -o io_uring: serve requests from per-CPU io_uring rings where the
    // kernel offers FUSE over io_uring, else /dev/fuse (uring_transport.hpp).
    bool io_uring = false;
    // --no-keeper: the daemon mounts and serves in one process, without the keeper that
    // restarts it (keeper.hpp): a crash then ends the mount (ENOTCONN until unmounted).
    bool no_keeper = false;
    // --no-xattrs: every extended-attribute request is answered ENOSYS, after which the
    // kernel answers EOPNOTSUPP itself and stops asking for security.capability before
    // each write (xattrs.cpp). Default: xattrs are kept (kcache/core/xattrs.hpp).
    bool no_xattrs = false;
    std::vector<std::string> fuse_options;  // -o options that are not ours, for libfuse
    // --remote ... (the CLI's options, remote/settings.hpp); set when a server is named
    // by --remote or $KCACHE_REMOTE: read-through and write-behind (remote_tier.hpp).
    std::optional<remote::Options> remote;
    // --prefetch-job-tag T (needs --remote): every entry of job T is pulled into the db
    // in the background once the mount is up (what `kcache remote pull --job-tag T` does).
    std::string prefetch_job_tag;
    // --job-tag T / -o job_tag=T (needs --remote, not --remote-read-only): every entry the
    // write-behind uploads, or finds already there, and every entry pulled from the shared
    // tier joins job T's set, for the next job's (or restart's) --prefetch-job-tag T.
    std::string job_tag;
    // --single-flight-ms / -o single_flight_ms=N: how long, at most, a path walk through
    // an entry directory that another compile is filling waits for it (single_flight.hpp;
    // docs/operations.md). 0 disables the wait.
    std::uint64_t single_flight_ms = 2000;
};

// Parses argv; kcache's own -o options (db=, max_size=, max_entries=, entry_depth=,
// max_file_size=, durability=, single_flight_ms=, job_tag=, prefetch_job_tag=, io_uring) are taken
// out of the FUSE option list.
// Each means what its long option means (one code path; -o comes last and wins); sizes and counts
// parse with core::parse_size ("1K" is 1024, "1T" a tebibyte). Paths come back absolute (made so
// against the working directory at the call): the daemon leaves it when it detaches.
core::Result<Options> parse_options(int argc, char** argv);

}  // namespace kcache::fsd
