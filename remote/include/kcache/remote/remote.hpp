// The shared tier: entries of a local db pushed to and pulled from Redis servers
// (protocol in src/protocol.hpp and src/keys.hpp; docs/operations.md says how
// to run it).
//
// Contract:
//  - Every remote operation has a deadline (Options::op_timeout_ns; connecting has
//    Options::connect_timeout_ns) kept by kcache itself over non-blocking sockets, so a
//    dead or frozen Redis costs at most one deadline per operation and server. A
//    server that keeps failing opens its circuit breaker: its operations then fail at
//    once (EAGAIN) until a cool-down has passed, when one trial operation may close it.
//  - A failed remote operation changes nothing in the local db. A pull verifies every
//    file against its XXH3-128 digest before anything is written and writes a whole
//    entry in one transaction (a batch may put several whole entries in one); a corrupt blob is
//    dropped (never stored, and deleted from Redis unless read-only), a manifest whose blob is gone
//    is a miss.
//  - A blob the pusher stores as a zstd frame travels as that frame, with the trained
//    dictionary it needs under its portable digest (core/frames.hpp); the puller checks
//    the dictionary's digest and the frame's content before it stores the frame as it is.
//    A frame whose dictionary is gone is a miss, a bad one corrupt; either way the frame
//    and its manifest are deleted from Redis so that the next push sends them again.
//  - The password is held in memory only: it never appears in a message, a URL or a
//    log line.
//  - A Remote is thread-safe: each server's connection and breaker are guarded by that
//    server's mutex, so operations on one server are serialized; counts are atomic.
//  - Redis Cluster (Options::cluster, `redis-cluster://`): the slots are discovered with
//    CLUSTER SLOTS on first use, every command goes to the master of its key's slot
//    (pipelined per node), MOVED and ASK are followed (a few hops at most), and the map
//    is read again after a MOVED, a CLUSTERDOWN or a node's failure (at most every
//    kRefreshNs). Each node has its own connection, deadlines and circuit breaker, so
//    a dead master costs its slots' operations one deadline each until its breaker
//    opens, then nothing until its replica is promoted and the map names it.
//  - SIGPIPE is set to be ignored when a Remote is created (unless a handler is
//    installed): a write to a connection the server closed must be an error, not death.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/misses.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/thread_annotations.hpp"
#include "kcache/remote/trust.hpp"

namespace kcache::remote {

struct Reply;   // src/client.hpp
class Backend;  // src/backend.hpp: the tier's transport seam
struct Shard;   // src/backend.hpp
using core::Result;
using core::Status;

// One Redis server: `redis://[user@]host:port[/db]`, `rediss://[user@]host:port[/db]`
// (TLS, verified against Options::tls) or `unix:/path/to/socket[?db=N]`.
// A password inside the URL (`user:password@`) is refused: it would show in process
// listings and logs; give it through an environment variable or a file instead.
struct Endpoint {
    bool unix_socket = false;
    bool tls = false;  // rediss://: TLS to host:port, the certificate checked against host
    std::string host;  // tcp
    std::uint16_t port = 6379;
    std::string path;  // unix socket
    std::string user;  // ACL user; empty: the default user
    unsigned db = 0;   // SELECT db
    // The canonical form, without any secret: the server's identity for sharding
    // (every node must name a server the same way) and its name in messages.
    std::string id() const;
};
Result<Endpoint> parse_endpoint(std::string_view url);
// The seed nodes of `redis-cluster://[user@]host:port[,host:port...]` (TCP only, db 0:
// a cluster has no other), or of `rediss-cluster://...`: TLS to the seeds and to every
// node their slot map names. EINVAL naming the fault otherwise.
Result<std::vector<Endpoint>> parse_cluster_url(std::string_view url);

// The password from the environment variable `env_name` (when non-empty and set) or
// else the first line of `file` (when non-empty). EINVAL when an explicitly named
// variable is unset or the file cannot be read; the message never holds the secret.
Result<std::string> load_password(const std::string& env_name, const std::string& file);

// TLS to `rediss://` servers (remote/src/tls.hpp): the server's certificate must chain
// to a CA of `ca_file` and name the host its URL names; nothing falls back to plaintext.
struct TlsOptions {
    std::string ca_file;    // PEM CA certificates; empty: the system's store
    std::string cert_file;  // a client certificate (PEM) for servers that ask for one
    std::string key_file;   // its private key (PEM, no passphrase); with cert_file only
    bool any() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

struct Options {
    std::vector<Endpoint> servers;  // keys are sharded over them by rendezvous hashing
    // The servers are seed nodes of one Redis Cluster: keys go where its slot map says.
    bool cluster = false;
    std::string password;        // AUTH [user] password; empty: no AUTH
    std::string ns = "default";  // namespace: keys live under kc2:<ns>: (protocol.hpp)
    std::int64_t connect_timeout_ns = 1'000'000'000;
    std::int64_t op_timeout_ns = 2'000'000'000;  // one round trip (or one pipeline)
    bool read_only = false;                      // never write (push refused, corrupt blobs kept)
    TlsOptions tls;                              // for the rediss:// servers
    unsigned breaker_threshold = 2;  // consecutive failures that open a server's circuit
    std::int64_t breaker_cooldown_ns = 5'000'000'000;  // first cool-down; doubles, capped
    std::int64_t oom_pause_ns = 30'000'000'000;        // uploads pause this long after an OOM reply
    // kcache-fsd --remote-lease-ms: a node that misses an entry everywhere takes a lease
    // of this many ms on compiling it (SET NX PX); the others wait for its manifest at
    // most that long. 0: no leases. kLeaseRenewed (kcache-fsd's default): a lease of
    // kLeaseTtlMs that its holder renews while it compiles, for as long as the compile
    // times it measured allow (fsd/src/tier/remote_tier.hpp), so that a dead holder costs the
    // others kLeaseTtlMs and a slow compile is still waited for.
    static constexpr std::int64_t kLeaseRenewed = -1;
    static constexpr std::int64_t kLeaseTtlMs = 5000;
    std::int64_t lease_ms = 0;
    // Signed entries (kcache/remote/trust.hpp; docs/operations.md, "Trust model").
    // signing_key: a private key file (kcache keys generate): every entry pushed is
    // signed with it; empty: pushes are unsigned. trusted_keys: a trust file (its rule:
    // check_trust_file); set, a pull accepts only entries signed by a key it trusts and
    // whose files match their signed SHA-256s, anything else is a miss with its cause
    // (Outcome::rejected); empty: every entry is accepted, signed or not (the insecure
    // default, as before signing; a signed one is still checked against its own key).
    std::string signing_key;
    std::string trusted_keys;
};
// EINVAL for an empty server list, a bad namespace (1-64 of [A-Za-z0-9._-]), a
// non-positive timeout, a cluster seed that is a unix socket or names a db, cluster
// seeds that mix TLS and plaintext, TLS files without a rediss:// server, or a client
// certificate without its key (or a key without its certificate).
Status validate(const Options& options);

// What a Remote has done since it was made, one row per counter: `name` is the field of
// Counts and AtomicCounts, and core::Counter::remote_<name> its statistic (a row of
// core's kStatistics, statistics.hpp). Adding a counter: its row in kStatistics, then
// one line here; Counts, AtomicCounts, their difference and record_counts() follow.
#define KCACHE_REMOTE_COUNTS(X)                                                      \
    X(hits)                                                                          \
    X(misses)                                                                        \
    X(errors)                                                                        \
    X(timeouts)                                                                      \
    X(corrupt)                                                                       \
    X(dangling)                                                                      \
    X(bytes_up)                                                                      \
    X(bytes_down)                                                                    \
    X(uploads)                                                                       \
    X(upload_skipped)                                                                \
    X(family_errors)     /* family members not recorded or not read */               \
    X(rejected_unsigned) /* pulls refused by the trust policy (Outcome::rejected) */ \
    X(rejected_untrusted)                                                            \
    X(rejected_revoked)                                                              \
    X(rejected_bad)

// A snapshot of the counts (Remote::counts()). Add them to a db's statistics with
// record_counts().
struct Counts {
#define KCACHE_REMOTE_COUNT_FIELD(name) std::uint64_t name = 0;
    KCACHE_REMOTE_COUNTS(KCACHE_REMOTE_COUNT_FIELD)
#undef KCACHE_REMOTE_COUNT_FIELD
    // What happened since `earlier` (a snapshot of the same Remote), counter by counter.
    Counts operator-(const Counts& earlier) const;
    // Whether any counter is non-zero.
    bool any() const;
};

// The counts as a Remote keeps them: each counter atomic, added to from any thread.
struct AtomicCounts {
#define KCACHE_REMOTE_COUNT_FIELD(name) std::atomic<std::uint64_t> name{0};
    KCACHE_REMOTE_COUNTS(KCACHE_REMOTE_COUNT_FIELD)
#undef KCACHE_REMOTE_COUNT_FIELD
    Counts load() const;
};

enum class Outcome : std::uint8_t {
    uploaded,        // push: its manifest was written by us
    already_remote,  // push: the manifest was there (first writer wins): nothing sent
    pulled,          // pull: written into the local db
    already_local,   // pull: the local db already had an entry of that name
    miss,            // pull: no manifest
    dangling,        // pull: the manifest names a blob that is gone (a miss)
    corrupt,         // pull: a blob or the manifest failed its check: nothing stored
    rejected,        // pull: refused by the trust policy (EntryResult::rejection): a miss
};
std::string_view outcome_name(Outcome o);

// Why a pull refused an entry (Options::trusted_keys): a miss, nothing stored, the
// manifest left in Redis (other nodes may trust it).
enum class Rejection : std::uint8_t {
    none,
    unsigned_entry,  // no signature, and a trust file is set
    untrusted,       // signed by a key the trust file does not name
    revoked,         // signed by a key the trust file revokes
    bad,             // the signature does not hold for this namespace and name, or a file's bytes
                     // differ from its signed SHA-256
};
std::string_view rejection_name(
    Rejection r);  // "unsigned", "untrusted", "revoked", "bad signature"

struct EntryResult {
    Outcome outcome = Outcome::miss;
    // pull() with a LeaseAsk, on a miss: true when the caller now holds the entry's
    // compile lease, false when another does; nullopt: not asked, or not decided (the
    // lease step failed: a plain miss).
    std::optional<bool> lease_taken;
    std::uint64_t files = 0;
    std::uint64_t bytes = 0;                // logical bytes of the entry's files
    std::string detail;                     // why, for dangling / corrupt / rejected
    Rejection rejection = Rejection::none;  // rejected: the cause
    std::string signer;  // pushed or pulled signed: the key's id (PublicKey::id()); else empty
};

// What pull_entries() / pull_job() did, in total.
struct PullSummary {
    std::uint64_t pulled = 0, already_local = 0, missing = 0,
                  failed = 0;        // missing: miss, dangling, corrupt
    std::uint64_t pulled_bytes = 0;  // logical bytes of the entries pulled
};
// Sees each entry as soon as its pull ended (an error fails that entry only); returning
// false stops the pulls once the entries already written are seen (pull_entries).
using PullProgress =
    std::function<bool(const std::string& entry, const Result<EntryResult>& result)>;

// A server's state, for `kcache remote stats`.
struct ServerState {
    std::string id;
    std::string breaker;          // "closed", "open", "half-open"
    bool uploads_paused = false;  // after an OOM reply, until the pause ends
    std::uint64_t failures = 0;   // consecutive
};

class Remote {
  public:
    // The tier on Redis (the servers of `options`: src/redis_pool.hpp).
    static Result<std::unique_ptr<Remote>> create(Options options);
    // The tier on another Backend (src/backend.hpp; tests run it on an in-memory one):
    // `make` builds it for the Remote's options (which outlive it), counting its failures,
    // timeouts and bytes in the counts given.
    using MakeBackend =
        std::function<Result<std::unique_ptr<Backend>>(const Options&, AtomicCounts&)>;
    static Result<std::unique_ptr<Remote>> create(Options options, const MakeBackend& make);
    ~Remote();
    Remote(const Remote&) = delete;
    Remote& operator=(const Remote&) = delete;

    // Uploads one entry of `store` (by its exact name): blobs the remote lacks first,
    // then the manifest with SET NX (first writer wins), then adds the entry to the
    // job's set when `job_tag` is non-empty. An entry it uploaded whose layout names a
    // family also has its family member recorded (record_family_member, read from the
    // push's snapshot): a failure there is counted (family_errors), the push succeeds.
    // With Options::signing_key the manifest is signed (the result names the signer), and
    // a manifest already there that this node's own policy would refuse (unsigned, bad,
    // untrusted or revoked under its trust file) is replaced rather than kept. EROFS when
    // read-only, ENOSPC while uploads are paused by an OOM reply, ETIMEDOUT / EIO / EAGAIN (circuit
    // open) on failure.
    Result<EntryResult> push(const core::Store& store, std::string_view entry,
                             std::string_view job_tag = {});
    // Misses explained across nodes (core/misses.hpp's family members; keys and script
    // in src/families.hpp). record_family_member: adds `member` (its host set to this
    // node's) to its family's members, keeping the newest kMaxMembers, for 30 days after
    // the family's last record; EROFS when read-only. family_members: the members of each
    // of `families` (HGETALL, one pipeline per server), in the order given; a member that
    // does not decode is passed over and counted corrupt. Any failure fails them all.
    Status record_family_member(const core::FamilyMember& member);
    Result<std::vector<std::vector<core::FamilyMember>>> family_members(
        const std::vector<std::string>& families);
    // Fetches one entry by name into `store`, verified, in one write transaction.
    // With `lease`, a miss also takes the entry's compile lease for `lease->owner` unless
    // another holds it (EntryResult::lease_taken), in the same round trip as the manifest's
    // GET (a script that takes it only while no manifest is there): kcache-fsd's
    // read-through, so that a miss costs one round trip. Not with a read-only remote.
    struct LeaseAsk {
        std::string owner;
        std::int64_t ttl_ms = 0;
    };
    Result<EntryResult> pull(core::Store& store, std::string_view entry,
                             const LeaseAsk* lease = nullptr);
    // Containers: the directories above the entries pushed (protocol.hpp's container
    // set), so that a node whose tree lacks them finds the entries below them (kcache-fsd
    // answers a lookup of one as a directory). push() adds its entry's containers, each
    // at most once per Remote (a failure fails the push, which is tried again). The set
    // only grows: an entry evicted from Redis leaves its containers named, which costs a
    // node an empty directory at most. container_count: SCARD (one cheap round trip to
    // see whether it grew); containers: SMEMBERS, every path, unsorted.
    Result<std::uint64_t> container_count();
    Result<std::vector<std::string>> containers();
    // The entry names of a job's set (sorted).
    Result<std::vector<std::string>> job_entries(std::string_view job_tag);
    // Adds `entries` to a job's set (SADD, in batches): what push() does with its
    // `job_tag`, for entries this node did not push (kcache-fsd --job-tag: entries it read
    // through or prefetched). EROFS when read-only; EINVAL for a bad tag.
    Status add_to_job(std::string_view job_tag, const std::vector<std::string>& entries);
    // Pulls `entries` as pull() does, with the same checks, but in batches: the manifests
    // of up to kPullBatch entries in one pipeline per server, then the blobs those entries
    // lack (header and chunks together, about 8 MiB a pipeline), then whole entries a few
    // to a write transaction (about 8 MiB; an entry that fails to write is retried alone,
    // so it never takes others with it). A failure fails its entries, not the others
    // (fast once a server's circuit is open); `progress` sees each entry once it is
    // written or failed, in the order given; once it returned false the pulls stop after
    // it has seen the rest of the transaction just written. The one loop behind `kcache
    // remote pull` and kcache-fsd --prefetch-job-tag.
    static constexpr std::size_t kPullBatch = 64;
    // The containers push() remembers having added (a bound: past it they are forgotten
    // and added again, which Redis ignores).
    static constexpr std::size_t kMaxContainersRecorded = 1u << 16;
    PullSummary pull_entries(core::Store& store, const std::vector<std::string>& entries,
                             const PullProgress& progress = {});
    // job_entries() then pull_entries(): an error only when the job's set cannot be read.
    Result<PullSummary> pull_job(core::Store& store, std::string_view job_tag,
                                 const PullProgress& progress = {});
    // Compile leases (kcache-fsd --remote-lease-ms; protocol.hpp's lease key, on the
    // server (or cluster slot) of the entry's manifest). acquire_lease: SET NX PX: true when
    // `owner` now holds it, false when another does. release_lease: deletes it if `owner` holds it
    // (a script compares and deletes in one step). lease_held: whether anyone holds it.
    // EROFS when read-only (acquire, release); the usual errors otherwise.
    Result<bool> acquire_lease(std::string_view entry, std::string_view owner, std::int64_t ttl_ms);
    Status release_lease(std::string_view entry, std::string_view owner);
    // Sets the lease's time to live to `ttl_ms` if `owner` still holds it (one script):
    // true when it did, false when the lease is gone or another's.
    Result<bool> renew_lease(std::string_view entry, std::string_view owner, std::int64_t ttl_ms);
    Result<bool> lease_held(std::string_view entry);
    // PING every server (a cluster: every master): per server, in servers()'s order,
    // empty on success or the error message.
    std::vector<std::string> ping();
    // PINGs each server whose circuit is open and whose cool-down has passed: the trial
    // that closes the circuit (or opens it again), so that an idle client's breaker
    // recovers without traffic. The number of servers tried; none touches a closed or
    // still cooling server.
    std::size_t probe();

    Counts counts() const;
    void count_family_error() { m_counts.family_errors.fetch_add(1); }
    std::vector<ServerState> servers();
    const Options& options() const { return m_options; }
    // Whether pulls check signatures against a trust file (Options::trusted_keys); false:
    // the tier is unverified (anything any writer puts there is accepted).
    bool verifying() const { return m_trust.has_value(); }

    static constexpr std::int64_t kRefreshNs = 200'000'000;  // slot map reads, at most

  private:
    explicit Remote(Options options);
    // The backend's: the shard that holds `key`, one pipeline on a shard (backend.hpp).
    Shard& shard(std::string_view key);
    Result<std::vector<Reply>> exec(Shard& shard,
                                    const std::vector<std::vector<std::string>>& commands);
    bool uploads_paused(Shard& shard);
    // A server's error reply as an Error (ENOSPC for OOM, EACCES for NOPERM), counted.
    core::Error reply_error(const Shard& shard, const Reply& reply, std::string_view what);
    // push(): the entry's family member from its snapshot (nullopt: no family, or it
    // could not be read: counted), and its record once uploaded (a failure counted).
    std::optional<core::FamilyMember> family_member_of(const core::Txn& txn,
                                                       const core::EntryInfo& entry);
    void record_member(const std::optional<core::FamilyMember>& member);
    Status upload_blob(Shard& shard, const core::Digest& digest, std::string_view content);
    // push()'s blobs (stored frames, or content) and the dictionaries their frames need
    // (transfer.cpp); send_blobs() sends what the remote lacks, dictionaries first.
    struct Outgoing;
    Status send_blobs(const Outgoing& outgoing);
    // pull() and pull_entries() (pull.cpp): pulls `names` in batches, calling `each` with
    // every entry's result in order; false when `each` stopped it.
    struct Wanted;             // a blob a batch needs (pull.hpp)
    struct PullItem;           // an entry of a batch (pull.hpp)
    struct PullGroup;          // a group of a batch's entries: blobs, checks, writes (pull.cpp)
    struct BlobFetch;          // one shard's blobs, fetched (pull_blobs.cpp)
    struct FrameDictionaries;  // the dictionaries of a group's frames (pull.hpp)
    bool pull_batches(core::Store& store, const std::vector<std::string>& names,
                      const std::function<bool(std::size_t, Result<EntryResult>)>& each,
                      const LeaseAsk* lease = nullptr);
    // A batch's steps: the entries here already, the manifests (decoded and checked as
    // entry images: take_manifest, one reply and its lease script's), then a group's
    // blobs and writes (false: `report_through` stopped).
    void mark_local(core::Store& store, std::vector<PullItem>& items);
    void fetch_manifests(std::vector<PullItem>& items, const LeaseAsk* lease);
    void take_manifest(Shard& holder, PullItem& item, const Reply& reply, const Reply* lease_reply,
                       std::vector<std::vector<std::string>>& dels);
    bool pull_group(core::Store& store, std::vector<PullItem>& items, std::size_t first,
                    std::size_t last, const std::function<bool(std::size_t)>& report_through);
    // Fetches the blobs from their shards, pipelined, each checked against its digest
    // (a frame: once resolve_frames has its dictionary).
    void fetch_blobs(std::vector<Wanted*>& blobs);
    // The dictionaries of the frames among `blobs` (from the db when it has them, else
    // the backend, each checked against its digest), then each frame's content against
    // its blob's digest. A frame whose dictionary is gone is dangling, a bad one corrupt;
    // either way it is dropped from the backend. `dictionaries` gets the ones looked for.
    void resolve_frames(core::Store& store, std::vector<Wanted*>& blobs,
                        FrameDictionaries& dictionaries);
    // A rejected item's outcome, cause and count (pull.cpp).
    void reject(PullItem& item, Rejection why, std::string detail);
    Options m_options;
    // Loaded by create() from Options::signing_key / trusted_keys; fixed afterwards.
    std::optional<SigningKey> m_signing_key;
    std::optional<TrustFile> m_trust;
    // push(): adds the containers of `entry` that this Remote has not added yet.
    Status record_containers(std::string_view entry);
    Mutex m_containers_mutex;
    std::unordered_set<std::string> m_containers_recorded GUARDED_BY(m_containers_mutex);
    AtomicCounts m_counts;               // the backend counts errors, timeouts and bytes here too
    std::unique_ptr<Backend> m_backend;  // after m_options and m_counts: it uses them
};

// One pass of explaining misses across nodes (docs/misses.md, "Across nodes"): takes
// the misses of `store` classified first after `after_seq` (oldest first) whose
// families are among the first `max_families` met, reads those families' members from
// Redis (one pipeline per server, no LMDB transaction open meanwhile), and compares each
// miss with the closest member (core::explain_with_members), which rewrites it as a
// changed or unstable key. On success `after_seq` moves past every miss asked about; a
// failure to read the families (a dead or frozen Redis, an open circuit) is returned,
// counted (family_errors) and changes nothing, so the next pass asks again.
struct ExplainPass {
    std::size_t misses = 0, families = 0, explained = 0;
};
Result<ExplainPass> explain_first_misses(Remote& remote, core::Store& store,
                                         std::uint64_t& after_seq, std::size_t max_families = 64);

// Adds `counts` to the db's remote_* statistics in one write transaction.
Status record_counts(core::Store& store, const Counts& counts);

// Names accepted for a job tag: 1-128 of [A-Za-z0-9._:-].
Status validate_job_tag(std::string_view tag);

}  // namespace kcache::remote
