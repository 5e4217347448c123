// kcache-fsd --remote: two daemons with separate dbs share one redis-server. What a
// compiler stores through mount A (plain file I/O, Triton's layout) is read through
// mount B byte-exact, however B asks for it (a lookup of the entry, Triton's
// makedirs(<key>) then probing files, a probe inside an entry directory B already had
// empty); a frozen Redis leaves B's local hits as they were and answers its misses
// (ENOENT) by the deadline, counted; after SIGCONT sharing works again. A daemon
// started with --prefetch-job-tag has the job's entries in its db before anything asks
// for them; with --job-tag every entry a daemon uploads, finds in Redis or pulls joins
// the job's set; `kcache stats` shows each server's breaker (open while Redis is stopped,
// closed after it is back, nothing once the daemon stopped).

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "mount_fixture.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::DaemonOptions;
using kcache::test::MountedCache;
using kcache::test::RedisServer;
namespace test = kcache::test;
namespace proto = kcache::remote::proto;

namespace {

// Triton's cache keys: base32 of a sha256, 52 characters.
const std::string kKey1 = "JYS2XUOUG4VYYBXBZYN7QL4E6AX3B7AXEAKLO5N3NS5ZC6WRD4GQ";
const std::string kKey2 = "Q7LZ3WJ5UE2RS4VN6KXA3MBY7DHC2PGTF5OIQ4ZL6NW3RT2XYKAA";
const std::string kKey3 = "B3NDK7QWZ2LX5RM4UVJ6YTH2CPA7SGEF4NOIQ5ZK6LW3XT2RYMBB";
const std::string kKey4 = "C4PEL8RXA3MY6SN5VWK7ZUI3DQB8THFG5OPJR6AL7MX4YU3SZNCC";

// Compile leases are on by default; the cases that are not about them turn them off, so
// that a name one mount missed never makes the other wait for its compile.
DaemonOptions with_remote(const RedisServer& redis, std::vector<std::string> extra = {}) {
    DaemonOptions o;
    o.args = {"--remote", redis.url(), "--remote-namespace", "fsd"};
    if (std::find(extra.begin(), extra.end(), "--remote-lease-ms") == extra.end())
        o.args.insert(o.args.end(), {"--remote-lease-ms", "0"});
    o.args.insert(o.args.end(), extra.begin(), extra.end());
    return o;
}

// A Triton-shaped entry: the group file, a binary, its IR and metadata.
std::map<std::string, std::string> triton_files(const std::string& key, std::uint64_t seed) {
    return {
        {"__grp__add_kernel.json",
         "{\"child_paths\": {\"add_kernel.cubin\": \"" + key + "/add_kernel.cubin\"}}"},
        {"add_kernel.cubin", test::random_bytes(std::size_t{300'000}, std::uint64_t{seed})},
        {"add_kernel.ptx", std::string(20'000, 'p') + std::to_string(seed)},
        {"add_kernel.json", "{\"name\": \"add_kernel\", \"seed\": " + std::to_string(seed) + "}"},
    };
}

// Stores the files as Triton does: mkdir, write each file to a temp dir, rename into
// place, the group file last (put_group follows the files it lists), `gap` apart.
void store(const MountedCache& m, const std::string& key,
           const std::map<std::string, std::string>& files,
           std::chrono::milliseconds gap = std::chrono::milliseconds(0)) {
    const std::string dir = m.p(key);
    if (::mkdir(dir.c_str(), 0755) != 0) REQUIRE(errno == EEXIST);
    const std::string tmp = dir + "/tmp.pid_1_abc";
    REQUIRE_SYS(::mkdir(tmp.c_str(), 0755));
    // Triton's order: the source, each stage's file as it ends, metadata, the group.
    const auto rank = [](const std::string& name) {
        int r = 0;
        for (const char* suffix : {".source", ".ttir", ".ttgir", ".llir", ".ptx", ".cubin"}) {
            if (name.ends_with(suffix)) return r;
            ++r;
        }
        return name.starts_with("__grp__") ? r + 1 : r;
    };
    std::vector<std::pair<std::string, std::string>> order(files.begin(), files.end());
    std::stable_sort(order.begin(), order.end(),
                     [&](const auto& x, const auto& y) { return rank(x.first) < rank(y.first); });
    for (const auto& [name, content] : order) {
        if (&name != &order.front().first) std::this_thread::sleep_for(gap);
        REQUIRE(test::write_all(tmp + "/" + name, content) == 0);
        REQUIRE_SYS(::rename((tmp + "/" + name).c_str(), (dir + "/" + name).c_str()));
    }
    REQUIRE_SYS(::rmdir(tmp.c_str()));
}

void require_same(const MountedCache& m, const std::string& key,
                  const std::map<std::string, std::string>& files) {
    for (const auto& [name, content] : files) {
        INFO(m.p(key + "/" + name));
        const auto got = test::read_all(m.p(key + "/" + name));
        REQUIRE(got.has_value());
        REQUIRE(got->size() == content.size());
        REQUIRE(*got == content);
    }
}

std::uint64_t stat_of(const MountedCache& m, const std::string& name) {
    return test::stat_value(test::cache_stats(m.db()), name);
}

// Waits (a hang guard, not a timing check) until mount A has uploaded `n` entries.
void wait_uploads(const MountedCache& a, std::uint64_t n) {
    const bool uploaded = test::wait_until([&] { return stat_of(a, "remote_uploads") >= n; }, 30);
    // What the daemon said and counted meanwhile (read now, not before the wait).
    INFO(a.daemon_stderr());
    INFO("remote_upload_queued " << stat_of(a, "remote_upload_queued") << ", remote_errors "
                                 << stat_of(a, "remote_errors") << ", remote_upload_dropped "
                                 << stat_of(a, "remote_upload_dropped"));
    REQUIRE(uploaded);
}

}  // namespace

TEST_CASE("fsd remote: an entry stored through mount A is read through mount B byte-exact",
          "[remote][fsd]") {
    RedisServer redis;
    MountedCache a(with_remote(redis));
    MountedCache b(with_remote(redis));
    const auto files1 = triton_files(kKey1, 1), files2 = triton_files(kKey2, 2);
    store(a, kKey1, files1);
    store(a, kKey2, files2);
    wait_uploads(a, 2);
    CHECK(stat_of(a, "remote_upload_queued") >= 2);
    CHECK(stat_of(a, "remote_upload_dropped") == 0);

    // A lookup of the entry's directory fetches it whole, then answers.
    struct stat st {};
    REQUIRE_SYS(::stat(b.p(kKey1).c_str(), &st));
    REQUIRE(S_ISDIR(st.st_mode));
    require_same(b, kKey1, files1);

    // Triton's makedirs(<key>, exist_ok=True): the mkdir's lookup finds the entry.
    REQUIRE_FAILS_WITH(::mkdir(b.p(kKey2).c_str(), 0755), EEXIST);
    require_same(b, kKey2, files2);

    // An entry directory B made empty before A published: a probe inside fetches it.
    REQUIRE_SYS(::mkdir(b.p(kKey3).c_str(), 0755));  // a remote miss: made empty
    const auto files3 = triton_files(kKey3, 3);
    store(a, kKey3, files3);
    wait_uploads(a, 3);
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until(
            [&] { return test::read_all(b.p(kKey3 + "/__grp__add_kernel.json")).has_value(); },
            30));
    }
    require_same(b, kKey3, files3);

    // B pulled them (remote hits); B has uploaded none of them back.
    REQUIRE(test::wait_until([&] { return stat_of(b, "remote_hits") >= 3; }, 30));
    CHECK(stat_of(b, "remote_uploads") == 0);
    CHECK(stat_of(b, "remote_corrupt") == 0);

    // A name Redis does not hold is a plain miss, counted.
    REQUIRE_FAILS_WITH(::access(b.p(kKey4).c_str(), F_OK), ENOENT);
    REQUIRE(test::wait_until([&] { return stat_of(b, "remote_misses") >= 1; }, 30));

    // Still B's after a remount, now without Redis: they are local entries.
    b.unmount();
    redis.signal(SIGKILL);
    b.mount();
    require_same(b, kKey1, files1);
}

TEST_CASE(
    "fsd remote: a frozen Redis leaves local hits alone, misses answer ENOENT by the deadline",
    "[remote][fsd]") {
    RedisServer redis;
    const std::vector<std::string> quick = {"--remote-timeout", "300ms", "--remote-connect-timeout",
                                            "300ms"};
    MountedCache a(with_remote(redis, quick));
    MountedCache b(with_remote(redis, quick));
    const auto files1 = triton_files(kKey1, 11);
    store(a, kKey1, files1);
    wait_uploads(a, 1);
    require_same(b, kKey1, files1);  // pulled: now local to B

    redis.signal(SIGSTOP);
    // Local hits: the same bytes, whatever Redis does.
    require_same(b, kKey1, files1);
    // Misses: ENOENT, once a deadline at most (the bound is a hang guard only).
    for (const std::string& key : {kKey2, kKey3, kKey4}) {
        const auto begin = std::chrono::steady_clock::now();
        REQUIRE_FAILS_WITH(::access(b.p(key).c_str(), F_OK), ENOENT);
        CHECK(std::chrono::steady_clock::now() - begin < std::chrono::seconds(20));
    }
    require_same(b, kKey1, files1);
    // A keeps storing locally; its upload fails and is counted.
    const auto files2 = triton_files(kKey2, 12);
    store(a, kKey2, files2);
    require_same(a, kKey2, files2);
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until(
            [&] { return stat_of(b, "remote_timeouts") + stat_of(b, "remote_errors") >= 1; }, 30));
        REQUIRE(test::wait_until(
            [&] { return stat_of(a, "remote_timeouts") + stat_of(a, "remote_errors") >= 1; }, 30));
    }

    redis.signal(SIGCONT);
    // Sharing works again once the circuits close by themselves.
    const auto files3 = triton_files(kKey3, 13);
    store(a, kKey3, files3);
    wait_uploads(a, 2);
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return ::access(b.p(kKey3).c_str(), F_OK) == 0; }, 40));
    }
    require_same(b, kKey3, files3);
}

TEST_CASE(
    "fsd remote: --prefetch-job-tag pulls a job's entries at mount: local hits, no read-through",
    "[remote][fsd]") {
    RedisServer redis;
    MountedCache a(with_remote(redis));
    const auto files1 = triton_files(kKey1, 21), files2 = triton_files(kKey2, 22),
               files3 = triton_files(kKey3, 23);
    store(a, kKey1, files1);
    store(a, kKey2, files2);
    store(a, kKey3, files3);  // not in the job: B must not have it
    wait_uploads(a, 3);
    // The job's set: what `kcache remote push --job-tag` of A's db adds to it.
    {
        const auto r =
            test::run_kcache(a.db(), {"remote", "--remote", redis.url(), "--remote-namespace",
                                      "fsd", "push", "--job-tag", "train-7", kKey1, kKey2});
        INFO(r.describe());
        REQUIRE(r.exit_code == 0);
    }

    MountedCache b(with_remote(redis, {"--prefetch-job-tag", "train-7"}));
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_prefetched") >= 2; }, 30));
    }
    const auto stats = test::cache_stats(b.db());
    CHECK(test::stat_value(stats, "remote_prefetched") == 2);
    std::uint64_t job_bytes = 0;
    for (const auto* files : {&files1, &files2}) {
        for (const auto& [name, content] : *files) job_bytes += content.size();
    }
    CHECK(test::stat_value(stats, "remote_prefetched_bytes") == job_bytes);
    CHECK(test::stat_value(stats, "entries") == 2);  // in B's db before anything asked for them

    // Reading them through B: local hits, Redis not asked (no GET of a manifest or blob).
    const std::uint64_t gets = redis.calls("get");
    require_same(b, kKey1, files1);
    require_same(b, kKey2, files2);
    CHECK(redis.calls("get") == gets);
    CHECK(stat_of(b, "remote_misses") == 0);
    // The entry outside the job is still read through on demand.
    require_same(b, kKey3, files3);
    CHECK(redis.calls("get") > gets);

    // Prefetched entries are not uploaded back (nor the read-through one).
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past the settle time
    CHECK(stat_of(b, "remote_uploads") == 0);
    CHECK(stat_of(b, "remote_upload_skipped") == 0);
}

TEST_CASE(
    "fsd remote: --job-tag puts what the daemon uploads, finds remote or pulls in the job's set, "
    "for a fresh daemon's --prefetch-job-tag",
    "[remote][fsd]") {
    RedisServer redis;
    // The members of a job's set, sorted.
    auto members = [&](const std::string& tag) {
        std::vector<std::string> names;
        for (const auto& e : redis.command({"SMEMBERS", proto::job_key("fsd", tag)}).elements)
            names.push_back(e.str);
        std::sort(names.begin(), names.end());
        return names;
    };
    const auto files1 = triton_files(kKey1, 51), files2 = triton_files(kKey2, 52),
               files4 = triton_files(kKey4, 54);
    // An entry of no compiler's layout (the depth fallback), published by renaming a
    // filled temp dir into place: no lookup reads it through (neither of its name nor
    // inside it while empty), so A stores its own copy and its uploader finds C's.
    const std::string shared = "shared-kernels";
    const std::map<std::string, std::string> files3 = {
        {"kernel.bin", test::random_bytes(std::size_t{30'000}, std::uint64_t{53})},
        {"kernel.json", "{\"seed\": 53}"}};
    auto store_plain = [&](const MountedCache& m) {
        const std::string tmp = m.p("tmp.pid_2_xyz");
        REQUIRE_SYS(::mkdir(tmp.c_str(), 0755));
        for (const auto& [name, content] : files3)
            REQUIRE(test::write_all(tmp + "/" + name, content) == 0);
        REQUIRE_SYS(::rename(tmp.c_str(), m.p(shared).c_str()));
    };

    MountedCache c(with_remote(redis));
    store_plain(c);
    wait_uploads(c, 1);
    CHECK(members("train-9").empty());

    MountedCache a(with_remote(redis, {"--job-tag", "train-9"}));
    store(a, kKey1, files1);
    store(a, kKey2, files2);
    store_plain(a);
    {
        INFO(a.daemon_stderr());
        REQUIRE(test::wait_until([&] { return members("train-9").size() >= 3; }, 30));
    }
    std::vector<std::string> job = {kKey1, kKey2, shared};
    std::sort(job.begin(), job.end());
    CHECK(members("train-9") == job);
    REQUIRE(test::wait_until([&] { return stat_of(a, "remote_upload_skipped") >= 1; }, 30));
    CHECK(stat_of(a, "remote_uploads") == 2);  // C's copy was there: found, tagged, not sent
    CHECK(stat_of(a, "remote_hits") == 0);     // nothing was read through
    // The library reads the same set.
    {
        const auto r =
            test::run_kcache(a.db(), {"remote", "--remote", redis.url(), "--remote-namespace",
                                      "fsd", "pull", "--job-tag", "train-9"});
        INFO(r.describe());
        CHECK(r.exit_code == 0);
        CHECK(r.out.find("pulled 0, already local 3") != std::string::npos);
    }

    // A fresh daemon prefetching the job: local hits, no read-through. It tags what it
    // pulls into its own job, train-10: the prefetched entries, and one read through.
    MountedCache b(with_remote(redis, {"--prefetch-job-tag", "train-9", "-o", "job_tag=train-10"}));
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_prefetched") >= 3; }, 30));
    }
    CHECK(test::stat_value(test::cache_stats(b.db()), "entries") == 3);
    const std::uint64_t gets = redis.calls("get");
    require_same(b, kKey1, files1);
    require_same(b, kKey2, files2);
    require_same(b, shared, files3);
    CHECK(redis.calls("get") == gets);
    CHECK(stat_of(b, "remote_misses") == 0);
    REQUIRE(test::wait_until([&] { return members("train-10").size() >= 3; }, 30));
    CHECK(members("train-10") == job);

    store(c, kKey4, files4);
    wait_uploads(c, 2);
    require_same(b, kKey4, files4);  // read through
    job.push_back(kKey4);
    std::sort(job.begin(), job.end());
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return members("train-10").size() >= 4; }, 30));
    }
    CHECK(members("train-10") == job);
    CHECK(members("train-9").size() == 3);
}

TEST_CASE(
    "fsd remote: kcache stats shows each server's breaker: open while Redis is stopped, closed "
    "after",
    "[remote][fsd]") {
    RedisServer redis;
    MountedCache b(
        with_remote(redis, {"--remote-timeout", "300ms", "--remote-connect-timeout", "300ms"}));
    auto breaker = [&]() -> std::string {
        const auto stats = test::cache_stats(b.db());
        const auto& states = stats.at("remote_server_states");
        if (!states.is_object() || states.at("servers").size() != 1) return "none";
        return states.at("servers").at(0).at("breaker").get<std::string>();
    };
    {
        const auto stats = test::cache_stats(b.db());
        INFO(stats.dump());
        CHECK(test::stat_value(stats, "remote_servers") == 1);
        CHECK(test::stat_value(stats, "remote_breakers_open") == 0);
        CHECK(stats.at("remote_server_states").at("live").get<bool>());
        CHECK(stats.at("remote_server_states").at("servers").at(0).at("id") ==
              redis.endpoint().id());
    }
    CHECK(breaker() == "closed");

    redis.signal(SIGSTOP);
    // Misses read through and time out: two failures in a row open the circuit.
    for (const std::string& key : {kKey1, kKey2, kKey3})
        REQUIRE_FAILS_WITH(::access(b.p(key).c_str(), F_OK), ENOENT);
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return breaker() == "open"; }, 30));
    }
    CHECK(test::stat_value(test::cache_stats(b.db()), "remote_breakers_open") == 1);
    {
        const auto r = test::run_kcache(b.db(), {"stats"});
        INFO(r.describe());
        CHECK(r.out.find("remote servers") != std::string::npos);
        CHECK(r.out.find(redis.endpoint().id()) != std::string::npos);
        CHECK(r.out.find("open") != std::string::npos);
    }

    redis.signal(SIGCONT);
    // Nothing asks: the daemon's own trial after the cool-down closes it.
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return breaker() == "closed"; }, 40));
    }
    {
        const auto stats = test::cache_stats(b.db());
        CHECK(test::stat_value(stats, "remote_breakers_open") == 0);
        CHECK(test::stat_value(stats, "remote_breakers_half_open") == 0);
    }

    // A stopped daemon publishes none.
    b.unmount();
    const auto stats = test::cache_stats(b.db());
    CHECK(test::stat_value(stats, "remote_servers") == 0);
    CHECK(stats.at("remote_server_states").is_null());
}

TEST_CASE("fsd remote: with --remote-lease-ms one node compiles a missed entry, another waits",
          "[remote][fsd][lease]") {
    RedisServer redis;
    MountedCache a(with_remote(redis, {"--remote-lease-ms", "60000"}));  // never reached below
    MountedCache b(with_remote(redis, {"--remote-lease-ms", "60000"}));
    const std::string lease = proto::lease_key("fsd", kKey1);

    // A misses the entry here and in Redis: it takes the lease and is answered at once.
    REQUIRE_FAILS_WITH(::access(a.p(kKey1).c_str(), F_OK), ENOENT);
    CHECK(redis.command({"EXISTS", lease}).integer == 1);

    // B misses it too while A holds the lease: its lookup waits for A's manifest.
    test::Child prober([&] {
        struct stat st {};
        return ::stat(b.p(kKey1 + "/__grp__add_kernel.json").c_str(), &st) == 0 ? 0 : 2;
    });
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_lease_waits") >= 1; }, 30));
    }
    REQUIRE(prober.running());

    // A compiles and stores it; its upload releases the lease; B's lookup finds it.
    const auto files = triton_files(kKey1, 41);
    store(a, kKey1, files);
    wait_uploads(a, 1);
    const test::ChildResult probed = prober.join(60);
    REQUIRE_FALSE(probed.timed_out);
    CHECK(probed.exit_code == 0);
    require_same(b, kKey1, files);
    REQUIRE(test::wait_until([&] { return redis.command({"EXISTS", lease}).integer == 0; }, 30));
    REQUIRE(test::wait_until([&] { return stat_of(b, "remote_hits") >= 1; }, 30));
    CHECK(stat_of(b, "remote_lease_timeouts") == 0);
    CHECK(stat_of(b, "remote_uploads") == 0);  // B stored nothing of its own
    CHECK(stat_of(a, "remote_lease_waits") == 0);
}

TEST_CASE("fsd remote: a lease wait ends after the lease's time when the holder never uploads",
          "[remote][fsd][lease]") {
    RedisServer redis;
    MountedCache a(with_remote(redis, {"--remote-lease-ms", "1500"}));
    MountedCache b(with_remote(redis, {"--remote-lease-ms", "1500"}));
    REQUIRE_FAILS_WITH(::access(a.p(kKey2).c_str(), F_OK), ENOENT);  // A leases, never compiles

    const auto begin = std::chrono::steady_clock::now();
    REQUIRE_FAILS_WITH(::access(b.p(kKey2).c_str(), F_OK), ENOENT);
    // Loosely: it waited (about the lease's time), and ended.
    CHECK(std::chrono::steady_clock::now() - begin >= std::chrono::milliseconds(500));
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_lease_timeouts") >= 1; }, 30));
    }
    CHECK(stat_of(b, "remote_lease_waits") == 1);
    // A's lease expired without a manifest: B took it over (it compiles now).
    CHECK(redis.command({"EXISTS", proto::lease_key("fsd", kKey2)}).integer == 1);
}

TEST_CASE(
    "fsd remote: files published into an entry over more than the settle time are uploaded "
    "together",
    "[remote][fsd]") {
    // The uploader uploads an entry once it has not changed for about a second (its
    // file count, bytes and last access, polled while it waits), and Redis keeps the
    // first manifest of an entry: files published 0.6 s apart must all be in it.
    RedisServer redis;
    MountedCache a(with_remote(redis));
    const auto files = triton_files(kKey1, 11);
    const std::string dir = a.p(kKey1);
    REQUIRE_SYS(::mkdir(dir.c_str(), 0755));
    for (const auto& [name, content] : files) {  // one file every 0.6 s
        REQUIRE(test::write_all(dir + "/" + name, content) == 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
    }
    wait_uploads(a, 1);
    MountedCache b(with_remote(redis));
    require_same(b, kKey1, files);  // read through: the one manifest has all four
}

TEST_CASE("fsd remote: an entry stored before the uploader thread first runs is uploaded",
          "[remote][fsd]") {
    // The uploader follows the events log from where it stood when the mount began to
    // serve, not from where it stood when its thread first ran: on a loaded machine that
    // thread may start after the first stores (KCACHE_FSD_FAULT=slow_uploader starts it
    // fsd/src/survival/faults.hpp's kSlowStart late), which were then never uploaded.
    RedisServer redis;
    ::setenv("KCACHE_FSD_FAULT", "slow_uploader", 1);
    std::optional<MountedCache> a;
    a.emplace(with_remote(redis));
    ::unsetenv("KCACHE_FSD_FAULT");
    const auto files = triton_files(kKey1, 12);
    store(*a, kKey1, files);  // at once: the uploader sleeps for 2 s yet
    wait_uploads(*a, 1);
    MountedCache b(with_remote(redis));
    require_same(b, kKey1, files);
}

TEST_CASE("fsd remote: a Triton entry is uploaded whole however far apart its stages' files land",
          "[remote][fsd][lease]") {
    // Triton writes each stage's file when the stage ends (seconds apart for a big
    // kernel) and its group file last, and Redis keeps an entry's first manifest: an
    // entry uploaded at a pause between stages would be the fleet's for good without its
    // cubin. With a lease (others wait: it goes as soon as its group file is there) and
    // without (its files further apart than the settle time).
    auto files = triton_files(kKey1, 61);
    files["add_kernel.source"] = "@triton.jit\ndef add_kernel(x_ptr):\n    pass\n";
    for (const bool leased : {true, false}) {
        INFO((leased ? "leased" : "no lease"));
        RedisServer redis;
        MountedCache a(with_remote(redis, {"--remote-lease-ms", leased ? "auto" : "0"}));
        if (leased) {
            REQUIRE_FAILS_WITH(::access(a.p(kKey1).c_str(), F_OK), ENOENT);  // A leases
            REQUIRE(redis.command({"EXISTS", proto::lease_key("fsd", kKey1)}).integer == 1);
        }
        store(a, kKey1, files, std::chrono::milliseconds(leased ? 600 : 1300));
        wait_uploads(a, 1);
        MountedCache b(with_remote(redis));
        require_same(b, kKey1, files);  // read through: the one manifest has all five files
    }
}

TEST_CASE("fsd remote: leases are on by default and renewed while the holder compiles",
          "[remote][fsd][lease]") {
    // A compile longer than a renewed lease's time to live (Options::kLeaseTtlMs) is
    // still waited for: its holder renews the lease until its upload.
    RedisServer redis;
    MountedCache a(with_remote(redis, {"--remote-lease-ms", "auto"}));
    MountedCache b(with_remote(redis, {"--remote-lease-ms", "auto"}));
    const std::string lease = proto::lease_key("fsd", kKey1);
    REQUIRE_FAILS_WITH(::access(a.p(kKey1).c_str(), F_OK), ENOENT);  // A leases: it compiles
    CHECK(redis.command({"EXISTS", lease}).integer == 1);
    test::Child prober([&] {
        struct stat st {};
        return ::stat(b.p(kKey1 + "/__grp__add_kernel.json").c_str(), &st) == 0 ? 0 : 2;
    });
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_lease_waits") >= 1; }, 30));
    }
    // The compile: past the lease's first time to live.
    std::this_thread::sleep_for(
        std::chrono::milliseconds(kcache::remote::Options::kLeaseTtlMs + 2000));
    REQUIRE(prober.running());
    CHECK(redis.command({"EXISTS", lease}).integer == 1);  // renewed
    const auto files = triton_files(kKey1, 51);
    store(a, kKey1, files);
    wait_uploads(a, 1);
    const test::ChildResult probed = prober.join(60);
    REQUIRE_FALSE(probed.timed_out);
    CHECK(probed.exit_code == 0);
    require_same(b, kKey1, files);
    CHECK(stat_of(b, "remote_lease_timeouts") == 0);
    CHECK(stat_of(b, "remote_uploads") == 0);  // compiled once, by A
}

TEST_CASE("fsd remote: a holder that dies costs the waiters one lease time, then one compiles",
          "[remote][fsd][lease]") {
    RedisServer redis;
    MountedCache a(with_remote(redis, {"--remote-lease-ms", "auto"}));
    MountedCache b(with_remote(redis, {"--remote-lease-ms", "auto"}));
    REQUIRE_FAILS_WITH(::access(a.p(kKey2).c_str(), F_OK), ENOENT);  // A leases
    const std::string lease = proto::lease_key("fsd", kKey2);
    const std::string holder = redis.command({"GET", lease}).str;
    REQUIRE(!holder.empty());
    REQUIRE(a.signal_daemon(SIGKILL) == -1);  // dies holding it: no renewal, no release

    // B waits while the lease lives (at most its time to live, unrenewed), then takes it.
    REQUIRE_FAILS_WITH(::access(b.p(kKey2).c_str(), F_OK), ENOENT);
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_lease_timeouts") >= 1; }, 30));
    }
    CHECK(stat_of(b, "remote_lease_waits") == 1);
    const auto now_held = redis.command({"GET", lease});
    REQUIRE(now_held.type == kcache::remote::Reply::Type::string);
    CHECK(now_held.str != holder);  // B's now: B compiles
}

// Misses explained across nodes (docs/misses.md): A compiles add_kernel with 4 warps and
// uploads it (its family member goes to Redis with it); B, which has no add_kernel, then
// compiles it with 8 warps under another key. B's classifier finds the miss "first", and
// B's uploader, asking Redis in the background, explains it by A's entry.
TEST_CASE("fsd remote: misses: B's miss is explained by the entry A pushed", "[remote][fsd]") {
    RedisServer redis;
    MountedCache a(with_remote(redis));
    MountedCache b(with_remote(redis));
    auto kernel = [](int warps, const std::string& cubin) {
        return std::map<std::string, std::string>{
            {"add_kernel.cubin", cubin},
            {"add_kernel.ttir", "module {\n  tt.func @add_kernel() {\n  }\n}\n"},
            {"add_kernel.json", "{\"name\": \"add_kernel\", \"num_warps\": " +
                                    std::to_string(warps) + ", \"triton_version\": \"3.9.0\"}"},
            // written last: the entry is whole (a Triton entry is uploaded once it is)
            {"__grp__add_kernel.json", "{\"child_paths\": {}}"},
        };
    };
    store(a, kKey1, kernel(4, "ELF cubin for 4 warps"));
    wait_uploads(a, 1);
    store(b, kKey3, kernel(8, "ELF cubin for 8 warps"));
    nlohmann::json why;
    const bool explained = test::wait_until(
        [&] {
            auto r = test::run_cli({"--db", b.db().string(), "why", kKey3, "--json"});
            if (r.exit_code != 0) return false;  // not classified yet
            why = nlohmann::json::parse(r.out, nullptr, false);
            return why.is_object() && why["cause"] == "changed_key";
        },
        30);
    INFO(b.daemon_stderr());
    INFO(why.dump());
    REQUIRE(explained);
    CHECK(why["compared_with"] == kKey1);
    CHECK(why["compared_remote"]["namespace"] == "fsd");
    CHECK(!why["compared_remote"]["host"].get<std::string>().empty());
    REQUIRE(why["fields"].size() == 1);
    CHECK(why["fields"][0]["field"] == "num_warps");
    CHECK(why["fields"][0]["before"] == "4");
    CHECK(why["fields"][0]["after"] == "8");
    CHECK(stat_of(b, "misses_changed_key") == 1);
    CHECK(stat_of(b, "misses_first") == 0);
}

namespace {

// Stores `content` at `path` (below the mount's root) as compilers publish a file: the
// directories above it made as needed (mkdir -p), the file written under a temp name
// beside it and renamed into place.
void publish(const MountedCache& m, const std::string& path, const std::string& content) {
    std::string dir;
    for (auto slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
        dir = path.substr(0, slash);
        if (::mkdir(m.p(dir).c_str(), 0755) != 0) REQUIRE(errno == EEXIST);
    }
    const std::string tmp = m.p(dir + "/.tmp." + std::to_string(::getpid()));
    REQUIRE(test::write_all(tmp, content) == 0);
    REQUIRE_SYS(::rename(tmp.c_str(), m.p(path).c_str()));
}

bool exists(const MountedCache& m, const std::string& path) {
    struct stat st {};
    return ::lstat(m.p(path).c_str(), &st) == 0;
}

}  // namespace

TEST_CASE(
    "fsd remote: a new node reads through the containers between a compiler's directory and "
    "its entries (Inductor, ccache, JAX), and makes no directory Redis holds nothing below",
    "[remote][fsd]") {
    RedisServer redis;
    MountedCache a(with_remote(redis));
    // One file per entry, in each compiler's layout (core/layout.hpp); the entries sit
    // below containers a new node has never made.
    const std::string fx =
        "inductor/fxgraph/ch/fchx2ys3kjbgm5jbn3zpqnhu4lbfw2zrzu3kbxbi7yszgmmu5yjt";
    const std::string aot =
        "inductor/aotautograd/akq6c5yxsqz2hhm4rmq4t6mrj4ocbxgfb3l2mbnjw3rr6cbamu7c";
    const std::map<std::string, std::string> files = {
        {fx + "/pmdoqmjylzn4aq2lo5ocb5yvfvwq3jn3fvaaqkzbayjqe7pt4nrs",
         test::random_bytes(std::size_t{40'000}, std::uint64_t{1})},
        {aot + "/entry", test::random_bytes(std::size_t{9'000}, std::uint64_t{2})},
        {"inductor/ba/cbaz3x4npv5ruvmgsbzzoirfpfvqafwrmkzwlr4o7ymh3ykn5q4l.py",
         "def call(): pass\n"},
        {"inductor/triton/0/" + kKey1 + "/add_kernel.cubin",
         test::random_bytes(std::size_t{20'000}, std::uint64_t{3})},
        {"ccache/4/a/ff1c8b4d2e9a7c3b5f60d1e2a4b8c7d9e0f1a2b3cM",
         test::random_bytes(std::size_t{3'000}, std::uint64_t{4})},
        {"ccache/4/a/ff1c8b4d2e9a7c3b5f60d1e2a4b8c7d9e0f1a2b3cR",
         test::random_bytes(std::size_t{30'000}, std::uint64_t{5})},
        {"jax/jit_f-4c1f7a3e9b2d5c8a0e6f1b4d7a2c9e5f3b8d1a6c4e7f2b9d-cache",
         test::random_bytes(std::size_t{7'000}, std::uint64_t{6})},
    };
    for (const auto& [path, content] : files) publish(a, path, content);
    wait_uploads(a, files.size());

    // A new node: an empty db, mounted after A uploaded (as a fleet's new node is).
    MountedCache b(with_remote(redis));
    REQUIRE(stat_of(b, "entries") == 0);
    for (const auto& [path, content] : files) {
        INFO(path);
        INFO(b.daemon_stderr());
        const auto got = test::read_all(b.p(path));
        REQUIRE(got.has_value());
        CHECK(*got == content);
    }
    // Each entry came from Redis; the containers on the way were made as directories.
    REQUIRE(test::wait_until([&] { return stat_of(b, "remote_hits") >= files.size(); }, 30));
    CHECK(stat_of(b, "remote_hits") == files.size());  // ccache's M and R are two entries
    // Fleet hits: B compiled nothing, so B counts no miss; the hits are the fleet's.
    REQUIRE(test::wait_until([&] { return stat_of(b, "hits") >= files.size(); }, 30));
    CHECK(stat_of(b, "misses") == 0);
    CHECK(stat_of(b, "hits_fleet") == stat_of(b, "hits"));
    const auto why = test::run_cli({"--db", b.db().string(), "why", fx, "--json"});
    INFO(why.out << why.err);
    REQUIRE(why.exit_code == 0);
    const auto why_json = nlohmann::json::parse(why.out);
    CHECK(why_json["cause"] == "fleet");
    CHECK(!why_json["writer"].get<std::string>().empty());
    struct stat st {};
    REQUIRE_SYS(::stat(b.p("inductor/fxgraph/ch").c_str(), &st));
    CHECK(S_ISDIR(st.st_mode));
    CHECK(st.st_uid == ::getuid());
    const mode_t umask = ::umask(0);
    ::umask(umask);
    CHECK((st.st_mode & 07777) == (0777 & ~umask));  // as the process would have made it

    // Below a container Redis holds nothing under, a lookup is a miss that asks Redis
    // nothing and makes nothing.
    const auto misses = stat_of(b, "remote_misses");
    REQUIRE_FAILS_WITH(
        ::access(
            b.p("inductor/fxgraph/zz/fzzq2ys3kjbgm5jbn3zpqnhu4lbfw2zrzu3kbxbi7yszgmmu5yjt").c_str(),
            F_OK),
        ENOENT);
    REQUIRE_FAILS_WITH(
        ::access(b.p("ccache/0/0/00aa8b4d2e9a7c3b5f60d1e2a4b8c7d9e0f1a2b3cM").c_str(), F_OK),
        ENOENT);
    CHECK_FALSE(exists(b, "inductor/fxgraph/zz"));
    CHECK_FALSE(exists(b, "ccache/0"));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past a statistics flush
    CHECK(stat_of(b, "remote_misses") == misses);
    // inductor, its fxgraph, fxgraph/ch, aotautograd, ba, triton, triton/0; ccache, 4, 4/a; jax
    CHECK(stat_of(b, "remote_containers") == 11);

    // A container that appears in Redis while B runs is found soon after (the
    // containers are read again about every second; B's negative answer lasts 1 s).
    const std::string late =
        "inductor/fxgraph/qq/fqqx2ys3kjbgm5jbn3zpqnhu4lbfw2zrzu3kbxbi7yszgmmu5yjt/x";
    REQUIRE_FAILS_WITH(::access(b.p(late).c_str(), F_OK), ENOENT);
    publish(a, late, "late");
    wait_uploads(a, files.size() + 1);
    {
        INFO(b.daemon_stderr());
        REQUIRE(
            test::wait_until([&] { return test::read_all(b.p(late)) == std::string("late"); }, 30));
    }

    const auto verify = test::run_cli({"--db", b.db().string(), "verify"});
    INFO(verify.out << verify.err);
    CHECK(verify.exit_code == 0);
}

TEST_CASE(
    "fsd remote: an Inductor C++ kernel is uploaded once g++ wrote its .so, however long after "
    "its .cpp",
    "[remote][fsd]") {
    RedisServer redis;
    MountedCache a(with_remote(redis));
    const std::string stem = "inductor/xq/cxqzl4w7rq2u5c5gqk3zj7bd6m2yqg3jv7x4u6h2xw5b3i2n5b4c";
    const std::string cpp = "extern \"C\" void kernel(const float* in, float* out) {}\n";
    const std::string so = test::random_bytes(std::size_t{50'000}, std::uint64_t{77});
    publish(a, stem + ".cpp", cpp);
    // g++ takes longer than the settle time (1 s without a change) on a real kernel.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    CHECK(stat_of(a, "remote_uploads") == 0);  // waited for: a .cpp without its .so
    publish(a, stem + ".so", so);
    wait_uploads(a, 1);

    MountedCache b(with_remote(redis));
    CHECK(test::read_all(b.p(stem + ".cpp")) == cpp);
    CHECK(test::read_all(b.p(stem + ".so")) == so);  // in the one upload Redis keeps
}

TEST_CASE(
    "fsd remote: write-behind signs, a reader trusting only another key misses, counted, "
    "one trusting the signer reads through",
    "[remote][fsd][trust]") {
    RedisServer redis;
    test::TempDir keys;  // 0700, this user's: the trust files' rule holds
    auto signer = kcache::remote::SigningKey::generate();
    auto other = kcache::remote::SigningKey::generate();
    REQUIRE(signer);
    REQUIRE(other);
    const std::string key_file = (keys / "a.key").string();
    REQUIRE(signer->save(key_file));
    auto trust_file = [&](const std::string& name, const kcache::remote::SigningKey& key) {
        kcache::remote::TrustFile t;
        t.keys.push_back({key.public_key(), name, false});
        const std::string path = (keys / name).string();
        REQUIRE(kcache::remote::save_trust_file(path, t));
        return path;
    };
    const std::string trusts_other = trust_file("other", *other);
    const std::string trusts_signer = trust_file("signer", *signer);

    MountedCache a(with_remote(redis, {"--remote-signing-key", key_file}));
    MountedCache b(with_remote(redis, {"--remote-trusted-keys", trusts_other}));
    MountedCache c(with_remote(redis, {"--remote-trusted-keys", trusts_signer}));
    const auto files = triton_files(kKey1, 1);
    store(a, kKey1, files);
    wait_uploads(a, 1);
    CHECK(redis.command({"GET", proto::manifest_key("fsd", kKey1)}).str.starts_with("KCM2"));

    // B's read-through refuses it: a miss (its compiler compiles its own), counted.
    REQUIRE_FAILS_WITH(::access(b.p(kKey1).c_str(), F_OK), ENOENT);
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_rejected_untrusted") >= 1; }, 30));
    }
    CHECK(stat_of(b, "remote_hits") == 0);
    CHECK(test::stat_value(test::cache_stats(b.db()), "entries") == 0);
    // B's compiler compiles its own kernel: B keeps its own bytes, not A's.
    const auto own = triton_files(kKey1, 9);
    store(b, kKey1, own);
    require_same(b, kKey1, own);

    // C trusts the signer: it reads through, byte-exact.
    require_same(c, kKey1, files);
    REQUIRE(test::wait_until([&] { return stat_of(c, "remote_hits") >= 1; }, 30));
    CHECK(stat_of(c, "remote_rejected_untrusted") == 0);

    // A, with no trust file, says its tier is unverified.
    CHECK(a.daemon_stderr().find("unverified") != std::string::npos);
    CHECK(c.daemon_stderr().find("unverified") == std::string::npos);
}
