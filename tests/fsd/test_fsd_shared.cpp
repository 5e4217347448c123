// Several handles on one file (issue 11, DESIGN.md contract item 4): files that several
// handles write or read-write get POSIX semantics. What one handle writes is read by
// every handle afterwards, in any process; no close or fsync discards another
// handle's writes; byte-range locks, MAP_SHARED, O_APPEND, fdatasync and ftruncate
// behave as on a local disk. (O_TRUNC rewrites keep their own guarantees:
// test_fsd_publish.cpp.)

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

using namespace kcache::test;

namespace {

std::string pread_str(int fd, std::size_t len, off_t off) {
    std::string buf(len, '\0');
    const ssize_t n = pread(fd, buf.data(), len, off);
    buf.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    return buf;
}

bool pwrite_str(int fd, std::string_view s, off_t off) {
    return pwrite(fd, s.data(), s.size(), off) == static_cast<ssize_t>(s.size());
}

off_t size_of(int fd) {
    struct stat st {};
    return fstat(fd, &st) == 0 ? st.st_size : -1;
}

int lock(int fd, short type) {
    struct flock fl {};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    return fcntl(fd, F_SETLKW, &fl);
}

}  // namespace

TEST_CASE("a write through one handle is read through handles opened earlier, in one process",
          "[fsd][shared]") {
    MountedCache cache;
    const std::string path = cache.p("db.sqlite3");
    REQUIRE(write_all(path, std::string(8192, 'a')) == 0);
    Fd reader(open(path.c_str(), O_RDONLY));  // opened before any writer
    Fd a(open(path.c_str(), O_RDWR));
    Fd b(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(reader.get());
    REQUIRE_SYS(a.get());
    REQUIRE_SYS(b.get());
    REQUIRE(pread_str(b.get(), 4, 100) == "aaaa");  // b's pages are cached now
    REQUIRE(pwrite_str(a.get(), "BBBB", 100));
    CHECK(pread_str(b.get(), 4, 100) == "BBBB");
    CHECK(pread_str(reader.get(), 4, 100) == "BBBB");
    REQUIRE(pwrite_str(b.get(), "CCCC", 9000));  // b grows the file
    CHECK(size_of(a.get()) == 9004);
    CHECK(pread_str(a.get(), 4, 9000) == "CCCC");
    CHECK(pread_str(reader.get(), 4, 9000) == "CCCC");
    // A handle opened now, read-only or not, reads the same.
    Fd late(open(path.c_str(), O_RDONLY));
    REQUIRE_SYS(late.get());
    CHECK(pread_str(late.get(), 4, 100) == "BBBB");
    struct stat st {};
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK(st.st_size == 9004);
}

TEST_CASE("no close discards another handle's writes", "[fsd][shared]") {
    MountedCache cache;
    const std::string path = cache.p("log.txt");
    REQUIRE(write_all(path, std::string(4096, '.')) == 0);
    Fd a(open(path.c_str(), O_RDWR));
    Fd b(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(a.get());
    REQUIRE_SYS(b.get());
    REQUIRE(pwrite_str(a.get(), "from a", 0));
    REQUIRE(pwrite_str(b.get(), "from b", 1000));
    SECTION("a closes first") {
        REQUIRE_SYS(a.close());
        REQUIRE_SYS(b.close());
    }
    SECTION("b closes first") {
        REQUIRE_SYS(b.close());
        REQUIRE_SYS(a.close());
    }
    const auto got = read_all(path);
    REQUIRE(got.has_value());
    CHECK(got->substr(0, 6) == "from a");
    CHECK(got->substr(1000, 6) == "from b");
    cache.remount();  // and both were stored
    const auto stored = read_all(path);
    REQUIRE(stored.has_value());
    CHECK(stored->substr(0, 6) == "from a");
    CHECK(stored->substr(1000, 6) == "from b");
}

TEST_CASE("a write in one process is read by a handle another process opened earlier",
          "[fsd][shared]") {
    MountedCache cache;
    const std::string path = cache.p("shared.bin");
    REQUIRE(write_all(path, std::string(100, 'x')) == 0);
    Fd mine(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(mine.get());
    REQUIRE(pread_str(mine.get(), 100, 0) == std::string(100, 'x'));
    const ChildResult r = run_child([&] {
        const int fd = open(path.c_str(), O_RDWR);
        if (fd < 0) return 1;
        if (!pwrite_str(fd, "child", 10)) return 2;
        if (fsync(fd) != 0) return 3;
        return close(fd) == 0 ? 0 : 4;
    });
    REQUIRE(r.exit_code == 0);
    CHECK(pread_str(mine.get(), 5, 10) == "child");
    // And what this handle writes now, the child's close did not take back.
    REQUIRE(pwrite_str(mine.get(), "parent", 50));
    REQUIRE_SYS(mine.close());
    const auto got = read_all(path);
    REQUIRE(got.has_value());
    CHECK(got->substr(10, 5) == "child");
    CHECK(got->substr(50, 6) == "parent");
}

TEST_CASE("a counter under an fcntl lock, incremented by 6 processes, loses no increment",
          "[fsd][shared][locks]") {
    // The pattern SQLite relies on: lock, read what the last holder wrote, write, unlock.
    MountedCache cache;
    const std::string path = cache.p("counter");
    REQUIRE(write_all(path, std::string(16, '0')) == 0);
    constexpr int kProcs = 6, kIncrements = 40;
    std::vector<std::unique_ptr<Child>> children;
    for (int p = 0; p < kProcs; ++p) {
        children.push_back(std::make_unique<Child>([&, p] {
            for (int i = 0; i < kIncrements; ++i) {
                // Half of them keep a new descriptor per increment (a connection per operation).
                const int fd = open(path.c_str(), O_RDWR);
                if (fd < 0 || lock(fd, F_WRLCK) != 0) return 1;
                const std::string now = pread_str(fd, 16, 0);
                const long value = std::stol(now);
                char next[32];
                std::snprintf(next, sizeof next, "%016ld", value + 1);
                if (!pwrite_str(fd, std::string_view(next, 16), 0)) return 2;
                if (p % 2 == 0 && fdatasync(fd) != 0) return 3;
                if (lock(fd, F_UNLCK) != 0) return 4;
                if (close(fd) != 0) return 5;
            }
            return 0;
        }));
    }
    for (auto& c : children) CHECK(c->join(120).exit_code == 0);
    const auto got = read_all(path);
    REQUIRE(got.has_value());
    CHECK(std::stol(*got) == kProcs * kIncrements);
}

TEST_CASE("MAP_SHARED of a file open for writing works and is shared between processes",
          "[fsd][shared][mmap]") {
    // SQLite's WAL mode maps its -shm file in every connection.
    MountedCache cache;
    const std::string path = cache.p("db-shm");
    Fd fd(open(path.c_str(), O_RDWR | O_CREAT, 0644));
    REQUIRE_SYS(fd.get());
    REQUIRE_SYS(ftruncate(fd.get(), 32768));
    void* map = mmap(nullptr, 32768, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    INFO("mmap: " << std::strerror(errno));
    REQUIRE(map != MAP_FAILED);
    auto* bytes = static_cast<char*>(map);
    std::memcpy(bytes + 100, "mapped", 6);
    // Another process maps it and sees the write at once (one page cache), and its
    // write is seen here.
    const ChildResult r = run_child([&] {
        const int cfd = open(path.c_str(), O_RDWR);
        if (cfd < 0) return 1;
        void* m = mmap(nullptr, 32768, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
        if (m == MAP_FAILED) return 2;
        auto* b = static_cast<char*>(m);
        if (std::memcmp(b + 100, "mapped", 6) != 0) return 3;
        std::memcpy(b + 20000, "child", 5);
        if (msync(m, 32768, MS_SYNC) != 0) return 4;
        munmap(m, 32768);
        return close(cfd) == 0 ? 0 : 5;
    });
    CHECK(r.exit_code == 0);
    CHECK(std::memcmp(bytes + 20000, "child", 5) == 0);
    REQUIRE_SYS(msync(map, 32768, MS_SYNC));
    // pread sees what the mapping wrote.
    CHECK(pread_str(fd.get(), 6, 100) == "mapped");
    REQUIRE_SYS(munmap(map, 32768));
    REQUIRE_SYS(fd.close());
    cache.remount();
    const auto got = read_all(path);
    REQUIRE(got.has_value());
    REQUIRE(got->size() == 32768);
    CHECK(got->substr(100, 6) == "mapped");
    CHECK(got->substr(20000, 5) == "child");
}

TEST_CASE("listing the directory of a mapped file being written does not cut the mapping",
          "[fsd][shared][mmap]") {
    // readdirplus and lookup tell the kernel a file's size: it must be the live one, or
    // the kernel cuts the pages a MAP_SHARED mapping uses (SIGBUS on SQLite's -shm).
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("d").c_str(), 0755));
    const std::string path = cache.p("d/db-shm");
    const std::string dir = cache.p("d");
    const ChildResult r = run_child([&] {
        const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0644);
        if (fd < 0) return 1;
        if (ftruncate(fd, 32768) != 0) return 2;
        void* m = mmap(nullptr, 32768, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) return 3;
        auto* b = static_cast<char*>(m);
        std::memset(b, 'm', 32768);
        for (int i = 0; i < 3; ++i) {
            DIR* d = opendir(dir.c_str());  // readdirplus: the size of each entry
            if (!d) return 4;
            while (readdir(d)) {
            }
            closedir(d);
            b[30000 + i] = 'x';  // SIGBUS if the kernel was told a smaller size
            struct stat st {};
            if (stat(path.c_str(), &st) != 0 || st.st_size != 32768) return 5;
        }
        if (msync(m, 32768, MS_SYNC) != 0) return 6;
        munmap(m, 32768);
        return close(fd) == 0 ? 0 : 7;
    });
    CHECK(r.exit_code == 0);
    const auto got = read_all(path);
    REQUIRE(got.has_value());
    CHECK(got->size() == 32768);
}

TEST_CASE("O_APPEND from several processes interleaves whole records and loses none",
          "[fsd][shared][append]") {
    MountedCache cache;
    const std::string path = cache.p("build.log");
    constexpr int kProcs = 5, kLines = 150;
    std::vector<std::unique_ptr<Child>> children;
    for (int p = 0; p < kProcs; ++p) {
        children.push_back(std::make_unique<Child>([&, p] {
            const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd < 0) return 1;
            for (int i = 0; i < kLines; ++i) {
                char line[32];
                const int n = std::snprintf(line, sizeof line, "proc %d line %04d\n", p, i);
                if (write(fd, line, static_cast<std::size_t>(n)) != n) return 2;
            }
            return close(fd) == 0 ? 0 : 3;
        }));
    }
    for (auto& c : children) CHECK(c->join(60).exit_code == 0);
    const auto got = read_all(path);
    REQUIRE(got.has_value());
    CHECK(got->size() ==
          static_cast<std::size_t>(kProcs * kLines) * std::strlen("proc 0 line 0000\n"));
    std::vector<int> next(kProcs, 0);
    std::size_t pos = 0;
    bool ordered = true;
    while (pos < got->size()) {
        const auto end = got->find('\n', pos);
        if (end == std::string::npos) break;
        int p = -1, i = -1;
        if (std::sscanf(got->c_str() + pos, "proc %d line %d", &p, &i) != 2 || p < 0 ||
            p >= kProcs || i != next[static_cast<std::size_t>(p)]++) {
            ordered = false;
            break;
        }
        pos = end + 1;
    }
    CHECK(ordered);
    for (int p = 0; p < kProcs; ++p) CHECK(next[static_cast<std::size_t>(p)] == kLines);
}

TEST_CASE("ftruncate while another handle writes cuts the one shared file", "[fsd][shared]") {
    MountedCache cache;
    const std::string path = cache.p("t.bin");
    REQUIRE(write_all(path, std::string(10000, 'z')) == 0);
    Fd a(open(path.c_str(), O_RDWR));
    Fd b(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(a.get());
    REQUIRE_SYS(b.get());
    REQUIRE(pwrite_str(a.get(), "head", 0));
    REQUIRE_SYS(ftruncate(b.get(), 100));
    CHECK(size_of(a.get()) == 100);
    REQUIRE(pwrite_str(a.get(), "tail", 200));  // past the new end: a hole of zeros
    CHECK(size_of(b.get()) == 204);
    std::string expected = "head" + std::string(96, 'z') + std::string(100, '\0') + "tail";
    CHECK(pread_str(b.get(), 300, 0) == expected);
    REQUIRE_SYS(b.close());
    REQUIRE_SYS(a.close());
    CHECK(read_all(path) == expected);
}

TEST_CASE("what fdatasync returned survives a daemon SIGKILL", "[fsd][shared][durability]") {
    MountedCache cache(DaemonOptions{.args = {"--durability", "full"}});
    const std::string path = cache.p("journal.bin");
    REQUIRE(write_all(path, std::string(65536, 'o')) == 0);
    Fd a(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(a.get());
    REQUIRE(pwrite_str(a.get(), "committed", 30000));
    REQUIRE_SYS(fdatasync(a.get()));
    // Left open: the daemon dies under it.
    CHECK(cache.signal_daemon(SIGKILL) == -1);
    a.reset();
    cache.remount();
    const auto got = read_all(path);
    REQUIRE(got.has_value());
    REQUIRE(got->size() == 65536);
    CHECK(got->substr(30000, 9) == "committed");
}

TEST_CASE("an fsync of an unchanged file stores nothing", "[fsd][shared][cost]") {
    MountedCache cache;
    const std::string path = cache.p("f.bin");
    REQUIRE(write_all(path, random_bytes(200000, 5)) == 0);
    Fd a(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(a.get());
    REQUIRE(pwrite_str(a.get(), "x", 7));
    REQUIRE_SYS(fsync(a.get()));
    const auto before = stat_value(cache_stats(cache.db()), "stores");
    for (int i = 0; i < 20; ++i) REQUIRE_SYS(fsync(a.get()));
    REQUIRE_SYS(a.close());
    const auto after = stat_value(cache_stats(cache.db()), "stores");
    CHECK(after == before);
}

TEST_CASE(
    "a database file rewritten in place is one entry and one miss, its reads through a "
    "read-write handle are hits",
    "[fsd][shared][stats]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("triton").c_str(), 0755));
    const std::string path = cache.p("triton/cache-v1.sqlite3");
    // One process creates the database and commits ten times. (Siblings, not this
    // process: an ancestor or descendant of the populating process is its own
    // compile and counts no hit.)
    const ChildResult w = run_child([&] {
        if (write_all(path, std::string(4096, '\0')) != 0) return 1;
        for (int i = 0; i < 10; ++i) {
            const int fd = open(path.c_str(), O_RDWR);
            if (fd < 0) return 2;
            const bool ok = pwrite_str(fd, "commit " + std::to_string(i), 100) && fsync(fd) == 0;
            if (close(fd) != 0 || !ok) return 3;
        }
        return 0;
    });
    REQUIRE(w.exit_code == 0);
    // Another process opens it read-write and reads: one hit.
    const ChildResult r = run_child([&] {
        const int fd = open(path.c_str(), O_RDWR);
        if (fd < 0) return 1;
        if (pread_str(fd, 8, 100) != "commit 9") return 2;
        return close(fd) == 0 ? 0 : 3;
    });
    REQUIRE(r.exit_code == 0);
    cache.unmount();
    const auto stats = cache_stats(cache.db());
    INFO(stats.dump());
    CHECK(stat_value(stats, "entries") == 1);
    CHECK(stat_value(stats, "misses") == 1);
    CHECK(stat_value(stats, "hits") == 1);
}

namespace {

void sqlite_run(const std::string& journal) {
    MountedCache cache(DaemonOptions{.args = {"--durability", "full"}, .watchdog_s = 600});
    const std::string db = cache.p("cache-v1.sqlite3");
    const char* txns_env = std::getenv("KCACHE_SQLITE_TXNS");
    const std::string txns = txns_env ? txns_env : "150";
    std::vector<std::string> args{"write",  "--db", db,          "--procs", "8",
                                  "--txns", txns,   "--journal", journal};
    // WAL: a writer never sees "database is locked" (the busy timeout is its only wait,
    // as on a local disk). Rollback-journal mode keeps the retries Triton's backend has.
    if (journal == "wal") args.push_back("--strict");
    const ProcResult w = run_flow("sqlite_writers.py", args, 500);
    INFO("write: " << w.describe() << "\n"
                   << w.out << "\ndaemon stderr:\n"
                   << cache.daemon_stderr());
    REQUIRE(w.exit_code == 0);
    std::fprintf(stderr, "sqlite on the mount: %s", w.out.c_str());
    const ProcResult c =
        run_flow("sqlite_writers.py", {"check", "--db", db, "--procs", "8", "--txns", txns});
    INFO("check: " << c.describe() << "\n" << c.out);
    CHECK(c.exit_code == 0);
    // The database is one entry; its journal, WAL and shared-memory index, made and
    // dropped per transaction, are bookkeeping: no miss per commit.
    const auto stats = cache_stats(cache.db());
    CHECK(stat_value(stats, "entries") == 1);
    CHECK(stat_value(stats, "misses") == 1);
    cache.remount();
    const ProcResult again =
        run_flow("sqlite_writers.py", {"check", "--db", db, "--procs", "8", "--txns", txns});
    INFO("check after a remount: " << again.describe() << "\n" << again.out);
    CHECK(again.exit_code == 0);
}

}  // namespace

TEST_CASE("sqlite3: 8 processes committing in rollback-journal mode lose no transaction",
          "[fsd][shared][sqlite]") {
    sqlite_run("delete");
}

TEST_CASE("sqlite3: 8 processes committing in WAL mode lose no transaction",
          "[fsd][shared][sqlite]") {
    sqlite_run("wal");
}

TEST_CASE("sqlite3 WAL: 5 rounds of 6 processes, a new connection per insert, none locked",
          "[fsd][shared][sqlite]") {
    // Issue 33: "database is locked" at once (not after the busy timeout) at a writer's
    // first row. Each round is a new database: rounds 0, 2, 4 find it made by one
    // connection (in WAL mode, with its table), rounds 1 and 3 make it themselves
    // (--fresh: SQLite's own immediate SQLITE_BUSY when two first connections convert a
    // new database to WAL at once is tried again there, and only there: it happens on
    // ext4 too). Any other "database is locked", in any round, fails.
    MountedCache cache;
    for (int round = 0; round < 5; ++round) {
        INFO("round " << round);
        const std::string db = cache.p("wal-" + std::to_string(round) + ".sqlite3");
        std::vector<std::string> args{"write",  "--db", db,          "--procs", "6",
                                      "--txns", "40",   "--journal", "wal",     "--strict"};
        if (round % 2 == 1) args.push_back("--fresh");
        const ProcResult w = run_flow("sqlite_writers.py", args, 200);
        INFO("write: " << w.describe() << "\n"
                       << w.out << "\ndaemon stderr:\n"
                       << cache.daemon_stderr());
        REQUIRE(w.exit_code == 0);
        const ProcResult c =
            run_flow("sqlite_writers.py", {"check", "--db", db, "--procs", "6", "--txns", "40"});
        INFO("check: " << c.describe() << "\n" << c.out);
        CHECK(c.exit_code == 0);
    }
}

TEST_CASE("sqlite3: every commit that returned survives a daemon SIGKILL mid-run and a remount",
          "[fsd][shared][sqlite][durability]") {
    for (const std::string journal : {"delete", "wal"}) {
        INFO("journal mode " << journal);
        MountedCache cache(DaemonOptions{.args = {"--durability", "full"}, .watchdog_s = 600});
        TempDir logs;  // on local disk: what each writer saw acknowledged
        const std::string db = cache.p("cache-v1.sqlite3");
        std::vector<std::string> argv{"/usr/bin/python3",
                                      std::string(KCACHE_FSD_FLOWS_DIR) + "/sqlite_writers.py",
                                      "write",
                                      "--db",
                                      db,
                                      "--procs",
                                      "8",
                                      "--txns",
                                      "100000",
                                      "--journal",
                                      journal,
                                      "--log",
                                      logs.path().string()};
        Child writers([&] {
            execv(argv[0].c_str(), [&] {
                static std::vector<char*> v;
                v.clear();
                for (auto& a : argv) v.push_back(a.data());
                v.push_back(nullptr);
                return v.data();
            }());
            return 127;
        });
        // Let them commit for a while, then kill the daemon under them.
        const bool some = wait_until(
            [&] {
                std::size_t lines = 0;
                for (const auto& f : fs::directory_iterator(logs.path())) {
                    const auto text = read_all(f.path().string());
                    if (text)
                        lines +=
                            static_cast<std::size_t>(std::count(text->begin(), text->end(), '\n'));
                }
                return lines >= 150;
            },
            120);
        REQUIRE(some);
        CHECK(cache.signal_daemon(SIGKILL) == -1);
        (void)writers.join(120);  // they fail once the mount is gone
        cache.remount();
        const ProcResult c =
            run_flow("sqlite_writers.py", {"check", "--db", db, "--log", logs.path().string()});
        INFO("check after the kill and a remount: " << c.describe() << "\n" << c.out);
        CHECK(c.exit_code == 0);
    }
}
