// The control path (DESIGN.md, "Control path"): `kcache` changes the db while the daemon
// serves it; the daemon follows the events log and the mount shows the change at once.
// Every step that touches the mount runs in a child with its own timeout, so a deadlock
// in the daemon's invalidation fails the step instead of hanging the test.

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

using namespace kcache::test;

namespace {

constexpr double kStepTimeout = 20;  // a step that takes longer is a deadlock

// Runs a step touching the mount in a child; REQUIRE it ends in time with 0.
void step(const std::string& what, const std::function<int()>& fn, const MountedCache& cache) {
    const ChildResult r = run_child(fn, kStepTimeout);
    INFO(what << ": "
              << (r.timed_out ? "no answer within the step's time (deadlock?)"
                              : "exit " + std::to_string(r.exit_code))
              << "\ndaemon stderr:\n"
              << cache.daemon_stderr());
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.exit_code == 0);
}

ProcResult kcache_ok(const MountedCache& cache, const std::vector<std::string>& args) {
    const ProcResult r = run_kcache_settled(cache.db(), args);
    INFO("kcache " << args.front() << ": " << r.describe() << "\ndaemon stderr:\n"
                   << cache.daemon_stderr());
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.exit_code == 0);
    return r;
}

// 0 once `path` gives ENOENT (within 2 s), 1 if it stays, 2 on another error.
int wait_gone(const std::string& path) {
    int last_errno = 0;
    const bool gone = wait_until(
        [&] {
            struct stat st {};
            if (stat(path.c_str(), &st) == 0) return false;
            last_errno = errno;
            return errno == ENOENT;
        },
        2);
    if (gone) return 0;
    std::fprintf(stderr, "%s: still there after 2 s (last errno %d)\n", path.c_str(), last_errno);
    return last_errno == 0 ? 1 : 2;
}

std::vector<std::string> names_in(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
}

std::string content_of(int i) {
    return random_bytes(50000 + static_cast<std::size_t>(i), static_cast<std::uint64_t>(i));
}

// Entries h0..h{n-1}, each a directory with kernel.cubin and kernel.json, looked up and
// read (so the kernel caches their dentries, attributes and pages).
void populate(const MountedCache& cache, int n) {
    for (int i = 0; i < n; ++i) {
        const std::string dir = cache.p("h" + std::to_string(i));
        REQUIRE_SYS(mkdir(dir.c_str(), 0755));
        REQUIRE(write_all(dir + "/kernel.cubin", content_of(i)) == 0);
        REQUIRE(write_all(dir + "/kernel.json", "{\"i\": " + std::to_string(i) + "}") == 0);
    }
    step(
        "reading every entry",
        [&] {
            for (int i = 0; i < n; ++i) {
                if (read_all(cache.p("h" + std::to_string(i) + "/kernel.cubin")) != content_of(i))
                    return 1;
            }
            return 0;
        },
        cache);
}

}  // namespace

TEST_CASE("kcache evict while mounted removes the entry from the mount", "[fsd][control]") {
    MountedCache cache;
    populate(cache, 3);

    kcache_ok(cache, {"evict", "h1"});
    step(
        "h1 gives ENOENT", [&] { return wait_gone(cache.p("h1")); }, cache);
    step(
        "h1's files give ENOENT", [&] { return wait_gone(cache.p("h1/kernel.cubin")); }, cache);
    step(
        "the others are intact",
        [&] {
            return read_all(cache.p("h0/kernel.cubin")) == content_of(0) &&
                           read_all(cache.p("h2/kernel.cubin")) == content_of(2)
                       ? 0
                       : 1;
        },
        cache);
    step(
        "readdir no longer lists h1",
        [&] {
            return names_in(cache.mnt().string()) == std::vector<std::string>{"h0", "h2"} ? 0 : 1;
        },
        cache);

    // The name can be used again, and the mount serves the new content, not a stale page.
    step(
        "h1 again, new content",
        [&] {
            if (mkdir(cache.p("h1").c_str(), 0755) != 0) return 1;
            if (write_all(cache.p("h1/kernel.cubin"), content_of(100)) != 0) return 2;
            return read_all(cache.p("h1/kernel.cubin")) == content_of(100) ? 0 : 3;
        },
        cache);

    cache.unmount();
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "evicted_entries") == 1);
}

TEST_CASE("kcache evict of a JAX pair while mounted removes both files from the mount",
          "[fsd][control]") {
    // A stem entry has no node of its own: the daemon learns each file's name from the
    // events log, or the kernel would keep serving the names it cached.
    MountedCache cache;
    const std::string key =
        "jit_f-0f3c6e8a1b2d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";
    const std::string other =
        "jit_g-1f3c6e8a1b2d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";
    step(
        "JAX stores two pairs",
        [&] {
            if (mkdir(cache.p("jax").c_str(), 0755) != 0) return 1;
            for (const auto& k : {key, other}) {
                if (write_all(cache.p("jax/" + k + "-cache"), content_of(1)) != 0) return 2;
                if (write_all(cache.p("jax/" + k + "-atime"), "12345678") != 0) return 3;
            }
            // Looked up (and cached by the kernel) before the eviction.
            return read_all(cache.p("jax/" + key + "-cache")) == content_of(1) &&
                           read_all(cache.p("jax/" + key + "-atime")) == "12345678"
                       ? 0
                       : 4;
        },
        cache);
    kcache_ok(cache, {"evict", "jax/" + key});
    // JAX's next put opens the names it knew for writing, with no lookup of its own
    // first: the kernel must not still take them for the evicted files (ENOENT).
    // At once: before the daemon's invalidator has caught up, the open of a name whose
    // inode was evicted gets ESTALE and the kernel looks the name up again.
    step(
        "JAX writes the pair again at once",
        [&] {
            if (const int e = write_all(cache.p("jax/" + key + "-cache"), content_of(2)); e != 0)
                return e;
            return write_all(cache.p("jax/" + key + "-atime"), "87654321");
        },
        cache);
    kcache_ok(cache, {"evict", "jax/" + key});
    step(
        "both halves give ENOENT",
        [&] {
            if (const int r = wait_gone(cache.p("jax/" + key + "-cache")); r != 0) return r;
            return wait_gone(cache.p("jax/" + key + "-atime"));
        },
        cache);
    step(
        "the other pair is intact",
        [&] {
            return names_in(cache.p("jax")) ==
                           std::vector<std::string>{other + "-atime", other + "-cache"}
                       ? 0
                       : 1;
        },
        cache);
    cache.unmount();
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "evicted_entries") == 2);
    CHECK(stat_value(stats, "entries") == 1);
    CHECK(stat_value(stats, "misses") == 3);
}

TEST_CASE("kcache clear while mounted empties the mount", "[fsd][control]") {
    MountedCache cache;
    populate(cache, 4);
    kcache_ok(cache, {"clear", "--yes"});
    step(
        "every entry gives ENOENT",
        [&] {
            for (int i = 0; i < 4; ++i) {
                if (const int r = wait_gone(cache.p("h" + std::to_string(i))); r != 0) return r;
            }
            return names_in(cache.mnt().string()).empty() ? 0 : 3;
        },
        cache);
    step(
        "the cache is usable afterwards",
        [&] {
            if (write_all(cache.p("after"), "x") != 0) return 1;
            return read_all(cache.p("after")) == std::string("x") ? 0 : 2;
        },
        cache);
}

TEST_CASE("evicting an entry that a process is reading does not break the read", "[fsd][control]") {
    MountedCache cache;
    populate(cache, 2);
    step(
        "open, evict, read on",
        [&] {
            const int fd = open(cache.p("h0/kernel.cubin").c_str(), O_RDONLY);
            if (fd < 0) return 1;
            std::string head(1000, '\0');
            if (read(fd, head.data(), head.size()) != 1000) return 2;
            // Readers hold no write lease: nothing stops the eviction.
            const ProcResult r = run_kcache(cache.db(), {"evict", "h0"});
            if (r.exit_code != 0) {
                std::fprintf(stderr, "kcache evict: %s\n", r.describe().c_str());
                return 3;
            }
            if (wait_gone(cache.p("h0")) != 0) return 4;
            const auto rest = read_fd(fd);
            close(fd);
            if (!rest || head + *rest != content_of(0)) {
                std::fprintf(stderr, "read after evict: %s\n",
                             rest ? "wrong content" : std::strerror(errno));
                return 5;
            }
            return 0;
        },
        cache);
    step(
        "the other entry is intact",
        [&] { return read_all(cache.p("h1/kernel.cubin")) == content_of(1) ? 0 : 1; }, cache);
}

TEST_CASE(
    "a reader opened onto cached pages keeps its version when the entry is evicted and the pages "
    "dropped",
    "[fsd][control]") {
    // The daemon loads the content of a reader whose version the kernel's pages hold
    // at its first READ, not at OPEN (docs/fsd.md, "Content at the first
    // READ"). Here that READ comes only after another process evicted the entry and
    // the pages were dropped: the content must still be the reader's.
    MountedCache cache;
    populate(cache, 2);
    step(
        "fill the page cache, open again, evict, drop the pages, read",
        [&] {
            const std::string path = cache.p("h0/kernel.cubin");
            if (read_all(path) != content_of(0)) return 1;  // its pages are now the kernel's
            const int fd = open(path.c_str(), O_RDONLY);    // onto the kept pages: no copy at OPEN
            if (fd < 0) return 2;
            const ProcResult r = run_kcache(cache.db(), {"evict", "h0"});
            if (r.exit_code != 0) {
                std::fprintf(stderr, "kcache evict: %s\n", r.describe().c_str());
                return 3;
            }
            if (wait_gone(cache.p("h0")) != 0) return 4;
            // Memory pressure would do the same: the next read must ask the daemon.
            if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) return 5;
            const auto all = read_fd(fd);
            close(fd);
            if (!all || *all != content_of(0)) {
                std::fprintf(stderr, "read after evict and page drop: %s\n",
                             all ? "wrong content" : std::strerror(errno));
                return 6;
            }
            return 0;
        },
        cache);
}

TEST_CASE("evictions under concurrent load neither deadlock nor serve evicted entries",
          "[fsd][control]") {
    MountedCache cache;
    constexpr int kEntries = 6;
    populate(cache, kEntries);
    const std::string stop_flag = (cache.root() / "stop").string();
    // Two processes keep looking up and reading every entry while they are evicted.
    std::vector<std::unique_ptr<Child>> load;
    for (int l = 0; l < 2; ++l) {
        load.push_back(std::make_unique<Child>([&] {
            while (access(stop_flag.c_str(), F_OK) != 0) {
                for (int i = 0; i < kEntries; ++i) {
                    const std::string dir = cache.p("h" + std::to_string(i));
                    struct stat st {};
                    if (stat(dir.c_str(), &st) != 0 && errno != ENOENT) return 1;
                    const auto got = read_all(dir + "/kernel.cubin");
                    if (!got && errno != ENOENT) {
                        std::fprintf(stderr, "load: %s: %s\n", dir.c_str(), std::strerror(errno));
                        return 2;
                    }
                    if (got && *got != content_of(i)) {
                        std::fprintf(stderr, "load: %s: wrong content\n", dir.c_str());
                        return 3;
                    }
                    DIR* d = opendir(cache.mnt().c_str());
                    if (!d) return 4;
                    while (readdir(d) != nullptr) {
                    }
                    closedir(d);
                }
            }
            return 0;
        }));
    }
    for (int i = 0; i < kEntries; ++i) {
        const std::string name = "h" + std::to_string(i);
        kcache_ok(cache, {"evict", name});
        step(
            name + " gives ENOENT", [&] { return wait_gone(cache.p(name)); }, cache);
    }
    write_file(stop_flag, "");
    for (auto& child : load) {
        const ChildResult r = child->join(kStepTimeout);
        CHECK_FALSE(r.timed_out);
        CHECK(r.exit_code == 0);
    }
    step(
        "the mount is empty", [&] { return names_in(cache.mnt().string()).empty() ? 0 : 1; },
        cache);
}

TEST_CASE("a pinned entry survives kcache evict and size pressure", "[fsd][control]") {
    DaemonOptions options;
    options.args = {"--max-size", "1M"};
    MountedCache cache(options);
    populate(cache, 2);
    kcache_ok(cache, {"pin", "h0"});
    const ProcResult refused = run_kcache(cache.db(), {"evict", "h0"});
    CHECK(refused.exit_code != 0);
    // Fill to twice the bound: about half of the unpinned entries must go, never h0.
    constexpr int kFill = 10;
    for (int i = 0; i < kFill; ++i) {
        const std::string dir = cache.p("fill" + std::to_string(i));
        REQUIRE_SYS(mkdir(dir.c_str(), 0755));
        REQUIRE(write_all(dir + "/kernel.cubin",
                          random_bytes(200 * 1024, 1000 + static_cast<std::uint64_t>(i))) == 0);
    }
    step(
        "some unpinned entries were evicted",
        [&] {
            const bool evicted = wait_until(
                [&] {
                    int present = 0;
                    for (int i = 0; i < kFill; ++i)
                        present += access(cache.p("fill" + std::to_string(i)).c_str(), F_OK) == 0;
                    return present < kFill;
                },
                2);
            return evicted ? 0 : 1;
        },
        cache);
    step(
        "h0 is still there",
        [&] { return read_all(cache.p("h0/kernel.cubin")) == content_of(0) ? 0 : 1; }, cache);
    cache.unmount();
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "stored_bytes") <= 1024 * 1024);
}
