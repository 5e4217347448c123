// kcache-fsd --remote: two daemons with separate dbs share one redis-server. What a
// compiler stores through mount A (plain file I/O, Triton's layout) is read through
// mount B byte-exact, however B asks for it (a lookup of the entry, Triton's
// makedirs(<key>) then probing files, a probe inside an entry directory B already had
// empty); a frozen Redis leaves B's local hits as they were and answers its misses
// (ENOENT) by the deadline, counted; after SIGCONT sharing works again.

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"
#include "redis_fixture.hpp"

using kcache::test::DaemonOptions;
using kcache::test::MountedCache;
using kcache::test::RedisServer;
namespace test = kcache::test;

namespace {

// Triton's cache keys: base32 of a sha256, 52 characters.
const std::string kKey1 = "JYS2XUOUG4VYYBXBZYN7QL4E6AX3B7AXEAKLO5N3NS5ZC6WRD4GQ";
const std::string kKey2 = "Q7LZ3WJ5UE2RS4VN6KXA3MBY7DHC2PGTF5OIQ4ZL6NW3RT2XYKAA";
const std::string kKey3 = "B3NDK7QWZ2LX5RM4UVJ6YTH2CPA7SGEF4NOIQ5ZK6LW3XT2RYMBB";
const std::string kKey4 = "C4PEL8RXA3MY6SN5VWK7ZUI3DQB8THFG5OPJR6AL7MX4YU3SZNCC";

DaemonOptions with_remote(const RedisServer& redis, std::vector<std::string> extra = {}) {
    DaemonOptions o;
    o.args = {"--remote", redis.url(), "--remote-namespace", "fsd"};
    o.args.insert(o.args.end(), extra.begin(), extra.end());
    return o;
}

// A Triton-shaped entry: the group file, a binary, its IR and metadata.
std::map<std::string, std::string> triton_files(const std::string& key, std::uint64_t seed) {
    return {
        {"__grp__add_kernel.json", "{\"child_paths\": {\"add_kernel.cubin\": \"" + key + "/add_kernel.cubin\"}}"},
        {"add_kernel.cubin", test::random_bytes(std::size_t{300'000}, std::uint64_t{seed})},
        {"add_kernel.ptx", std::string(20'000, 'p') + std::to_string(seed)},
        {"add_kernel.json", "{\"name\": \"add_kernel\", \"seed\": " + std::to_string(seed) + "}"},
    };
}

// Stores the files as Triton does: mkdir, write each file to a temp dir, rename into place.
void store(const MountedCache& m, const std::string& key, const std::map<std::string, std::string>& files) {
    const std::string dir = m.p(key);
    if (::mkdir(dir.c_str(), 0755) != 0) REQUIRE(errno == EEXIST);
    const std::string tmp = dir + "/tmp.pid_1_abc";
    REQUIRE_SYS(::mkdir(tmp.c_str(), 0755));
    for (const auto& [name, content] : files) {
        REQUIRE(test::write_all(tmp + "/" + name, content) == 0);
        REQUIRE_SYS(::rename((tmp + "/" + name).c_str(), (dir + "/" + name).c_str()));
    }
    REQUIRE_SYS(::rmdir(tmp.c_str()));
}

void require_same(const MountedCache& m, const std::string& key, const std::map<std::string, std::string>& files) {
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
    INFO(a.daemon_stderr());
    REQUIRE(test::wait_until([&] { return stat_of(a, "remote_uploads") >= n; }, 30));
}

}  // namespace

TEST_CASE("fsd remote: an entry stored through mount A is read through mount B byte-exact", "[remote][fsd]") {
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
    struct stat st{};
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
        REQUIRE(test::wait_until([&] { return test::read_all(b.p(kKey3 + "/__grp__add_kernel.json")).has_value(); },
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

TEST_CASE("fsd remote: a frozen Redis leaves local hits alone, misses answer ENOENT by the deadline", "[remote][fsd]") {
    RedisServer redis;
    const std::vector<std::string> quick = {"--remote-timeout", "300ms", "--remote-connect-timeout", "300ms"};
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
        REQUIRE(test::wait_until([&] { return stat_of(b, "remote_timeouts") + stat_of(b, "remote_errors") >= 1; }, 30));
        REQUIRE(test::wait_until([&] { return stat_of(a, "remote_timeouts") + stat_of(a, "remote_errors") >= 1; }, 30));
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
