// The filesystem contract compilers rely on (DESIGN.md, "What compilers rely on"):
// one test case per promise, each on a fresh mount.

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

#ifndef KCACHE_FSD_TESTLIB_PATH
#error "KCACHE_FSD_TESTLIB_PATH must name the test shared library"
#endif

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

using namespace kcache::test;

namespace {

int renameat2_noreplace(const std::string& from, const std::string& to) {
    return static_cast<int>(
        syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE));
}

// Names in a directory (without . and ..), by readdir(3); `dups` gets names seen twice.
std::vector<std::string> list_dir(const std::string& path,
                                  std::vector<std::string>* dups = nullptr) {
    std::vector<std::string> names;
    std::set<std::string> seen;
    DIR* d = opendir(path.c_str());
    if (!d) return names;
    while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        if (!seen.insert(name).second && dups) dups->push_back(name);
        names.push_back(name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

bool all_bytes_equal(const std::string& s) {
    return std::all_of(s.begin(), s.end(), [&](char c) { return c == s.front(); });
}

std::string file_content(const std::string& path) {
    const auto content = read_all(path);
    INFO("reading " << path << ": " << std::strerror(errno));
    REQUIRE(content.has_value());
    return *content;
}

void write_file_ok(const std::string& path, const std::string& bytes) {
    const int e = write_all(path, bytes);
    INFO("writing " << path << ": " << std::strerror(e));
    REQUIRE(e == 0);
}

}  // namespace

TEST_CASE("rename replaces an existing file atomically", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    constexpr std::size_t kSize = 64 * 1024;
    const std::string target = cache.p("k/kernel.cubin");
    write_file_ok(target, std::string(kSize, 'a'));

    SECTION("the target has the new content and the source is gone") {
        write_file_ok(cache.p("k/tmp"), std::string(100, 'b'));
        REQUIRE_SYS(rename(cache.p("k/tmp").c_str(), target.c_str()));
        CHECK(file_content(target) == std::string(100, 'b'));
        struct stat st {};
        REQUIRE_FAILS_WITH(stat(cache.p("k/tmp").c_str(), &st), ENOENT);
        CHECK(list_dir(cache.p("k")) == std::vector<std::string>{"kernel.cubin"});
    }

    SECTION("a reader in another process always finds a complete version") {
        const std::string done_flag = (cache.root() / "writer-done").string();
        Child reader([&] {
            int reads = 0;
            while (reads < 20 || access(done_flag.c_str(), F_OK) != 0) {
                const int fd = open(target.c_str(), O_RDONLY);
                if (fd < 0) {
                    std::fprintf(stderr, "open %d of the target failed: %s\n", reads,
                                 std::strerror(errno));
                    return 1;
                }
                const auto content = read_fd(fd);
                const int read_errno = errno;
                close(fd);
                if (!content) {
                    std::fprintf(stderr, "read %d of the target failed: %s\n", reads,
                                 std::strerror(read_errno));
                    return 1;
                }
                if (content->size() != kSize || !all_bytes_equal(*content)) {
                    std::fprintf(stderr, "read %d: torn or short content (%zu bytes)\n", reads,
                                 content->size());
                    return 2;
                }
                ++reads;
            }
            return 0;
        });
        for (int i = 0; i < 100; ++i) {
            const std::string tmp = cache.p("k/tmp." + std::to_string(i));
            write_file_ok(tmp, std::string(kSize, static_cast<char>('b' + i % 20)));
            REQUIRE_SYS(rename(tmp.c_str(), target.c_str()));
        }
        write_file(done_flag, "");
        const ChildResult r = reader.join(60);
        REQUIRE_FALSE(r.timed_out);
        REQUIRE(r.exit_code == 0);
        CHECK(file_content(target) == std::string(kSize, static_cast<char>('b' + 99 % 20)));
        CHECK(list_dir(cache.p("k")) == std::vector<std::string>{"kernel.cubin"});
    }
}

TEST_CASE("RENAME_NOREPLACE refuses an existing target", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    write_file_ok(cache.p("k/a"), "first");
    write_file_ok(cache.p("k/b"), "second");

    REQUIRE_FAILS_WITH(renameat2_noreplace(cache.p("k/a"), cache.p("k/b")), EEXIST);
    CHECK(file_content(cache.p("k/a")) == "first");
    CHECK(file_content(cache.p("k/b")) == "second");

    // Without a target it renames.
    REQUIRE_SYS(renameat2_noreplace(cache.p("k/a"), cache.p("k/c")));
    CHECK(file_content(cache.p("k/c")) == "first");
    CHECK(access(cache.p("k/a").c_str(), F_OK) == -1);

    // Entry directories too (a compiler publishing a directory must not clobber one).
    REQUIRE_SYS(mkdir(cache.p("tmp_entry").c_str(), 0755));
    write_file_ok(cache.p("tmp_entry/x"), "new");
    REQUIRE_FAILS_WITH(renameat2_noreplace(cache.p("tmp_entry"), cache.p("k")), EEXIST);
    CHECK(file_content(cache.p("k/b")) == "second");
    CHECK(file_content(cache.p("tmp_entry/x")) == "new");
}

TEST_CASE("directories are renamed with their contents", "[fsd][contract]") {
    MountedCache cache;
    // Inductor publishes a directory by renaming a temporary one into place.
    REQUIRE_SYS(mkdir(cache.p("tmp.123").c_str(), 0755));
    REQUIRE_SYS(mkdir(cache.p("tmp.123/sub").c_str(), 0755));
    const std::string big = random_bytes(300 * 1024, 7);
    write_file_ok(cache.p("tmp.123/a.py"), "print('a')\n");
    write_file_ok(cache.p("tmp.123/sub/b.so"), big);

    SECTION("an entry directory at the top") {
        REQUIRE_SYS(rename(cache.p("tmp.123").c_str(), cache.p("key1").c_str()));
        CHECK(access(cache.p("tmp.123").c_str(), F_OK) == -1);
        CHECK(file_content(cache.p("key1/a.py")) == "print('a')\n");
        CHECK(file_content(cache.p("key1/sub/b.so")) == big);
        CHECK(list_dir(cache.mnt().string()) == std::vector<std::string>{"key1"});
    }
    SECTION("a directory inside an entry") {
        REQUIRE_SYS(rename(cache.p("tmp.123/sub").c_str(), cache.p("tmp.123/sub2").c_str()));
        CHECK(file_content(cache.p("tmp.123/sub2/b.so")) == big);
        CHECK(access(cache.p("tmp.123/sub").c_str(), F_OK) == -1);
    }
    SECTION("a directory moved into another entry") {
        REQUIRE_SYS(mkdir(cache.p("other").c_str(), 0755));
        REQUIRE_SYS(rename(cache.p("tmp.123/sub").c_str(), cache.p("other/moved").c_str()));
        CHECK(file_content(cache.p("other/moved/b.so")) == big);
        CHECK(list_dir(cache.p("tmp.123")) == std::vector<std::string>{"a.py"});
    }
    SECTION("over an empty directory, which it replaces") {
        REQUIRE_SYS(mkdir(cache.p("key1").c_str(), 0755));
        REQUIRE_SYS(rename(cache.p("tmp.123").c_str(), cache.p("key1").c_str()));
        CHECK(file_content(cache.p("key1/sub/b.so")) == big);
    }
    SECTION("into itself: EINVAL") {
        REQUIRE_FAILS_WITH(rename(cache.p("tmp.123").c_str(), cache.p("tmp.123/sub/x").c_str()),
                           EINVAL);
    }
    SECTION("a file over a directory: EISDIR; a directory over a file: ENOTDIR") {
        REQUIRE_FAILS_WITH(rename(cache.p("tmp.123/a.py").c_str(), cache.p("tmp.123/sub").c_str()),
                           EISDIR);
        REQUIRE_FAILS_WITH(rename(cache.p("tmp.123/sub").c_str(), cache.p("tmp.123/a.py").c_str()),
                           ENOTDIR);
    }
}

TEST_CASE("rename of a directory over a non-empty directory fails", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("key").c_str(), 0755));
    write_file_ok(cache.p("key/kernel.so"), "published");
    REQUIRE_SYS(mkdir(cache.p("tmp.9").c_str(), 0755));
    write_file_ok(cache.p("tmp.9/kernel.so"), "late duplicate");

    errno = 0;
    const int r = rename(cache.p("tmp.9").c_str(), cache.p("key").c_str());
    const int e = errno;
    INFO("rename -> " << r << " (" << std::strerror(e) << ")");
    REQUIRE(r == -1);
    CHECK((e == ENOTEMPTY || e == EEXIST));
    CHECK(file_content(cache.p("key/kernel.so")) == "published");
    CHECK(file_content(cache.p("tmp.9/kernel.so")) == "late duplicate");

    // The same inside an entry.
    REQUIRE_SYS(mkdir(cache.p("key/a").c_str(), 0755));
    REQUIRE_SYS(mkdir(cache.p("key/b").c_str(), 0755));
    write_file_ok(cache.p("key/b/f"), "x");
    errno = 0;
    const int r2 = rename(cache.p("key/a").c_str(), cache.p("key/b").c_str());
    const int e2 = errno;
    REQUIRE(r2 == -1);
    CHECK((e2 == ENOTEMPTY || e2 == EEXIST));
    CHECK(file_content(cache.p("key/b/f")) == "x");
}

TEST_CASE("rmdir of a non-empty directory fails with ENOTEMPTY", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("key").c_str(), 0755));
    REQUIRE_SYS(mkdir(cache.p("key/tmp.pid_1_x").c_str(), 0755));
    write_file_ok(cache.p("key/kernel.json"), "{}");
    REQUIRE_FAILS_WITH(rmdir(cache.p("key").c_str()), ENOTEMPTY);

    // os.removedirs: remove the leaf, then walk up until ENOTEMPTY stops it.
    REQUIRE_SYS(rmdir(cache.p("key/tmp.pid_1_x").c_str()));
    REQUIRE_FAILS_WITH(rmdir(cache.p("key").c_str()), ENOTEMPTY);
    CHECK(file_content(cache.p("key/kernel.json")) == "{}");

    // A directory holding only a subdirectory is not empty either.
    REQUIRE_SYS(mkdir(cache.p("e2").c_str(), 0755));
    REQUIRE_SYS(mkdir(cache.p("e2/sub").c_str(), 0755));
    REQUIRE_FAILS_WITH(rmdir(cache.p("e2").c_str()), ENOTEMPTY);
    REQUIRE_SYS(rmdir(cache.p("e2/sub").c_str()));
    REQUIRE_SYS(rmdir(cache.p("e2").c_str()));
    CHECK(access(cache.p("e2").c_str(), F_OK) == -1);

    // rmdir of a file, unlink of a directory.
    REQUIRE_FAILS_WITH(rmdir(cache.p("key/kernel.json").c_str()), ENOTDIR);
    errno = 0;
    const int r = unlink(cache.p("key").c_str());
    const int e = errno;
    REQUIRE(r == -1);
    CHECK((e == EISDIR || e == EPERM));
}

TEST_CASE("mkdir -p with exist_ok works", "[fsd][contract]") {
    MountedCache cache;
    std::error_code ec;
    CHECK(fs::create_directories(cache.path("key/a/b/c"), ec));
    REQUIRE_FALSE(ec);
    CHECK_FALSE(fs::create_directories(cache.path("key/a/b/c"), ec));  // exist_ok
    REQUIRE_FALSE(ec);
    CHECK(fs::is_directory(cache.path("key/a/b/c")));
    REQUIRE_FAILS_WITH(mkdir(cache.p("key/a").c_str(), 0755), EEXIST);
    write_file_ok(cache.p("key/file"), "x");
    REQUIRE_FAILS_WITH(mkdir(cache.p("key/file").c_str(), 0755), EEXIST);
    REQUIRE_FAILS_WITH(mkdir(cache.p("key/file/sub").c_str(), 0755), ENOTDIR);
    REQUIRE_FAILS_WITH(mkdir(cache.p("missing/sub").c_str(), 0755), ENOENT);

    // Many processes racing to create the same tree all succeed with exist_ok.
    std::vector<std::unique_ptr<Child>> children;
    for (int i = 0; i < 6; ++i) {
        children.push_back(std::make_unique<Child>([&cache] {
            std::error_code child_ec;
            fs::create_directories(cache.path("race/x/y/z"), child_ec);
            if (child_ec)
                std::fprintf(stderr, "create_directories: %s\n", child_ec.message().c_str());
            return child_ec ? 1 : 0;
        }));
    }
    for (auto& child : children) CHECK(child->join(30).exit_code == 0);
    CHECK(fs::is_directory(cache.path("race/x/y/z")));
}

TEST_CASE("O_CREAT|O_EXCL is atomic", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("locks").c_str(), 0755));
    const std::string lock = cache.p("locks/kernel.lock");
    {
        Fd fd(open(lock.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644));
        REQUIRE_SYS(fd.get());
    }
    REQUIRE_FAILS_WITH(open(lock.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644), EEXIST);
    // A dangling symlink counts as existing too.
    REQUIRE_SYS(symlink("nowhere", cache.p("locks/dangling").c_str()));
    REQUIRE_FAILS_WITH(open(cache.p("locks/dangling").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644),
                       EEXIST);

    // Eight processes race for one name, several rounds: exactly one wins each round.
    for (int round = 0; round < 5; ++round) {
        const std::string name = cache.p("locks/race" + std::to_string(round));
        std::vector<std::unique_ptr<Child>> children;
        for (int i = 0; i < 8; ++i) {
            children.push_back(std::make_unique<Child>([name] {
                const int fd = open(name.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
                if (fd >= 0) {
                    close(fd);
                    return 0;  // won
                }
                return errno == EEXIST ? 1 : 2;
            }));
        }
        int winners = 0, losers = 0;
        for (auto& child : children) {
            const ChildResult r = child->join(30);
            if (r.exit_code == 0) ++winners;
            if (r.exit_code == 1) ++losers;
        }
        INFO("round " << round);
        CHECK(winners == 1);
        CHECK(losers == 7);
    }
}

TEST_CASE("flock locks exclude between processes", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/kernel.lock");
    write_file_ok(path, "");
    Fd fd(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(fd.get());

    auto try_lock = [&](int op) {
        return run_child(
                   [&] {
                       const int cfd = open(path.c_str(), O_RDWR);
                       if (cfd < 0) return 3;
                       if (flock(cfd, op | LOCK_NB) == 0) return 0;
                       return errno == EWOULDBLOCK ? 1 : 2;
                   },
                   20)
            .exit_code;
    };

    REQUIRE_SYS(flock(fd.get(), LOCK_EX));
    CHECK(try_lock(LOCK_EX) == 1);
    CHECK(try_lock(LOCK_SH) == 1);
    REQUIRE_SYS(flock(fd.get(), LOCK_UN));
    CHECK(try_lock(LOCK_EX) == 0);
    REQUIRE_SYS(flock(fd.get(), LOCK_SH));
    CHECK(try_lock(LOCK_SH) == 0);
    CHECK(try_lock(LOCK_EX) == 1);
    REQUIRE_SYS(flock(fd.get(), LOCK_UN));
}

TEST_CASE("fcntl record locks exclude between processes", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/kernel.lock");
    write_file_ok(path, std::string(1000, 'x'));
    Fd fd(open(path.c_str(), O_RDWR));
    REQUIRE_SYS(fd.get());

    auto lock_range = [](int f, short type, off_t start, off_t len, int cmd) {
        struct flock fl {};
        fl.l_type = type;
        fl.l_whence = SEEK_SET;
        fl.l_start = start;
        fl.l_len = len;
        return fcntl(f, cmd, &fl);
    };
    auto child_lock = [&](short type, off_t start, off_t len) {
        return run_child(
                   [&] {
                       const int cfd = open(path.c_str(), O_RDWR);
                       if (cfd < 0) return 3;
                       if (lock_range(cfd, type, start, len, F_SETLK) == 0) return 0;
                       return (errno == EAGAIN || errno == EACCES) ? 1 : 2;
                   },
                   20)
            .exit_code;
    };

    REQUIRE_SYS(lock_range(fd.get(), F_WRLCK, 0, 100, F_SETLK));
    CHECK(child_lock(F_WRLCK, 0, 100) == 1);
    CHECK(child_lock(F_RDLCK, 50, 10) == 1);
    CHECK(child_lock(F_WRLCK, 200, 100) == 0);  // a disjoint range is free
    // F_GETLK in another process sees the lock.
    const ChildResult getlk = run_child([&] {
        const int cfd = open(path.c_str(), O_RDWR);
        if (cfd < 0) return 3;
        struct flock fl {};
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = 0;
        fl.l_len = 10;
        if (fcntl(cfd, F_GETLK, &fl) != 0) return 2;
        return fl.l_type == F_UNLCK ? 1 : 0;
    });
    CHECK(getlk.exit_code == 0);
    REQUIRE_SYS(lock_range(fd.get(), F_UNLCK, 0, 100, F_SETLK));
    CHECK(child_lock(F_WRLCK, 0, 100) == 0);
    // Read locks share.
    REQUIRE_SYS(lock_range(fd.get(), F_RDLCK, 0, 0, F_SETLK));
    CHECK(child_lock(F_RDLCK, 0, 0) == 0);
    CHECK(child_lock(F_WRLCK, 0, 0) == 1);
}

TEST_CASE("symlink and readlink work", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    // ccache's lock files are symlinks whose target carries the owner.
    const std::string target = "myhost:12345:1700000000.123456";
    REQUIRE_SYS(symlink(target.c_str(), cache.p("k/stats.lock").c_str()));
    char buf[4096];
    const ssize_t n = readlink(cache.p("k/stats.lock").c_str(), buf, sizeof buf);
    REQUIRE_SYS(n);
    CHECK(std::string(buf, static_cast<std::size_t>(n)) == target);
    struct stat st {};
    REQUIRE_SYS(lstat(cache.p("k/stats.lock").c_str(), &st));
    CHECK(S_ISLNK(st.st_mode));
    CHECK(st.st_size == static_cast<off_t>(target.size()));
    // Taking a taken lock fails.
    REQUIRE_FAILS_WITH(symlink("other", cache.p("k/stats.lock").c_str()), EEXIST);
    // Releasing it.
    REQUIRE_SYS(unlink(cache.p("k/stats.lock").c_str()));
    REQUIRE_FAILS_WITH(lstat(cache.p("k/stats.lock").c_str(), &st), ENOENT);

    // A link to a file is followed.
    write_file_ok(cache.p("k/kernel.cubin"), "cubin bytes");
    REQUIRE_SYS(symlink("kernel.cubin", cache.p("k/latest").c_str()));
    CHECK(file_content(cache.p("k/latest")) == "cubin bytes");
    REQUIRE_SYS(stat(cache.p("k/latest").c_str(), &st));
    CHECK(S_ISREG(st.st_mode));
    CHECK(st.st_size == 11);
    // A long target survives.
    const std::string long_target(2000, 't');
    REQUIRE_SYS(symlink(long_target.c_str(), cache.p("k/long").c_str()));
    const ssize_t n2 = readlink(cache.p("k/long").c_str(), buf, sizeof buf);
    REQUIRE(n2 == static_cast<ssize_t>(long_target.size()));
    CHECK(std::string(buf, static_cast<std::size_t>(n2)) == long_target);
    // readlink of a file is EINVAL.
    REQUIRE_FAILS_WITH(readlink(cache.p("k/kernel.cubin").c_str(), buf, sizeof buf), EINVAL);
}

TEST_CASE("truncate and ftruncate change a file's size and content", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/data.bin");
    const std::string original = random_bytes(10000, 3);
    write_file_ok(path, original);
    struct stat st {};

    REQUIRE_SYS(truncate(path.c_str(), 4000));
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK(st.st_size == 4000);
    CHECK(file_content(path) == original.substr(0, 4000));

    REQUIRE_SYS(truncate(path.c_str(), 9000));  // extends with zeros
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK(st.st_size == 9000);
    CHECK(file_content(path) == original.substr(0, 4000) + std::string(5000, '\0'));

    {
        Fd fd(open(path.c_str(), O_RDWR));
        REQUIRE_SYS(fd.get());
        REQUIRE_SYS(ftruncate(fd.get(), 100));
        REQUIRE_SYS(fstat(fd.get(), &st));
        CHECK(st.st_size == 100);
        REQUIRE_SYS(pwrite(fd.get(), "XYZ", 3, 50));
        REQUIRE_SYS(fd.close());
    }
    CHECK(file_content(path) == original.substr(0, 50) + "XYZ" + original.substr(53, 47));

    {
        Fd fd(open(path.c_str(), O_RDWR));
        REQUIRE_SYS(fd.get());
        REQUIRE_SYS(ftruncate(fd.get(), 0));
        REQUIRE_SYS(fd.close());
    }
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK(st.st_size == 0);
    CHECK(file_content(path).empty());

    // O_TRUNC on open empties it as well.
    write_file_ok(path, "abc");
    {
        Fd fd(open(path.c_str(), O_WRONLY | O_TRUNC));
        REQUIRE_SYS(fd.get());
    }
    CHECK(file_content(path).empty());
}

TEST_CASE("utimensat sets times that stat reads back", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/kernel.json");
    write_file_ok(path, "{}");

    struct timespec times[2];
    times[0] = {1600000000, 123456789};  // atime
    times[1] = {1500000000, 987654321};  // mtime
    REQUIRE_SYS(utimensat(AT_FDCWD, path.c_str(), times, 0));
    struct stat st {};
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK(st.st_atim.tv_sec == 1600000000);
    CHECK(st.st_atim.tv_nsec == 123456789);
    CHECK(st.st_mtim.tv_sec == 1500000000);
    CHECK(st.st_mtim.tv_nsec == 987654321);

    // UTIME_OMIT keeps one, futimens on an open file sets the other.
    {
        Fd fd(open(path.c_str(), O_RDONLY));
        REQUIRE_SYS(fd.get());
        struct timespec t2[2];
        t2[0] = {0, UTIME_OMIT};
        t2[1] = {1400000000, 5};
        REQUIRE_SYS(futimens(fd.get(), t2));
    }
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK(st.st_atim.tv_sec == 1600000000);
    CHECK(st.st_atim.tv_nsec == 123456789);
    CHECK(st.st_mtim.tv_sec == 1400000000);
    CHECK(st.st_mtim.tv_nsec == 5);

    // Directories too.
    REQUIRE_SYS(utimensat(AT_FDCWD, cache.p("k").c_str(), times, 0));
    REQUIRE_SYS(stat(cache.p("k").c_str(), &st));
    CHECK(st.st_mtim.tv_sec == 1500000000);
    CHECK(st.st_mtim.tv_nsec == 987654321);

    // Writing new content moves the mtime forward (tools compare mtimes).
    write_file_ok(path, "{\"new\": 1}");
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK(st.st_mtim.tv_sec > 1500000000);
}

TEST_CASE("chmod changes permission bits", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/launcher.so");
    write_file_ok(path, "elf");
    struct stat st {};
    REQUIRE_SYS(chmod(path.c_str(), 0755));
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK((st.st_mode & 07777) == 0755);
    CHECK(S_ISREG(st.st_mode));
    REQUIRE_SYS(chmod(path.c_str(), 0600));
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK((st.st_mode & 07777) == 0600);
    {
        Fd fd(open(path.c_str(), O_RDONLY));
        REQUIRE_SYS(fd.get());
        REQUIRE_SYS(fchmod(fd.get(), 0640));
    }
    REQUIRE_SYS(stat(path.c_str(), &st));
    CHECK((st.st_mode & 07777) == 0640);
    REQUIRE_SYS(chmod(cache.p("k").c_str(), 0700));
    REQUIRE_SYS(stat(cache.p("k").c_str(), &st));
    CHECK((st.st_mode & 07777) == 0700);
    CHECK(S_ISDIR(st.st_mode));
    // The mode given at creation is kept (umask aside).
    const mode_t old_mask = umask(022);
    {
        Fd fd(open(cache.p("k/created").c_str(), O_CREAT | O_WRONLY, 0751));
        REQUIRE_SYS(fd.get());
    }
    umask(old_mask);
    REQUIRE_SYS(stat(cache.p("k/created").c_str(), &st));
    CHECK((st.st_mode & 07777) == 0751);
    // Content is untouched by chmod.
    CHECK(file_content(path) == "elf");
}

TEST_CASE("fsync and fdatasync succeed", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/kernel.cubin");
    const std::string content = random_bytes(100000, 9);
    {
        Fd fd(open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644));
        REQUIRE_SYS(fd.get());
        REQUIRE(write_fd(fd.get(), content) == 0);
        REQUIRE_SYS(fsync(fd.get()));
        REQUIRE_SYS(fdatasync(fd.get()));
        REQUIRE_SYS(fd.close());
    }
    {
        Fd dir(open(cache.p("k").c_str(), O_RDONLY | O_DIRECTORY));
        REQUIRE_SYS(dir.get());
        REQUIRE_SYS(fsync(dir.get()));
    }
    {
        Fd fd(open(path.c_str(), O_RDONLY));
        REQUIRE_SYS(fd.get());
        REQUIRE_SYS(fsync(fd.get()));  // on a read-only descriptor too
    }
    CHECK(file_content(path) == content);
}

TEST_CASE("statfs reports sane values", "[fsd][contract]") {
    MountedCache cache;
    struct statfs st {};
    REQUIRE_SYS(statfs(cache.mnt().c_str(), &st));
    CHECK(static_cast<long>(st.f_type) == kFuseSuperMagic);
    CHECK(st.f_bsize > 0);
    CHECK(st.f_blocks > 0);
    CHECK(st.f_bfree <= st.f_blocks);
    CHECK(st.f_bavail <= st.f_blocks);
    CHECK(st.f_namelen == 255);
    struct statvfs vst {};
    REQUIRE_SYS(statvfs(cache.mnt().c_str(), &vst));
    CHECK(vst.f_frsize > 0);
    CHECK((vst.f_flag & ST_RDONLY) == 0);
    CHECK((vst.f_flag & ST_NOEXEC) == 0);  // launchers are dlopened from the cache
    // Inside the tree as well.
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    REQUIRE_SYS(statfs(cache.p("k").c_str(), &st));
    CHECK(static_cast<long>(st.f_type) == kFuseSuperMagic);
}

TEST_CASE("readdir lists every name once", "[fsd][contract]") {
    MountedCache cache;
    SECTION("a large directory, with stable offsets") {
        REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
        std::vector<std::string> expected;
        for (int i = 0; i < 300; ++i) {
            // Long names spread the listing over many readdir requests.
            const std::string name = "file_" + std::to_string(i) + std::string(40, 'n');
            expected.push_back(name);
            if (i % 3 == 0) {
                REQUIRE_SYS(mkdir(cache.p("k/" + name).c_str(), 0755));
            } else {
                write_file_ok(cache.p("k/" + name), "x");
            }
        }
        std::sort(expected.begin(), expected.end());
        std::vector<std::string> dups;
        CHECK(list_dir(cache.p("k"), &dups) == expected);
        CHECK(dups.empty());

        // d_type is right, "." and ".." are there.
        DIR* d = opendir(cache.p("k").c_str());
        REQUIRE(d != nullptr);
        int dots = 0;
        std::vector<std::string> first_pass;
        long mark = -1;
        while (dirent* e = readdir(d)) {
            const std::string name = e->d_name;
            if (name == "." || name == "..") {
                ++dots;
                continue;
            }
            if (e->d_type != DT_UNKNOWN) {
                const bool is_dir = std::stoi(name.substr(5)) % 3 == 0;
                CHECK(e->d_type == (is_dir ? DT_DIR : DT_REG));
            }
            first_pass.push_back(name);
            if (first_pass.size() == 100) mark = telldir(d);
        }
        CHECK(dots == 2);
        REQUIRE(mark != -1);
        // seekdir back to a remembered position continues with the same names.
        seekdir(d, mark);
        std::vector<std::string> second_pass;
        while (dirent* e = readdir(d)) second_pass.emplace_back(e->d_name);
        closedir(d);
        const std::vector<std::string> rest(first_pass.begin() + 100, first_pass.end());
        second_pass.erase(
            std::remove_if(second_pass.begin(), second_pass.end(),
                           [](const std::string& n) { return n == "." || n == ".."; }),
            second_pass.end());
        CHECK(second_pass == rest);
        CHECK(list_dir(cache.mnt().string()) == std::vector<std::string>{"k"});
    }

    SECTION("while another process creates names") {
        REQUIRE_SYS(mkdir(cache.p("c").c_str(), 0755));
        constexpr int kFiles = 400;
        Child creator([&] {
            for (int i = 0; i < kFiles; ++i) {
                const std::string name =
                    cache.p("c/new_" + std::to_string(i) + std::string(30, 'x'));
                if (write_all(name, "y") != 0) return 1;
            }
            return 0;
        });
        int listings = 0;
        std::vector<std::string> dups;
        bool creating = true;
        while (creating && dups.empty()) {
            creating = creator.running();  // one more listing after it ends
            list_dir(cache.p("c"), &dups);
            ++listings;
        }
        INFO("listings: " << listings << ", first duplicate: " << (dups.empty() ? "" : dups[0]));
        CHECK(dups.empty());
        REQUIRE(creator.join(60).exit_code == 0);
        std::vector<std::string> final_dups;
        CHECK(list_dir(cache.p("c"), &final_dups).size() == static_cast<std::size_t>(kFiles));
        CHECK(final_dups.empty());
    }
}

TEST_CASE("files can be read through mmap", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/kernel.hsaco");
    const std::string content = random_bytes(300 * 1024 + 123, 11);
    write_file_ok(path, content);
    Fd fd(open(path.c_str(), O_RDONLY));
    REQUIRE_SYS(fd.get());
    for (const int flags : {MAP_SHARED, MAP_PRIVATE}) {
        void* map = mmap(nullptr, content.size(), PROT_READ, flags, fd.get(), 0);
        INFO("mmap: " << std::strerror(errno));
        REQUIRE(map != MAP_FAILED);
        CHECK(std::string_view(static_cast<const char*>(map), content.size()) == content);
        munmap(map, content.size());
    }
}

TEST_CASE("a shared library is mapped PROT_EXEC and dlopened from the mount", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("launcher").c_str(), 0755));
    const std::string so = cache.p("launcher/__triton_launcher.so");
    const std::string bytes = read_file(KCACHE_FSD_TESTLIB_PATH);
    REQUIRE(bytes.size() > 0);
    write_file_ok(so, bytes);
    REQUIRE_SYS(chmod(so.c_str(), 0755));
    CHECK(file_content(so) == bytes);

    // In a child, so that no mapping outlives it and keeps the mount busy.
    const ChildResult r = run_child([&] {
        const int fd = open(so.c_str(), O_RDONLY);
        if (fd < 0) return 1;
        void* map = mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            std::fprintf(stderr, "mmap PROT_EXEC: %s\n", std::strerror(errno));
            return 2;
        }
        munmap(map, 4096);
        close(fd);
        void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) {
            std::fprintf(stderr, "dlopen: %s\n", dlerror());
            return 3;
        }
        using Fn = int (*)(int);
        void* sym = dlsym(handle, "kcache_testlib_answer");
        if (!sym) return 4;
        const Fn answer = reinterpret_cast<Fn>(sym);
        const int value = answer(20);
        dlclose(handle);
        return value == 41 ? 0 : 5;
    });
    CHECK(r.exit_code == 0);
}

TEST_CASE("an unlinked file stays readable through an open descriptor", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/kernel.cubin");
    const std::string content = random_bytes(200 * 1024, 5);
    write_file_ok(path, content);
    Fd fd(open(path.c_str(), O_RDONLY));
    REQUIRE_SYS(fd.get());
    char head[1000];
    REQUIRE(read(fd.get(), head, sizeof head) == static_cast<ssize_t>(sizeof head));

    REQUIRE_SYS(unlink(path.c_str()));
    struct stat st {};
    REQUIRE_FAILS_WITH(stat(path.c_str(), &st), ENOENT);
    // A new file under the same name does not disturb the open one.
    write_file_ok(path, "replacement");

    const auto rest = read_fd(fd.get());
    INFO("reading on after the unlink: " << std::strerror(errno));
    REQUIRE(rest.has_value());
    CHECK(std::string(head, sizeof head) + *rest == content);
    std::string again(content.size(), '\0');
    REQUIRE(pread(fd.get(), again.data(), again.size(), 0) == static_cast<ssize_t>(content.size()));
    CHECK(again == content);
    REQUIRE_SYS(fstat(fd.get(), &st));
    CHECK(st.st_size == static_cast<off_t>(content.size()));
    fd.reset();
    CHECK(file_content(path) == "replacement");
}

TEST_CASE("names are visible to other processes as soon as the call returns", "[fsd][contract]") {
    MountedCache cache;
    auto child_sees = [&](const std::string& rel) {
        return run_child([p = cache.p(rel)] {
                   return access(p.c_str(), F_OK) == 0 ? 0 : 1;
               }).exit_code == 0;
    };
    CHECK_FALSE(child_sees("k"));  // a negative lookup first: nothing stale may remain
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    CHECK(child_sees("k"));
    CHECK_FALSE(child_sees("k/a"));
    write_file_ok(cache.p("k/a"), "a");
    CHECK(child_sees("k/a"));
    REQUIRE_SYS(rename(cache.p("k/a").c_str(), cache.p("k/b").c_str()));
    CHECK_FALSE(child_sees("k/a"));
    CHECK(child_sees("k/b"));
    REQUIRE_SYS(unlink(cache.p("k/b").c_str()));
    CHECK_FALSE(child_sees("k/b"));
    // And the other way: what a child creates, the parent sees at once.
    REQUIRE(run_child([p = cache.p("k/from_child")] { return write_all(p, "c"); }).exit_code == 0);
    CHECK(file_content(cache.p("k/from_child")) == "c");
}

TEST_CASE("extended attributes work or report ENOTSUP", "[fsd][contract]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/f");
    write_file_ok(path, "x");
    char buf[256];
    errno = 0;
    const ssize_t g = getxattr(path.c_str(), "user.kcache.test", buf, sizeof buf);
    const int ge = errno;
    INFO("getxattr -> " << g << " (" << std::strerror(ge) << ")");
    CHECK(g == -1);
    CHECK((ge == ENODATA || ge == ENOTSUP));
    errno = 0;
    const int s = setxattr(path.c_str(), "user.kcache.test", "v1", 2, 0);
    const int se = errno;
    INFO("setxattr -> " << s << " (" << std::strerror(se) << ")");
    if (s == 0) {
        const ssize_t n = getxattr(path.c_str(), "user.kcache.test", buf, sizeof buf);
        REQUIRE(n == 2);
        CHECK(std::string(buf, 2) == "v1");
    } else {
        CHECK(se == ENOTSUP);
    }
    errno = 0;
    const ssize_t l = listxattr(path.c_str(), buf, sizeof buf);
    const int le = errno;
    CHECK((l >= 0 || le == ENOTSUP));
    CHECK(file_content(path) == "x");
}
