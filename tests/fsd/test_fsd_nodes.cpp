// Special nodes and hard links through the mount (fsd/src/handlers/nodes.cpp, issue 23): what
// pjdfstest checks at length (tests/posix), here in a few cases that run without it.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

using namespace kcache::test;

namespace {

struct stat stat_of(const std::string& path) {
    struct stat st {};
    REQUIRE_SYS(::lstat(path.c_str(), &st));
    return st;
}

void require_clean_db(MountedCache& cache) {
    cache.unmount();
    const ProcResult r = run_kcache(cache.db(), {"verify"});
    INFO(r.describe());
    CHECK(r.exit_code == 0);
}

}  // namespace

TEST_CASE("fifos, sockets and devices are made, listed, renamed and removed", "[fsd][nodes]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    REQUIRE_SYS(::mkfifo(cache.p("k/fifo").c_str(), 0640));
    REQUIRE_SYS(::mknod(cache.p("k/sock").c_str(), S_IFSOCK | 0600, 0));
    CHECK(S_ISFIFO(stat_of(cache.p("k/fifo")).st_mode));
    CHECK((stat_of(cache.p("k/fifo")).st_mode & 07777) == 0640);
    CHECK(S_ISSOCK(stat_of(cache.p("k/sock")).st_mode));
    if (geteuid() == 0) {  // devices need CAP_MKNOD
        REQUIRE_SYS(::mknod(cache.p("k/chr").c_str(), S_IFCHR | 0644, makedev(1, 3)));
        const struct stat st = stat_of(cache.p("k/chr"));
        CHECK(S_ISCHR(st.st_mode));
        CHECK(st.st_rdev == makedev(1, 3));
    }
    // A fifo on the mount is a fifo: a writer and a reader meet through it.
    Child writer([&] {
        const int fd = ::open(cache.p("k/fifo").c_str(), O_WRONLY);
        if (fd < 0) return 1;
        const bool ok = ::write(fd, "hi", 2) == 2;
        ::close(fd);
        return ok ? 0 : 2;
    });
    {
        Fd fd(::open(cache.p("k/fifo").c_str(), O_RDONLY));
        REQUIRE(fd);
        CHECK(read_fd(fd.get()) == std::optional<std::string>("hi"));
    }
    CHECK(writer.join().exit_code == 0);
    REQUIRE_SYS(::rename(cache.p("k/fifo").c_str(), cache.p("k/fifo2").c_str()));
    REQUIRE_SYS(::chmod(cache.p("k/fifo2").c_str(), 0600));
    CHECK((stat_of(cache.p("k/fifo2")).st_mode & 07777) == 0600);
    REQUIRE_SYS(::unlink(cache.p("k/sock").c_str()));
    CHECK(::access(cache.p("k/sock").c_str(), F_OK) == -1);
    require_clean_db(cache);
}

TEST_CASE("hard links inside an entry: one file, several names, nlink counts them",
          "[fsd][nodes]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    REQUIRE_SYS(::mkdir(cache.p("k/sub").c_str(), 0755));
    REQUIRE(write_all(cache.p("k/a"), "first") == 0);
    REQUIRE_SYS(::link(cache.p("k/a").c_str(), cache.p("k/sub/b").c_str()));
    CHECK(stat_of(cache.p("k/a")).st_nlink == 2);
    CHECK(stat_of(cache.p("k/sub/b")).st_ino == stat_of(cache.p("k/a")).st_ino);
    // A write through one name is read through the other.
    REQUIRE(write_all(cache.p("k/sub/b"), "second") == 0);
    CHECK(read_all(cache.p("k/a")) == std::optional<std::string>("second"));
    // Renaming one name over the other does nothing; unlinking one keeps the other.
    REQUIRE_SYS(::rename(cache.p("k/a").c_str(), cache.p("k/sub/b").c_str()));
    CHECK(stat_of(cache.p("k/a")).st_nlink == 2);
    REQUIRE_SYS(::unlink(cache.p("k/a").c_str()));
    CHECK(stat_of(cache.p("k/sub/b")).st_nlink == 1);
    CHECK(read_all(cache.p("k/sub/b")) == std::optional<std::string>("second"));
    // A file renamed over a name of a linked file replaces only that name.
    REQUIRE_SYS(::link(cache.p("k/sub/b").c_str(), cache.p("k/c").c_str()));
    REQUIRE(write_all(cache.p("k/new"), "new") == 0);
    REQUIRE_SYS(::rename(cache.p("k/new").c_str(), cache.p("k/c").c_str()));
    CHECK(read_all(cache.p("k/c")) == std::optional<std::string>("new"));
    CHECK(stat_of(cache.p("k/sub/b")).st_nlink == 1);
    CHECK(read_all(cache.p("k/sub/b")) == std::optional<std::string>("second"));
    // Directories have no hard links; names across entries are EXDEV.
    REQUIRE_FAILS_WITH(::link(cache.p("k/sub").c_str(), cache.p("k/sub2").c_str()), EPERM);
    REQUIRE_SYS(::mkdir(cache.p("other").c_str(), 0755));
    REQUIRE_FAILS_WITH(::link(cache.p("k/c").c_str(), cache.p("other/c").c_str()), EXDEV);
    // A linked file moves only inside its entry (mv copies on EXDEV).
    REQUIRE_SYS(::link(cache.p("k/sub/b").c_str(), cache.p("k/d").c_str()));
    REQUIRE_FAILS_WITH(::rename(cache.p("k/d").c_str(), cache.p("other/d").c_str()), EXDEV);
    REQUIRE_SYS(::rename(cache.p("k/d").c_str(), cache.p("k/sub/d").c_str()));
    CHECK(stat_of(cache.p("k/sub/d")).st_nlink == 2);
    require_clean_db(cache);
}

TEST_CASE("evicting an entry removes every name of its linked files", "[fsd][nodes]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    REQUIRE(write_all(cache.p("k/a"), "bytes") == 0);
    REQUIRE_SYS(::link(cache.p("k/a").c_str(), cache.p("k/b").c_str()));
    const ProcResult evicted = run_kcache_settled(cache.db(), {"evict", "k"});
    INFO(evicted.describe());
    REQUIRE(evicted.exit_code == 0);
    // The daemon follows the events log: both names leave the kernel's caches.
    CHECK(wait_until([&] { return ::access(cache.p("k/a").c_str(), F_OK) != 0; }, 10));
    CHECK(::access(cache.p("k/b").c_str(), F_OK) != 0);
    require_clean_db(cache);
}
