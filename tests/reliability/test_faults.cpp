// Faults under the daemon: the db on a small filesystem that fills up.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "mount_fixture.hpp"
#include "tmpfs.hpp"

using namespace kcache::test;

TEST_CASE("faults: a full disk under the daemon gives writers ENOSPC, keeps reads going, and recovers",
          "[reliability][faults]") {
    TempDir dir;  // declared first: the tmpfs and the mount go before it
    Tmpfs small(dir.path() / "small", "8m");
    const fs::path ballast = small.path() / "ballast";
    write_file(ballast, std::string(3 << 20, 'b'));  // removing it frees the disk later
    DaemonOptions options;
    options.db = small.path() / "db";
    options.args = {"--durability", "full"};
    MountedCache cache(options);

    // Store incompressible entries until the disk refuses: at open, write or close.
    std::vector<std::pair<std::string, std::string>> stored;
    int refused = 0;
    for (int i = 0; i < 200 && !refused; ++i) {
        const std::string dir_name = "entry" + std::to_string(i);
        if (mkdir(cache.p(dir_name).c_str(), 0755) != 0) {
            refused = errno;
            break;
        }
        const std::string content = random_bytes(256 * 1024, static_cast<std::uint64_t>(i));
        const std::string path = cache.p(dir_name + "/kernel.cubin");
        const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) {
            refused = errno;
            break;
        }
        int err = write_fd(fd, content);
        if (close(fd) != 0 && !err) err = errno;
        if (err) refused = err;
        else stored.emplace_back(path, content);
    }
    INFO("stored " << stored.size() << " entries before the disk was full");
    REQUIRE(refused == ENOSPC);
    REQUIRE(stored.size() >= 3);

    // Reads go on: every file whose close succeeded is there, byte for byte.
    for (const auto& [path, content] : stored) CHECK(read_all(path) == content);

    // Space freed on the filesystem: writes succeed again, through the same mount.
    fs::remove(ballast);
    CHECK(mkdir(cache.p("after").c_str(), 0755) == 0);
    CHECK(write_all(cache.p("after/kernel.cubin"), "fresh") == 0);
    CHECK(read_all(cache.p("after/kernel.cubin")) == std::string("fresh"));

    cache.unmount();
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "errors_nospc") >= 1);
    CHECK(stat_value(stats, "entries") >= stored.size() + 1);
    const ProcResult verify = run_kcache(cache.db(), {"verify"});
    INFO(verify.out << verify.err);
    CHECK(verify.exit_code == 0);
}

TEST_CASE("faults: a db on a read-only filesystem is refused before anything is mounted",
          "[reliability][faults]") {
    TempDir dir;
    Tmpfs small(dir.path() / "small", "8m");
    const fs::path db = small.path() / "db";
    REQUIRE(run_kcache(db, {"init"}).exit_code == 0);
    REQUIRE(::mount(nullptr, small.path().c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0);
    const fs::path mnt = dir.path() / "mnt";
    fs::create_directories(mnt);
    const ProcResult r = run_process({KCACHE_FSD_PATH, "-f", "--db", db.string(), mnt.string()});
    INFO(r.err);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains(db.string()) && Catch::Contains("read-only", Catch::CaseSensitive::No));
    CHECK(fs::is_empty(mnt));  // nothing was mounted there
    // The CLI still reads it: stats on a read-only db work.
    CHECK(run_kcache(db, {"stats", "--json"}).exit_code == 0);
}
