// Bad input and bounds: over-long names, files beyond --max-file-size, a cache full of
// pinned entries, and LRU eviction when --max-size is exceeded.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

using namespace kcache::test;

TEST_CASE("names longer than 255 bytes fail with ENAMETOOLONG", "[fsd][limits]") {
    MountedCache cache;
    const std::string long_name(256, 'n');
    const std::string max_name(255, 'm');
    struct stat st {};

    REQUIRE_FAILS_WITH(open(cache.p(long_name).c_str(), O_CREAT | O_WRONLY, 0644), ENAMETOOLONG);
    REQUIRE_FAILS_WITH(mkdir(cache.p(long_name).c_str(), 0755), ENAMETOOLONG);
    REQUIRE_FAILS_WITH(stat(cache.p(long_name).c_str(), &st), ENAMETOOLONG);
    REQUIRE_FAILS_WITH(symlink("t", cache.p(long_name).c_str()), ENAMETOOLONG);
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    REQUIRE_FAILS_WITH(open(cache.p("k/" + long_name).c_str(), O_CREAT | O_WRONLY, 0644),
                       ENAMETOOLONG);
    REQUIRE(write_all(cache.p("k/short"), "x") == 0);
    REQUIRE_FAILS_WITH(rename(cache.p("k/short").c_str(), cache.p("k/" + long_name).c_str()),
                       ENAMETOOLONG);

    // 255 bytes is fine.
    REQUIRE(write_all(cache.p("k/" + max_name), "max") == 0);
    REQUIRE_SYS(stat(cache.p("k/" + max_name).c_str(), &st));
    CHECK(read_all(cache.p("k/" + max_name)) == std::string("max"));
    REQUIRE_SYS(mkdir(cache.p(max_name).c_str(), 0755));
    bool listed = false;
    for (const auto& e : fs::directory_iterator(cache.path("k")))
        listed = listed || e.path().filename() == max_name;
    CHECK(listed);
}

TEST_CASE("files beyond --max-file-size fail with EFBIG", "[fsd][limits]") {
    DaemonOptions options;
    options.args = {"--max-file-size", "1M"};
    MountedCache cache(options);
    constexpr std::size_t kMax = 1024 * 1024;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));

    // Exactly the limit is fine.
    const std::string at_limit = random_bytes(kMax, 1);
    REQUIRE(write_all(cache.p("k/at_limit.bin"), at_limit) == 0);
    CHECK(read_all(cache.p("k/at_limit.bin")) == at_limit);

    SECTION("write") {
        Fd fd(open(cache.p("k/too_big.bin").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644));
        REQUIRE_SYS(fd.get());
        const std::string chunk = random_bytes(64 * 1024, 2);
        std::size_t written = 0;
        int err = 0;
        while (written <= 2 * kMax) {
            const ssize_t n = write(fd.get(), chunk.data(), chunk.size());
            if (n < 0) {
                err = errno;
                break;
            }
            written += static_cast<std::size_t>(n);
        }
        INFO("wrote " << written << " bytes, then " << std::strerror(err));
        CHECK(err == EFBIG);
        CHECK(written <= kMax);
        fd.reset();
    }
    SECTION("pwrite past the limit") {
        Fd fd(open(cache.p("k/sparse.bin").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644));
        REQUIRE_SYS(fd.get());
        REQUIRE_FAILS_WITH(pwrite(fd.get(), "x", 1, static_cast<off_t>(kMax)), EFBIG);
    }
    SECTION("truncate past the limit") {
        REQUIRE_FAILS_WITH(
            truncate(cache.p("k/at_limit.bin").c_str(), static_cast<off_t>(kMax + 1)), EFBIG);
        CHECK(read_all(cache.p("k/at_limit.bin")) == at_limit);
    }
    // The cache keeps working.
    REQUIRE(write_all(cache.p("k/after.bin"), "small") == 0);
    CHECK(read_all(cache.p("k/after.bin")) == std::string("small"));
    CHECK(read_all(cache.p("k/at_limit.bin")) == at_limit);
}

TEST_CASE("a cache full of pinned entries gives writers ENOSPC and keeps serving reads",
          "[fsd][limits]") {
    DaemonOptions options;
    options.args = {"--max-size", "1M"};
    MountedCache cache(options);
    constexpr std::size_t kEntrySize = 200 * 1024;  // incompressible: stored as is
    std::vector<std::string> names;
    for (int i = 0; i < 4; ++i) {
        const std::string name = "pinned" + std::to_string(i);
        names.push_back(name);
        REQUIRE_SYS(mkdir(cache.p(name).c_str(), 0755));
        REQUIRE(write_all(cache.p(name + "/kernel.cubin"),
                          random_bytes(kEntrySize, static_cast<std::uint64_t>(i))) == 0);
    }
    std::vector<std::string> pin_args{"pin"};
    pin_args.insert(pin_args.end(), names.begin(), names.end());
    const ProcResult pin = run_kcache(cache.db(), pin_args);
    INFO("kcache pin: " << pin.describe());
    REQUIRE(pin.exit_code == 0);

    // 800 KiB pinned; 400 KiB more cannot fit under 1 MiB and nothing may be evicted.
    REQUIRE_SYS(mkdir(cache.p("new").c_str(), 0755));
    Fd fd(open(cache.p("new/kernel.cubin").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644));
    REQUIRE_SYS(fd.get());
    const int write_err = write_fd(fd.get(), random_bytes(2 * kEntrySize, 50));
    errno = 0;
    const int close_result = fd.close();
    const int close_err = close_result == 0 ? 0 : errno;
    INFO("write: " << std::strerror(write_err) << "; close: " << std::strerror(close_err)
                   << "\ndaemon stderr:\n"
                   << cache.daemon_stderr());
    CHECK((write_err == ENOSPC || close_err == ENOSPC));

    // Every pinned entry is intact and readable.
    for (int i = 0; i < 4; ++i) {
        INFO(names[static_cast<std::size_t>(i)]);
        CHECK(read_all(cache.p(names[static_cast<std::size_t>(i)] + "/kernel.cubin")) ==
              random_bytes(kEntrySize, static_cast<std::uint64_t>(i)));
    }
    // A small file still fits.
    CHECK(write_all(cache.p("new/small.json"), "{}") == 0);

    // Unpinning makes room again: the writer now succeeds (old entries are evicted).
    const ProcResult unpin = run_kcache(cache.db(), {"unpin", names[0], names[1]});
    REQUIRE(unpin.exit_code == 0);
    CHECK(write_all(cache.p("new/kernel.cubin"), random_bytes(2 * kEntrySize, 50)) == 0);
    CHECK(read_all(cache.p(names[3] + "/kernel.cubin")) == random_bytes(kEntrySize, 3));

    // The refusal is counted as what it was.
    cache.unmount();
    CHECK(stat_value(cache_stats(cache.db()), "errors_nospc") >= 1);
}

TEST_CASE("beyond --max-size least recently used entries are evicted from the mount",
          "[fsd][limits][eviction]") {
    DaemonOptions options;
    options.args = {"--max-size", "1M"};
    MountedCache cache(options);
    constexpr std::size_t kEntrySize = 200 * 1024;
    constexpr int kEntries = 10;  // 2 MiB in all: about half must go
    for (int i = 0; i < kEntries; ++i) {
        const std::string name = "e" + std::to_string(i);
        REQUIRE_SYS(mkdir(cache.p(name).c_str(), 0755));
        const int err = write_all(cache.p(name + "/kernel.cubin"),
                                  random_bytes(kEntrySize, static_cast<std::uint64_t>(i)));
        INFO(name << ": " << std::strerror(err));
        REQUIRE(err == 0);
    }
    // The newest entry is there, the oldest went (eviction shows in the mount).
    CHECK(read_all(cache.p("e9/kernel.cubin")) == random_bytes(kEntrySize, 9));
    const bool oldest_gone =
        wait_until([&] { return access(cache.p("e0").c_str(), F_OK) != 0 && errno == ENOENT; }, 2);
    CHECK(oldest_gone);
    // Whatever is still listed is readable and whole.
    int present = 0;
    for (int i = 0; i < kEntries; ++i) {
        const std::string path = cache.p("e" + std::to_string(i) + "/kernel.cubin");
        const auto got = read_all(path);
        if (!got) continue;
        ++present;
        INFO(path);
        CHECK(*got == random_bytes(kEntrySize, static_cast<std::uint64_t>(i)));
    }
    CHECK(present >= 1);
    CHECK(present <= 5);
    cache.unmount();
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "stored_bytes") <= 1024 * 1024);
    CHECK(stat_value(stats, "evicted_entries") >= static_cast<std::uint64_t>(kEntries - 5));
}
