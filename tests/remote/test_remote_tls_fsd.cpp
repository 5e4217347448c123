// kcache-fsd over TLS (rediss://, issue 32 point 4): what mount A stores is uploaded and
// read through mount B over TLS; mount C, whose CA did not sign the server's
// certificate, answers the same lookup as a miss (ENOENT), stores nothing, counts the
// failure and logs its cause. Skipped without redis-server, openssl, /dev/fuse or
// fusermount3.

#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "mount_fixture.hpp"
#include "redis_fixture.hpp"
#include "tls_fixture.hpp"

using kcache::test::DaemonOptions;
using kcache::test::MountedCache;
using kcache::test::RedisServer;
using kcache::test::TlsCerts;
namespace test = kcache::test;

namespace {

const std::string kKey = "JYS2XUOUG4VYYBXBZYN7QL4E6AX3B7AXEAKLO5N3NS5ZC6WRD4GQ";

std::uint64_t stat_of(const MountedCache& m, const std::string& name) {
    return test::stat_value(test::cache_stats(m.db()), name);
}

}  // namespace

TEST_CASE(
    "fsd remote over TLS: read-through over rediss://, a wrong CA is a miss, counted and "
    "logged",
    "[remote][tls][fsd]") {
    TlsCerts certs;
    const std::uint16_t port = test::free_port();
    RedisServer redis(test::tls_server_args(certs, port));
    auto over_tls = [&](const std::string& ca) {
        DaemonOptions o;
        o.args = {"--remote",
                  "rediss://127.0.0.1:" + std::to_string(port),
                  "--remote-namespace",
                  "fsd",
                  "--remote-lease-ms",
                  "0",
                  "--remote-timeout",
                  "500ms",
                  "--remote-connect-timeout",
                  "500ms",
                  "--remote-tls-ca",
                  ca};
        return o;
    };
    MountedCache a(over_tls(certs.ca()));
    MountedCache b(over_tls(certs.ca()));
    MountedCache c(over_tls(certs.other_ca()));

    // Triton's way: the files, then the group file that lists them.
    const std::map<std::string, std::string> files = {
        {"add_kernel.cubin", test::random_bytes(std::size_t{200'000}, std::uint64_t{5})},
        {"add_kernel.json", "{\"name\": \"add_kernel\"}"},
    };
    REQUIRE_SYS(::mkdir(a.p(kKey).c_str(), 0755));
    for (const auto& [name, content] : files)
        REQUIRE(test::write_all(a.p(kKey + "/" + name), content) == 0);
    REQUIRE(test::write_all(a.p(kKey + "/__grp__add_kernel.json"),
                            "{\"child_paths\": {\"add_kernel.cubin\": \"" + kKey +
                                "/add_kernel.cubin\"}}") == 0);
    {
        INFO(a.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(a, "remote_uploads") >= 1; }, 30));
    }
    CHECK(redis.command({"DBSIZE"}).integer > 0);

    // B reads it through, over TLS.
    for (const auto& [name, content] : files) {
        INFO(b.daemon_stderr());
        const auto got = test::read_all(b.p(kKey + "/" + name));
        REQUIRE(got.has_value());
        REQUIRE(*got == content);
    }

    // C's CA did not sign the server's certificate: the lookup is a miss, nothing is
    // stored, the failure is counted and its cause logged.
    REQUIRE_FAILS_WITH(::access(c.p(kKey).c_str(), F_OK), ENOENT);
    INFO(c.daemon_stderr());
    REQUIRE(test::wait_until(
        [&] { return c.daemon_stderr().find("certificate is refused") != std::string::npos; }, 30));
    REQUIRE(test::wait_until([&] { return stat_of(c, "remote_errors") >= 1; }, 30));
    CHECK(stat_of(c, "remote_hits") == 0);
    CHECK(stat_of(c, "entries") == 0);
}
