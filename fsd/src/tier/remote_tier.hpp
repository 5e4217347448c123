// The daemon's side of the shared tier (kcache-fsd --remote; docs/operations.md):
// read-through on a local miss of an entry, write-behind of settled entries.
//
// Contract:
//  - A local hit never reaches this class: Filesystem asks it only about names the db
//    lacks (candidate()), and candidate() reads the db only, never Redis.
//  - Read-through: read_through() never blocks its caller on Redis. The pull runs on
//    a fetcher thread; the caller's `done` runs once the pull committed or failed, or
//    when the lookup deadline (connect + operation timeout) passed, whichever comes
//    first: a frozen Redis costs a lookup at most that deadline, and once a server's
//    circuit is open (remote.hpp) a miss is answered at once. Concurrent misses of one
//    entry share one pull (single flight); an entry that missed is not asked for again
//    for kMissMemo, nor while its overdue pull is still running.
//  - Compile leases (on by default: remote::Options::kLeaseRenewed; --remote-lease-ms N
//    for a fixed time, 0 for none): a pull that finds no manifest takes the entry's
//    lease (SET NX PX N; renewed leases: N = kLeaseTtlMs) in the manifest's round trip
//    (Remote::LeaseAsk), so a miss costs one round trip.
//    The winner answers its waiters at once (a miss: this node compiles) and releases
//    the lease once its upload of the entry succeeded (else it expires). A loser keeps
//    its waiters: the flight's deadline becomes N from then, and the entry is pulled
//    again every kLeasePoll until its manifest appears (then they are answered with it),
//    or the lease is gone without it (then this node takes it and compiles), or the
//    deadline passes; the last two are answered as a miss and counted
//    remote_lease_timeouts. Waits are counted remote_lease_waits. A lease this node
//    holds is its own: its later misses of the entry never wait. A failure to take or
//    read a lease is a plain miss.
//    Renewed leases (the default): the lease keeper thread renews every lease held here
//    each kLeaseRenew (Remote::renew_lease) until its upload succeeded or it was held
//    for the lease bound; a waiter's deadline is kLeaseBoundMax + kLeaseTtlMs, but it
//    ends as soon as a poll finds the lease gone. So a holder that died costs the
//    others kLeaseTtlMs (then one of them compiles), a slow compile is still waited
//    for, and a holder that never uploads stops blocking others after the bound. The
//    bound follows the compile times measured here: kLeaseBoundFactor times the
//    longest of the last kLeaseSamples (lease taken to upload done), clamped to
//    [kLeaseBoundMin, kLeaseBoundMax]; kLeaseBoundFirst before any was measured.
//  - Negative entries the kernel caches for a name that could be an entry last
//    kNegativeTimeoutS only, so an entry another node published is found soon after.
//  - Write-behind: entries changed in the db (populated, a stem member, imported,
//    renamed: the events log, whoever wrote them) are uploaded once settled (no write
//    lease, no change for kSettle, kSettleLeased for an entry whose compile lease this
//    node holds; an entry whose compiler writes a last file, Triton's group file or
//    the .so of Inductor's C++ kernel, waits for it (core::Completion) up to
//    kSettleUnmarked, and goes at once once marked if leased), from a queue of at most kMaxQueued
//    entries; more are dropped and counted (remote_upload_dropped). Entries this tier pulled are
//    not uploaded back. An upload that fails is tried again a few times, further apart each time
//    (kMaxUploadTries), then left to `kcache remote push`. Nothing is uploaded with
//    --remote-read-only.
//  - Prefetch (--prefetch-job-tag T): start() begins one thread that pulls every entry
//    of job T into the db with Remote::pull_job (what `kcache remote pull --job-tag T`
//    does), in batches (remote.hpp), while the mount serves: no FUSE thread waits for it
//    and the mount does not wait for it to come up. Entries it pulled are not uploaded
//    back and count remote_prefetched(_bytes). stop() ends it after the transaction in
//    progress (remote.hpp's pull_entries).
//  - Job tag (--job-tag T): every entry the uploader uploads, or finds already in the
//    shared tier, is added to job T's set (Remote::push's job tag), and so is every entry
//    this tier pulled (read through, or prefetched from another job): a later job or a
//    restart with --prefetch-job-tag T gets them all. A read-through adds its entry after
//    its waiters were answered; a failure to add is counted and logged, never retried.
//  - Counts (the Remote's remote_* counters, remote_upload_queued/dropped,
//    remote_prefetched(_bytes)) are added to the db's statistics every second and at
//    stop().
//  - Misses across nodes (docs/misses.md): about every second the uploader takes up to
//    kExplainFamilies families of misses the classifier found "first" and compares them
//    with the members other nodes recorded in Redis (remote::explain_first_misses: one
//    pipeline per server, no LMDB transaction open while it waits); the request path
//    never asks Redis for this. A failed pass changes nothing and is tried again.
//  - Breakers: every second the uploader PINGs a server whose cool-down passed
//    (Remote::probe), so an idle daemon's breaker closes once Redis is back, and
//    publishes the servers' states when they changed: the remote_servers /
//    remote_breakers_open / remote_breakers_half_open gauges, and per server
//    kServerStateFile in the db directory (docs/stats.md). start() publishes them,
//    stop() sets the gauges to 0 and removes the file.
// Threads: kFetchers fetchers, one timer (deadlines), one uploader (events, settling,
// pushes, statistics, breakers), one lease keeper with renewed leases, one prefetcher
// while a prefetch runs. m_mutex (level 8, lock_order.hpp) guards the flights, the
// fetch queue, the miss memo, the pulled set, the leases and m_stop; nothing else is
// locked while it is held, and no callback runs under it. The Remote serializes
// operations per server itself.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kcache/core/events.hpp"
#include "kcache/core/layout.hpp"
#include "kcache/core/store.hpp"
#include "kcache/remote/remote.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class RemoteTier {
  public:
    using Clock = std::chrono::steady_clock;
    static constexpr double kNegativeTimeoutS = 1.0;
    static constexpr auto kMissMemo = std::chrono::seconds(1);
    static constexpr auto kSettle = std::chrono::seconds(1);
    // An entry this node holds the compile lease of settles sooner: other nodes wait for
    // it. Its files must come less than this apart (a compiler's burst of writes after
    // its compile; a file held open for writing keeps it unsettled however long).
    // A compiler that marks its entries complete (core::Completion: Triton's group file,
    // the .so g++ builds from Inductor's .cpp) is waited for instead: a leased entry goes once
    // marked, an unmarked one of that compiler after kSettleUnmarked without change.
    static constexpr auto kSettleLeased = std::chrono::milliseconds(300);
    static constexpr auto kSettleUnmarked = std::chrono::seconds(30);
    // How often the uploader looks for settled entries while this node holds leases
    // (others wait for those uploads), and while it holds none.
    static constexpr auto kUploadTickLeased = std::chrono::milliseconds(20);
    static constexpr auto kUploadTick = std::chrono::milliseconds(250);
    static constexpr std::size_t kMaxQueued = 1024;  // entries waiting to settle or upload
    static constexpr std::size_t kMaxFlights = 256;  // pulls pending or running
    static constexpr int kFetchers = 2;
    static constexpr auto kLeasePoll = std::chrono::milliseconds(100);
    static constexpr std::size_t kMaxLeases = 4096;  // leases held: a bound (they expire anyway)
    static constexpr auto kLeaseRenew = std::chrono::milliseconds(1000);
    static constexpr auto kLeaseBoundFirst = std::chrono::seconds(30);
    static constexpr auto kLeaseBoundMin = std::chrono::seconds(10);
    static constexpr auto kLeaseBoundMax = std::chrono::seconds(600);
    static constexpr int kLeaseBoundFactor = 4;
    static constexpr std::size_t kLeaseSamples = 32;
    // A failed upload (Redis down, frozen, circuit open, full) is tried again after
    // 2, 4, 8, 16 s; after kMaxUploadTries it is left to `kcache remote push`.
    static constexpr unsigned kMaxUploadTries = 5;
    // Names of entries this tier pulled, so that they are not uploaded back (a bound:
    // past it the set is cleared, and Redis answers such an upload "already remote").
    static constexpr std::size_t kMaxPulled = 1u << 16;
    static constexpr const char* kServerStateFile = "remote-servers.json";
    static constexpr std::size_t kExplainFamilies = 64;  // families read per pass, at most
    // Container paths kept in memory (remote.hpp's container set), at most; past it the
    // rest are not found (logged). Inductor and ccache make a few thousand.
    static constexpr std::size_t kMaxContainers = 1u << 18;

    // Fails (EINVAL) for invalid options, as Remote::create does. Starts no thread.
    // `prefetch_job_tag`: the job whose entries start() prefetches (empty: none).
    // `job_tag`: the job whose set every entry uploaded or pulled here joins (empty: none;
    // EINVAL with a read-only remote).
    static core::Result<std::unique_ptr<RemoteTier>> create(core::Store& store,
                                                            remote::Options options,
                                                            std::string prefetch_job_tag = {},
                                                            std::string job_tag = {});
    ~RemoteTier();
    RemoteTier(const RemoteTier&) = delete;
    RemoteTier& operator=(const RemoteTier&) = delete;

    void start();
    // Answers every waiting lookup (a miss), stops the threads (a fetcher in a pull
    // finishes it first: at most a deadline), records the counts. Idempotent.
    void stop();

    // What a lookup of `name` in `parent`, which the db lacks, may find in the shared
    // tier. Reads `txn` and memory only, never Redis:
    //  - entry: the entry it could be fetched as (read_through(name)): an entry directory
    //    or stem file a compiler's layout rule would form there, or any name inside an
    //    entry directory that has no file yet (Triton's makedirs(<key>) then probing
    //    its files);
    //  - container: a directory the shared tier holds entries below (Inductor's
    //    fxgraph/<xx>/, ccache's <x>/<y>/: `name` is its path), which a node that never
    //    compiled there lacks. The caller makes it, as the looking-up process would
    //    have, and answers it; the compiler's next lookup goes on towards the entry;
    //  - unknown: it could be a container, but the containers were not read from Redis
    //    yet (just after start): ask again from when_containers_known();
    //  - none: nothing of the shared tier.
    // `may_appear`: another node may publish it soon (the kernel should keep a negative
    // answer for kNegativeTimeoutS only): any name that is not bookkeeping outside an
    // entry, or a candidate entry.
    struct Found {
        enum class Kind : std::uint8_t { none, entry, container, unknown };
        Kind kind = Kind::none;
        std::string name;  // entry: its name; container: its path
        bool may_appear = false;
    };
    Found find(const core::ReadTxn& txn, core::Ino parent, std::string_view name);
    // Runs `done` once the containers were read (or failed to be) for the first time,
    // or at stop(): at once when they were, else on the uploader thread (its first read
    // ends within one Redis deadline, or at once with the circuit open).
    void when_containers_known(std::function<void()> done);

    // Fetches `entry` into the db if Redis has it; `done` runs exactly once, on a tier
    // thread or (recent miss, overdue pull, too many pulls, stopped) on the caller's.
    void read_through(const std::string& entry, std::function<void()> done);

  private:
    struct Flight {
        Clock::time_point deadline;
        std::vector<std::function<void()>> waiters;
        bool overdue = false;     // its waiters were answered at the deadline; the pull goes on
        bool lease_wait = false;  // another node holds its compile lease: polled
        bool fetching = true;     // a pull of it is queued or running
        Clock::time_point next_poll{};  // lease waits: when to pull it again
    };
    struct Lease {  // a compile lease held here
        Clock::time_point taken;
        bool renewing = true;  // renewed leases: until uploaded or held for the bound
    };
    struct Pending {  // an entry waiting to settle before its upload
        std::uint64_t files = 0, bytes = 0;
        std::int64_t last_access_ns = 0;
        Clock::time_point since;
        // What its files' names said at its last change (core::Completion): it holds the
        // file its compiler writes last; its compiler writes such a file.
        bool marked = false, markable = false;
        unsigned failures = 0;           // uploads of it that failed so far
        Clock::time_point not_before{};  // after a failure: the next try
    };

    RemoteTier(core::Store& store, std::unique_ptr<remote::Remote> remote,
               std::string prefetch_job_tag, std::string job_tag);
    // Adds entries pulled here to m_job_tag's set (when set); logs a failure (rate-limited).
    void tag_pulled(const std::vector<std::string>& entries);
    void run_fetcher();
    void run_prefetch();
    // Publishes the servers' breaker states if they changed (or `stopping`: none).
    void publish_servers(bool stopping);
    void remember_pulled(const std::string& entry) REQUIRES(m_mutex);
    // True at most once every 10 s (m_last_warning_ns): failures are counted always,
    // logged only then. Any thread; takes no lock.
    bool may_warn();
    void run_timer();
    // Uploads what changed in the db after `events` (taken in start(), before the mount
    // serves: a store made before this thread first runs is not missed).
    void run_uploader(core::EventCursor events);
    // Queues the entries of new events for settling (uploader thread only).
    void follow_events(core::EventCursor& events);
    // Takes the pending entries that settled out of m_pending (uploader thread only).
    std::vector<std::pair<core::Ino, std::string>> settled();
    void record_counts();
    // One pass of remote::explain_first_misses (uploader thread only; logs a failure).
    void explain_misses();
    const std::vector<core::LayoutRule>* rules(const std::string& text);
    // Reads the container set when it changed (SCARD; SMEMBERS when the count differs),
    // and the first time answers when_containers_known()'s waiters (uploader thread only).
    void sync_containers();

    core::Store& m_store;
    std::unique_ptr<remote::Remote> m_remote;
    const Clock::duration m_deadline;  // of a read-through: connect + one operation

    Mutex m_mutex KCACHE_LEVEL(8);  // a leaf
    CondVar m_fetch_wake;           // a fetch queued, or stop
    CondVar m_timer_wake;           // a flight began, or stop
    CondVar m_upload_wake;          // stop
    CondVar m_lease_wake;           // stop
    bool m_stop GUARDED_BY(m_mutex) = false;
    bool m_started GUARDED_BY(m_mutex) = false;
    std::unordered_map<std::string, Flight> m_flights GUARDED_BY(m_mutex);
    std::deque<std::string> m_fetch_queue GUARDED_BY(m_mutex);
    // Entry -> when its miss memo ends.
    std::unordered_map<std::string, Clock::time_point> m_missed GUARDED_BY(m_mutex);
    std::unordered_set<std::string> m_pulled GUARDED_BY(m_mutex);  // pulled here: not uploaded back
    // Compile leases held here.
    std::unordered_map<std::string, Lease> m_leases GUARDED_BY(m_mutex);
    // The last kLeaseSamples: taken to uploaded.
    std::deque<Clock::duration> m_lease_times GUARDED_BY(m_mutex);
    Clock::duration m_lease_bound GUARDED_BY(m_mutex) = kLeaseBoundFirst;
    const std::string m_owner;  // this daemon in lease values: host:pid
    // A pull that found no manifest, with leases on: the lease decided (m_mutex not held).
    // `taken`: what the pull's lease step said (Remote::LeaseAsk: true ours, false
    // another's); nullopt: not asked or undecided, so it is asked here. True when the
    // flight goes on waiting (its waiters are kept).
    bool lease_after_miss(const std::string& entry, std::optional<bool> taken);
    // A lease's time to live: kLeaseTtlMs with renewed leases, else --remote-lease-ms.
    std::int64_t lease_ttl_ms() const {
        return renewed_leases() ? remote::Options::kLeaseTtlMs : m_remote->options().lease_ms;
    }
    bool renewed_leases() const {
        return m_remote->options().lease_ms == remote::Options::kLeaseRenewed;
    }
    // The uploader uploaded `entry`: forgets its lease (measuring how long it was held)
    // and says whether this node held one. m_mutex not held.
    bool lease_uploaded(const std::string& entry);
    void run_lease_keeper();

    Mutex m_rules_mutex KCACHE_LEVEL(8);  // the db's layout rules, parsed once per text
    std::string m_rules_text GUARDED_BY(m_rules_mutex);
    std::optional<std::vector<core::LayoutRule>> m_rules GUARDED_BY(m_rules_mutex);

    // The shared tier's containers (find()); written by sync_containers().
    Mutex m_containers_mutex KCACHE_LEVEL(8);  // a leaf
    std::unordered_set<std::string> m_containers GUARDED_BY(m_containers_mutex);
    bool m_containers_known GUARDED_BY(m_containers_mutex) = false;  // read once (or failed)
    std::vector<std::function<void()>> m_container_waiters GUARDED_BY(m_containers_mutex);

    // Uploader thread only.
    std::uint64_t m_containers_count = 0;  // SCARD when m_containers was read
    std::unordered_map<core::Ino, Pending> m_pending;
    std::uint64_t m_explained_seq = 0;     // misses asked about up to here (explain_misses)
    Mutex m_record_mutex KCACHE_LEVEL(8);  // record_counts() from the uploader and stop()
    // What record_counts() already added to the db.
    remote::Counts m_recorded GUARDED_BY(m_record_mutex);
    std::atomic<std::uint64_t> m_queued{0}, m_dropped{0};
    std::uint64_t m_recorded_queued GUARDED_BY(m_record_mutex) = 0;
    std::uint64_t m_recorded_dropped GUARDED_BY(m_record_mutex) = 0;

    const std::string m_prefetch_tag;
    const std::string m_job_tag;  // --job-tag: empty when none
    std::atomic<std::uint64_t> m_prefetched{0}, m_prefetched_bytes{0};
    std::uint64_t m_recorded_prefetched GUARDED_BY(m_record_mutex) = 0;
    std::uint64_t m_recorded_prefetched_bytes GUARDED_BY(m_record_mutex) = 0;
    std::atomic<std::uint64_t> m_lease_waits{0}, m_lease_timeouts{0};
    std::uint64_t m_recorded_lease_waits GUARDED_BY(m_record_mutex) = 0;
    std::uint64_t m_recorded_lease_timeouts GUARDED_BY(m_record_mutex) = 0;
    // What publish_servers() wrote last.
    std::string m_published_servers GUARDED_BY(m_record_mutex);

    std::atomic<std::int64_t> m_last_warning_ns{0};  // failures are logged at most every 10 s

    std::vector<std::thread> m_threads;
};

}  // namespace kcache::fsd
