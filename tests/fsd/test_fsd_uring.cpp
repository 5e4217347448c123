// kcache-fsd --io-uring (FUSE over io_uring, fsd/src/transport/uring_transport.hpp): where the
// fuse module offers it, requests are served from the daemon's rings, which it says
// ("serving over io_uring", and at exit how many requests the rings served); where it
// does not, the daemon says so and serves /dev/fuse. Both need root (the module
// parameter enable_uring is set for the test and restored); skipped otherwise.
//
// CTest runs this program as one test, before the `uring` fixture sets the parameter
// for the other programs' io_uring runs (tests/fsd/CMakeLists.txt): it turns it off.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <string>

#include "mount_fixture.hpp"
#include "skip.hpp"

using namespace kcache::test;

namespace {

const char* const kParam = "/sys/module/fuse/parameters/enable_uring";

std::string read_param() {
    std::ifstream in(kParam);
    std::string v;
    std::getline(in, v);
    return v;
}

bool write_param(const std::string& v) {
    std::ofstream out(kParam);
    out << v << '\n';
    out.flush();
    return static_cast<bool>(out) && read_param() == v;
}

// Sets enable_uring for the test's life and restores the value it found.
class ParamGuard {
  public:
    explicit ParamGuard(const std::string& value) {
        if (geteuid() != 0)
            skip("FUSE over io_uring: setting the fuse module's enable_uring needs root");
        if (access(kParam, F_OK) != 0)
            skip("FUSE over io_uring: this kernel has no /sys/module/fuse/parameters/enable_uring");
        m_old = read_param();
        REQUIRE(write_param(value));
    }
    ~ParamGuard() { (void)write_param(m_old); }
    ParamGuard(const ParamGuard&) = delete;
    ParamGuard& operator=(const ParamGuard&) = delete;

  private:
    std::string m_old;
};

bool said(const MountedCache& cache, const std::string& what) {
    return cache.daemon_stderr().find(what) != std::string::npos;
}

// Waits for the daemon's word on the transport (logged once the kernel's INIT is done).
void wait_for_transport(const MountedCache& cache) {
    wait_until(
        [&] {
            return said(cache, "serving over io_uring") || said(cache, "serving over /dev/fuse");
        },
        10);
}

// A store, a hit in another process and a miss, through the mount.
void store_hit_miss(MountedCache& cache) {
    const std::string content = random_bytes(300000, 12);
    REQUIRE_SYS(mkdir(cache.p("entry").c_str(), 0755));
    REQUIRE(write_all(cache.p("entry/kernel.cubin"), content) == 0);
    const auto hit = run_child([&] {
        const int fd = open(cache.p("entry/kernel.cubin").c_str(), O_RDONLY);
        if (fd < 0) return 1;
        const auto bytes = read_fd(fd);
        close(fd);
        return bytes && *bytes == content ? 0 : 2;
    });
    REQUIRE(hit.exit_code == 0);
    struct stat st {};
    REQUIRE_FAILS_WITH(stat(cache.p("entry/missing.cubin").c_str(), &st), ENOENT);
    REQUIRE_FAILS_WITH(open(cache.p("other/kernel.cubin").c_str(), O_RDONLY), ENOENT);
}

std::uint64_t served_by_rings(const std::string& log) {
    std::smatch m;
    static const std::regex line("io_uring served ([0-9]+) requests");
    if (!std::regex_search(log, m, line)) return 0;
    return std::stoull(m[1].str());
}

}  // namespace

TEST_CASE("--io-uring serves a store, a hit and a miss from the rings and ends cleanly",
          "[fsd][uring]") {
    require_fuse();
    ParamGuard param("Y");
    DaemonOptions options;
    options.args = {"--io-uring"};
    MountedCache cache(options);
    wait_for_transport(cache);
    INFO("daemon stderr:\n" << cache.daemon_stderr());
    REQUIRE(said(cache, "serving over io_uring: "));
    store_hit_miss(cache);
    SECTION("by unmount") {
        cache.unmount();
    }
    SECTION("by SIGTERM") {
        REQUIRE(cache.signal_daemon(SIGTERM) == 0);
        REQUIRE_FALSE(cache.mounted());
    }
    const std::string log = cache.daemon_stderr();
    INFO("daemon stderr after it ended:\n" << log);
    // The requests above (lookups, mkdir, create, writes, flushes, opens, reads,
    // releases) came over the rings, not /dev/fuse.
    REQUIRE(served_by_rings(log) >= 10);
    REQUIRE(log.find("error") == std::string::npos);
}

TEST_CASE(
    "--io-uring falls back to /dev/fuse with a clear message where the kernel does not offer it",
    "[fsd][uring]") {
    require_fuse();
    ParamGuard param("N");
    DaemonOptions options;
    options.args = {"--io-uring"};
    MountedCache cache(options);
    wait_for_transport(cache);
    INFO("daemon stderr:\n" << cache.daemon_stderr());
    REQUIRE(said(cache, "--io-uring: the fuse module's parameter enable_uring is off"));
    REQUIRE(said(cache, "serving over /dev/fuse"));
    REQUIRE_FALSE(said(cache, "serving over io_uring"));
    store_hit_miss(cache);
    cache.unmount();
    REQUIRE(served_by_rings(cache.daemon_stderr()) == 0);
}
