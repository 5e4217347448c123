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

TEST_CASE(
    "faults: a full disk under the daemon gives writers ENOSPC, keeps reads going, and recovers",
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
        if (err)
            refused = err;
        else
            stored.emplace_back(path, content);
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
    CHECK_THAT(r.err, Catch::Contains(db.string()) &&
                          Catch::Contains("read-only", Catch::CaseSensitive::No));
    CHECK(fs::is_empty(mnt));                           // nothing was mounted there
    CHECK_THAT(r.err, Catch::Contains("--read-only"));  // and says how to serve it anyway
    // The CLI still reads it: stats on a read-only db work.
    CHECK(run_kcache(db, {"stats", "--json"}).exit_code == 0);
}

TEST_CASE("faults: a db on a read-only filesystem is served read-only when asked (-o ro)",
          "[reliability][faults]") {
    TempDir dir;
    Tmpfs small(dir.path() / "small", "16m");
    DaemonOptions writable;
    writable.db = small.path() / "db";
    std::vector<std::pair<std::string, std::string>> files;
    {
        MountedCache cache(writable);
        for (int i = 0; i < 5; ++i) {
            const std::string entry = "entry" + std::to_string(i);
            REQUIRE_SYS(mkdir(cache.p(entry).c_str(), 0755));
            const std::string content =
                random_bytes(static_cast<std::size_t>(3000 + 7919 * i), 50u + i);
            REQUIRE(write_all(cache.p(entry + "/kernel.cubin"), content) == 0);
            files.emplace_back(entry + "/kernel.cubin", content);
        }
        cache.unmount();
    }
    const auto before = cache_stats(writable.db);
    REQUIRE(::mount(nullptr, small.path().c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0);

    DaemonOptions read_only = writable;
    read_only.args = {"-o", "ro"};
    MountedCache cache(read_only);
    for (const auto& [path, content] : files) CHECK(read_all(cache.p(path)) == content);
    // Every change is refused with EROFS, and nothing already there is lost.
    REQUIRE_FAILS_WITH(open(cache.p("entry0/new.json").c_str(), O_WRONLY | O_CREAT, 0644), EROFS);
    REQUIRE_FAILS_WITH(open(cache.p("entry0/kernel.cubin").c_str(), O_WRONLY | O_TRUNC), EROFS);
    REQUIRE_FAILS_WITH(mkdir(cache.p("entry9").c_str(), 0755), EROFS);
    REQUIRE_FAILS_WITH(unlink(cache.p("entry1/kernel.cubin").c_str()), EROFS);
    REQUIRE_FAILS_WITH(rename(cache.p("entry2").c_str(), cache.p("entry8").c_str()), EROFS);
    CHECK(read_all(cache.p("entry1/kernel.cubin")) == files[1].second);
    cache.unmount();  // REQUIREs a clean exit: no statistics flush failed
    CHECK(cache.daemon_stderr().find("statistics") == std::string::npos);
    // The db is exactly as it was (a read-only daemon keeps no statistics).
    const auto after = cache_stats(writable.db);
    CHECK(stat_value(after, "entries") == stat_value(before, "entries"));
    CHECK(stat_value(after, "hits") == stat_value(before, "hits"));
    CHECK(run_kcache(writable.db, {"verify"}).exit_code == 0);
}
