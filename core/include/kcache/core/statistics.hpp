// The statistics kcache keeps in the db: one table (kStatistics) gives each its
// stable id, name, unit, kind (event counter or gauge), a one-line description and
// who counts it. `kcache stats` (human and --json), `kcache remote stats`, the
// inspector and the daemon read it; docs/stats.md documents it (a test checks that
// every row is there). ccache's k_statistics_fields is the model.
//
// Adding a statistic: a new enumerator with a new id, a row in kStatistics (in id
// order), kStatisticCount + 1, and a line in docs/stats.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kcache::core {

// Statistic ids are stable integers stored in the db: never renumber or reuse one.
// Ids below 100 are event counters (reset by `kcache stats --reset`); ids from 100
// are gauges that describe what the cache holds now (never reset).
enum class Counter : std::uint32_t {
    hits = 1,
    misses = 2,
    stores = 3,
    negative_lookups = 4,
    opens = 5,
    bytes_read = 6,
    bytes_written = 7,
    evicted_entries = 8,
    evicted_bytes = 9,
    dedup_hits = 10,
    errors_nospc = 11,
    errors_io = 12,
    errors_other = 13,
    imported_entries = 14,
    // single flight on one node (kcache-fsd)
    single_flight_waits = 15,
    single_flight_timeouts = 16,
    hits_fleet = 17,  // of the hits, on entries the shared tier supplied
    // damage found while serving (docs/operations.md, "A damaged db")
    damaged_blobs = 18,
    damaged_dbs = 19,
    // misses by cause (core/misses.hpp), counted when the background classifies them
    misses_first = 20,
    misses_capacity = 21,
    misses_changed_key = 22,
    misses_unstable_key = 23,
    // the shared tier (remote/)
    remote_hits = 40,
    remote_misses = 41,
    remote_errors = 42,
    remote_timeouts = 43,
    remote_corrupt = 44,
    remote_dangling = 45,
    remote_bytes_up = 46,
    remote_bytes_down = 47,
    remote_uploads = 48,
    remote_upload_skipped = 49,
    remote_upload_queued = 50,
    remote_upload_dropped = 51,
    remote_prefetched = 52,
    remote_prefetched_bytes = 53,
    remote_lease_waits = 54,
    remote_lease_timeouts = 55,
    remote_containers = 56,
    remote_family_errors = 60,
    // pulls the trust policy refused (docs/operations.md, "Trust model")
    remote_rejected_unsigned = 61,
    remote_rejected_untrusted = 62,
    remote_rejected_revoked = 63,
    remote_rejected_bad = 64,
    // gauges
    entries = 100,
    bytes = 101,
    stored_bytes = 102,
    blobs = 103,
    files = 104,
    blob_raw_bytes = 105,
    // the shared tier's servers as kcache-fsd --remote sees them now
    remote_servers = 110,
    remote_breakers_open = 111,
    remote_breakers_half_open = 112,
};
// The number of enumerators above: kStatistics has one row for each.
inline constexpr std::size_t kStatisticCount = 54;

// The on-disk rule, which also holds for ids this build does not know.
inline constexpr bool is_gauge(Counter c) {
    return static_cast<std::uint32_t>(c) >= 100;
}

enum class Unit : std::uint8_t {
    count,
    bytes,  // shown as a size (KiB, MiB, ...)
};

enum class StatisticKind : std::uint8_t {
    counter,  // counts events since the last reset
    gauge,    // what the cache holds now; never reset
};

// Who counts a statistic (bit flags).
enum CountedBy : std::uint8_t {
    // core's write transactions, in the transaction that makes the change counted
    // (publish, evict, import, record_hit ...): every process that writes the db
    by_store = 1,
    // kcache-fsd's request handlers, in memory; its background thread adds them to
    // the db in one transaction every few periods (fsd/src/daemon/counters.hpp)
    by_daemon = 2,
    // the remote tier: `kcache remote ...` and kcache-fsd --remote (remote/)
    by_remote = 4,
};

struct StatisticField {
    Counter id;
    std::string_view name;  // keys of --json output, scripts read them: never change one
    Unit unit;
    StatisticKind kind;
    std::uint8_t counted_by;  // CountedBy flags
    std::string_view description;
    // The shared tier's statistics (by_remote): which part of it they describe, the
    // heading the inspector's "Shared tier" section shows them under ("reads",
    // "uploads", ...; groups in the order they first appear here). Empty for the rest.
    std::string_view group = {};
};

// Every statistic, in id order (the order `kcache stats` lists them in).
inline constexpr StatisticField kStatistics[] = {
    // clang-format off
    {Counter::hits, "hits", Unit::count, StatisticKind::counter, by_store,
     "first opens of an entry by a process that did not populate it (the daemon decides, WriteTxn::record_hit counts)"},
    {Counter::misses, "misses", Unit::count, StatisticKind::counter, by_store,
     "entries populated: gone from absent or empty to their first published file"},
    {Counter::stores, "stores", Unit::count, StatisticKind::counter, by_store,
     "files published (content committed), rewrites included"},
    {Counter::negative_lookups, "negative_lookups", Unit::count, StatisticKind::counter, by_daemon,
     "lookups of names that do not exist"},
    {Counter::opens, "opens", Unit::count, StatisticKind::counter, by_daemon,
     "opens of regular files"},
    {Counter::bytes_read, "bytes_read", Unit::bytes, StatisticKind::counter, by_daemon,
     "bytes read through the mount"},
    {Counter::bytes_written, "bytes_written", Unit::bytes, StatisticKind::counter, by_store,
     "bytes of content published"},
    {Counter::evicted_entries, "evicted_entries", Unit::count, StatisticKind::counter, by_store,
     "entries removed by eviction (automatic or kcache evict)"},
    {Counter::evicted_bytes, "evicted_bytes", Unit::bytes, StatisticKind::counter, by_store,
     "logical bytes of the entries evicted"},
    {Counter::dedup_hits, "dedup_hits", Unit::count, StatisticKind::counter, by_store,
     "published content that was already stored under another file"},
    {Counter::errors_nospc, "errors_nospc", Unit::count, StatisticKind::counter, by_daemon,
     "requests that failed with ENOSPC"},
    {Counter::errors_io, "errors_io", Unit::count, StatisticKind::counter, by_daemon | by_store,
     "requests that failed with EIO, and references to blobs found gone (damage)"},
    {Counter::errors_other, "errors_other", Unit::count, StatisticKind::counter, by_daemon,
     "requests that failed with ENOMEM or EFBIG"},
    {Counter::imported_entries, "imported_entries", Unit::count, StatisticKind::counter, by_store,
     "entries written by kcache import"},
    {Counter::single_flight_waits, "single_flight_waits", Unit::count, StatisticKind::counter, by_daemon,
     "path walks through an entry directory that waited for another compile filling it"},
    {Counter::single_flight_timeouts, "single_flight_timeouts", Unit::count, StatisticKind::counter, by_daemon,
     "single-flight waits that ended at their bound with the entry still being filled"},
    {Counter::hits_fleet, "hits_fleet", Unit::count, StatisticKind::counter, by_store,
     "of the hits, those on entries the shared tier supplied (compiled on another node, pulled here: no miss)"},
    {Counter::damaged_blobs, "damaged_blobs", Unit::count, StatisticKind::counter, by_daemon,
     "files whose content did not match its digest when the daemon loaded it: their entry was evicted (a miss)"},
    {Counter::damaged_dbs, "damaged_dbs", Unit::count, StatisticKind::counter, by_daemon,
     "dbs LMDB found corrupt, set aside by kcache-fsd for a fresh one (counted in the fresh db)"},
    {Counter::misses_first, "misses_first", Unit::count, StatisticKind::counter, by_store,
     "classified misses of a kernel with no entry of its family in the cache, never evicted"},
    {Counter::misses_capacity, "misses_capacity", Unit::count, StatisticKind::counter, by_store,
     "classified misses of an entry that was evicted or removed before: the bound was too small"},
    {Counter::misses_changed_key, "misses_changed_key", Unit::count, StatisticKind::counter, by_store,
     "classified misses of a kernel with an entry of its family in the cache and a different key"},
    {Counter::misses_unstable_key, "misses_unstable_key", Unit::count, StatisticKind::counter, by_store,
     "classified misses whose binary an entry of the same family already held (a wasted compile)"},
    {Counter::remote_hits, "remote_hits", Unit::count, StatisticKind::counter, by_remote,
     "entries pulled from the remote tier into this db", "reads"},
    {Counter::remote_misses, "remote_misses", Unit::count, StatisticKind::counter, by_remote,
     "entries asked for that the remote tier does not hold", "reads"},
    {Counter::remote_errors, "remote_errors", Unit::count, StatisticKind::counter, by_remote,
     "remote operations that failed (I/O, refused, circuit open, server error)", "failures"},
    {Counter::remote_timeouts, "remote_timeouts", Unit::count, StatisticKind::counter, by_remote,
     "remote operations that ran past their deadline", "failures"},
    {Counter::remote_corrupt, "remote_corrupt", Unit::count, StatisticKind::counter, by_remote,
     "blobs or manifests whose bytes did not match: dropped, never stored", "failures"},
    {Counter::remote_dangling, "remote_dangling", Unit::count, StatisticKind::counter, by_remote,
     "manifests whose blob is gone (counted as a miss)", "reads"},
    {Counter::remote_bytes_up, "remote_bytes_up", Unit::bytes, StatisticKind::counter, by_remote,
     "bytes of values sent to the remote tier", "uploads"},
    {Counter::remote_bytes_down, "remote_bytes_down", Unit::bytes, StatisticKind::counter, by_remote,
     "bytes of values received from the remote tier", "reads"},
    {Counter::remote_uploads, "remote_uploads", Unit::count, StatisticKind::counter, by_remote,
     "entries uploaded (their manifest written by this db)", "uploads"},
    {Counter::remote_upload_skipped, "remote_upload_skipped", Unit::count, StatisticKind::counter, by_remote,
     "entries not uploaded: already there (the first writer won)", "uploads"},
    {Counter::remote_upload_queued, "remote_upload_queued", Unit::count, StatisticKind::counter, by_remote,
     "kcache-fsd --remote: settled entries queued for write-behind", "uploads"},
    {Counter::remote_upload_dropped, "remote_upload_dropped", Unit::count, StatisticKind::counter, by_remote,
     "kcache-fsd --remote: entries not queued because the upload queue was full", "uploads"},
    {Counter::remote_prefetched, "remote_prefetched", Unit::count, StatisticKind::counter, by_remote,
     "kcache-fsd --prefetch-job-tag: entries of the job pulled into this db at mount", "prefetch"},
    {Counter::remote_prefetched_bytes, "remote_prefetched_bytes", Unit::bytes, StatisticKind::counter, by_remote,
     "kcache-fsd --prefetch-job-tag: logical bytes of the entries prefetched", "prefetch"},
    {Counter::remote_lease_waits, "remote_lease_waits", Unit::count, StatisticKind::counter, by_remote,
     "misses that waited for another node holding the compile lease (kcache-fsd --remote-lease-ms)", "leases"},
    {Counter::remote_lease_timeouts, "remote_lease_timeouts", Unit::count, StatisticKind::counter, by_remote,
     "lease waits that ended without the entry (the lease expired or its time passed): compiled here", "leases"},
    {Counter::remote_containers, "remote_containers", Unit::count, StatisticKind::counter, by_daemon | by_remote,
     "directories a lookup made because the shared tier holds entries below them (Inductor's fxgraph/<xx>/, ccache's <x>/<y>/ on a node that never compiled there)", "reads"},
    {Counter::remote_family_errors, "remote_family_errors", Unit::count, StatisticKind::counter, by_remote,
     "family members (misses explained across nodes) not recorded or not read: the push itself succeeded", "failures"},
    {Counter::remote_rejected_unsigned, "remote_rejected_unsigned", Unit::count, StatisticKind::counter, by_remote,
     "entries refused because they carry no signature while a trust file is set (a miss, nothing stored)", "trust"},
    {Counter::remote_rejected_untrusted, "remote_rejected_untrusted", Unit::count, StatisticKind::counter, by_remote,
     "entries refused because the key that signed them is not in the trust file (a miss, nothing stored)", "trust"},
    {Counter::remote_rejected_revoked, "remote_rejected_revoked", Unit::count, StatisticKind::counter, by_remote,
     "entries refused because the trust file revokes the key that signed them (a miss, nothing stored)", "trust"},
    {Counter::remote_rejected_bad, "remote_rejected_bad", Unit::count, StatisticKind::counter, by_remote,
     "entries refused because their signature does not hold for their namespace and name, or a file differs from its signed SHA-256 (a miss, nothing stored)", "trust"},
    {Counter::entries, "entries", Unit::count, StatisticKind::gauge, by_store,
     "entries in the cache now"},
    {Counter::bytes, "bytes", Unit::bytes, StatisticKind::gauge, by_store,
     "logical bytes of all regular files"},
    {Counter::stored_bytes, "stored_bytes", Unit::bytes, StatisticKind::gauge, by_store,
     "bytes the unique blobs take in data.mdb, after dedup and compression (what --max-size bounds)"},
    {Counter::blobs, "blobs", Unit::count, StatisticKind::gauge, by_store,
     "unique blobs"},
    {Counter::files, "files", Unit::count, StatisticKind::gauge, by_store,
     "regular files in the cache now"},
    {Counter::blob_raw_bytes, "blob_raw_bytes", Unit::bytes, StatisticKind::gauge, by_store,
     "raw bytes of the unique blobs (after dedup, before compression)"},
    {Counter::remote_servers, "remote_servers", Unit::count, StatisticKind::gauge, by_remote,
     "kcache-fsd --remote: Redis servers the running daemon uses (0 when none runs)", "servers"},
    {Counter::remote_breakers_open, "remote_breakers_open", Unit::count, StatisticKind::gauge, by_remote,
     "kcache-fsd --remote: of them, servers whose circuit breaker is open (failing at once)", "servers"},
    {Counter::remote_breakers_half_open, "remote_breakers_half_open", Unit::count, StatisticKind::gauge, by_remote,
     "kcache-fsd --remote: of them, servers whose cool-down passed: the next operation is the trial", "servers"},
    // clang-format on
};

namespace statistics_detail {
constexpr bool table_is_consistent() {
    for (std::size_t i = 0; i < std::size(kStatistics); ++i) {
        const StatisticField& f = kStatistics[i];
        if (f.name.empty() || f.description.empty() || f.counted_by == 0) return false;
        if ((f.kind == StatisticKind::gauge) != is_gauge(f.id)) return false;
        if (((f.counted_by & by_remote) != 0) == f.group.empty()) return false;
        if (i > 0 &&
            static_cast<std::uint32_t>(kStatistics[i - 1].id) >= static_cast<std::uint32_t>(f.id)) {
            return false;  // in id order, each id once
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (kStatistics[j].name == f.name) return false;
        }
    }
    return true;
}
}  // namespace statistics_detail

static_assert(std::size(kStatistics) == kStatisticCount,
              "every Counter has one row in kStatistics and kStatisticCount counts them");
static_assert(statistics_detail::table_is_consistent(),
              "kStatistics: rows in id order, names unique, gauges exactly the ids from 100, "
              "a group for exactly the shared tier's statistics");

// The row of `c`; nullptr for an id this build does not know (read from a newer db).
constexpr const StatisticField* statistic_field(Counter c) {
    for (const StatisticField& f : kStatistics) {
        if (f.id == c) return &f;
    }
    return nullptr;
}

// "hits", "stored_bytes", ...; "unknown" for an id this build does not know.
constexpr std::string_view counter_name(Counter c) {
    const StatisticField* f = statistic_field(c);
    return f ? f->name : std::string_view("unknown");
}

constexpr bool counts_bytes(Counter c) {
    const StatisticField* f = statistic_field(c);
    return f && f->unit == Unit::bytes;
}

// The name for people: "stored bytes".
inline std::string counter_label(Counter c) {
    std::string label(counter_name(c));
    for (char& ch : label) {
        if (ch == '_') ch = ' ';
    }
    return label;
}

// How many statistics `who` counts, and which (in id order).
constexpr std::size_t statistics_counted_by(std::uint8_t who) {
    std::size_t n = 0;
    for (const StatisticField& f : kStatistics) n += (f.counted_by & who) ? 1 : 0;
    return n;
}
template <std::size_t N>
constexpr std::array<Counter, N> statistics_counted_by_list(std::uint8_t who) {
    std::array<Counter, N> out{};
    std::size_t n = 0;
    for (const StatisticField& f : kStatistics) {
        if ((f.counted_by & who) && n < N) out[n++] = f.id;
    }
    return out;
}

}  // namespace kcache::core
