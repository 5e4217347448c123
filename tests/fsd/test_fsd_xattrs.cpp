// Extended attributes and fallocate through the mount (issue 33, items 1 and 2;
// fsd/src/handlers/xattrs.cpp, fsd/src/handlers/fallocate.cpp, kcache/core/xattrs.hpp): the
// kernel's rules and errors as on ext4, kept in the db across remounts and takeovers, gone with
// their inode; fallocate's modes read back through every handle and after publishing, and ENOSPC at
// the call that cannot be stored.

#include <fcntl.h>
#include <grp.h>
#include <linux/falloc.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "mount_fixture.hpp"
#include "processes.hpp"
#include "skip.hpp"

using namespace kcache::test;

namespace {

std::string get(const std::string& path, const std::string& name) {
    std::vector<char> buf(70000);
    errno = 0;
    const ssize_t n = ::lgetxattr(path.c_str(), name.c_str(), buf.data(), buf.size());
    INFO("lgetxattr(" << path << ", " << name << ") -> " << n << " " << std::strerror(errno));
    REQUIRE(n >= 0);
    return std::string(buf.data(), static_cast<std::size_t>(n));
}

// The names listxattr returns, in its order.
std::vector<std::string> list(const std::string& path) {
    std::vector<char> buf(70000);
    const ssize_t n = ::llistxattr(path.c_str(), buf.data(), buf.size());
    REQUIRE(n >= 0);
    std::vector<std::string> names;
    for (ssize_t at = 0; at < n;) {
        names.emplace_back(buf.data() + at);
        at += static_cast<ssize_t>(names.back().size()) + 1;
    }
    return names;
}

int set(const std::string& path, const std::string& name, const std::string& value, int flags = 0) {
    return ::lsetxattr(path.c_str(), name.c_str(), value.data(), value.size(), flags);
}

void require_clean_db(MountedCache& cache) {
    cache.unmount();
    const ProcResult r = run_kcache(cache.db(), {"verify"});
    INFO(r.describe());
    CHECK(r.exit_code == 0);
}

pid_t serving_daemon(pid_t keeper) {
    const auto children = children_of(keeper, /*include_zombies=*/false);
    return children.size() == 1 ? children.front() : -1;
}

std::string pread_all(int fd, std::size_t n, off_t off = 0) {
    std::string out(n, '?');
    const ssize_t got = ::pread(fd, out.data(), n, off);
    REQUIRE(got >= 0);
    out.resize(static_cast<std::size_t>(got));
    return out;
}

off_t size_of(int fd) {
    struct stat st {};
    REQUIRE_SYS(::fstat(fd, &st));
    return st.st_size;
}

}  // namespace

TEST_CASE("xattrs: user attributes are set, read, listed and removed with the kernel's errors",
          "[fsd][xattrs]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    const std::string f = cache.p("k/f");
    REQUIRE(write_all(f, "content") == 0);

    REQUIRE_FAILS_WITH(::getxattr(f.c_str(), "user.a", nullptr, 0), ENODATA);
    REQUIRE_SYS(set(f, "user.a", "value-a"));
    CHECK(get(f, "user.a") == "value-a");
    CHECK(::getxattr(f.c_str(), "user.a", nullptr, 0) == 7);  // size 0: the size
    char small[3];
    REQUIRE_FAILS_WITH(::getxattr(f.c_str(), "user.a", small, sizeof small), ERANGE);
    REQUIRE_SYS(set(f, "user.empty", ""));
    CHECK(get(f, "user.empty").empty());

    // XATTR_CREATE and XATTR_REPLACE.
    REQUIRE_FAILS_WITH(set(f, "user.a", "x", XATTR_CREATE), EEXIST);
    REQUIRE_FAILS_WITH(set(f, "user.b", "x", XATTR_REPLACE), ENODATA);
    REQUIRE_SYS(set(f, "user.a", "replaced", XATTR_REPLACE));
    REQUIRE_SYS(set(f, "user.b", "made", XATTR_CREATE));
    CHECK(get(f, "user.a") == "replaced");

    // Limits: a name of 255 bytes, a value of 64 KiB.
    const std::string longest = "user." + std::string(250, 'n');
    REQUIRE_SYS(set(f, longest, "l"));
    CHECK(get(f, longest) == "l");
    REQUIRE_FAILS_WITH(set(f, longest + "n", "l"), ERANGE);
    const std::string biggest(65536, 'v');
    REQUIRE_SYS(set(f, "user.big", biggest));
    CHECK(get(f, "user.big") == biggest);
    REQUIRE_FAILS_WITH(set(f, "user.big", biggest + "v"), E2BIG);
    CHECK(get(f, "user.big") == biggest);

    // The list: every name, NUL-terminated; size 0 asks the size; too small is ERANGE.
    std::vector<std::string> names = list(f);
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"user.a", "user.b", "user.big", "user.empty", longest});
    const ssize_t needed = ::listxattr(f.c_str(), nullptr, 0);
    CHECK(needed == static_cast<ssize_t>(6 + 1 + 6 + 1 + 8 + 1 + 10 + 1 + longest.size() + 1));
    REQUIRE_FAILS_WITH(::listxattr(f.c_str(), small, sizeof small), ERANGE);

    REQUIRE_SYS(::removexattr(f.c_str(), "user.a"));
    REQUIRE_FAILS_WITH(::removexattr(f.c_str(), "user.a"), ENODATA);
    REQUIRE_FAILS_WITH(::getxattr(f.c_str(), "user.a", nullptr, 0), ENODATA);

    // Directories take user attributes; symlinks and fifos do not (EPERM to set).
    REQUIRE_SYS(set(cache.p("k"), "user.dir", "d"));
    CHECK(get(cache.p("k"), "user.dir") == "d");
    REQUIRE_SYS(::symlink("f", cache.p("k/link").c_str()));
    REQUIRE_FAILS_WITH(set(cache.p("k/link"), "user.x", "1"), EPERM);
    REQUIRE_FAILS_WITH(::lgetxattr(cache.p("k/link").c_str(), "user.x", nullptr, 0), ENODATA);
    REQUIRE_SYS(::mkfifo(cache.p("k/fifo").c_str(), 0644));
    REQUIRE_FAILS_WITH(set(cache.p("k/fifo"), "user.x", "1"), EPERM);
    // Through the symlink (no l-): the file's.
    CHECK(::getxattr(cache.p("k/link").c_str(), "user.b", nullptr, 0) == 4);

    // POSIX ACLs and other namespaces are not kept.
    const char acl[] = {2, 0, 0, 0};  // an ACL header with no entries
    REQUIRE_FAILS_WITH(::setxattr(f.c_str(), "system.posix_acl_access", acl, sizeof acl, 0),
                       EOPNOTSUPP);
    CHECK(read_all(f) == std::optional<std::string>("content"));
}

TEST_CASE("xattrs: trusted and security attributes for root, a file's own rules for others",
          "[fsd][xattrs]") {
    if (::geteuid() != 0) skip("needs root (trusted.* and a check as another user)");
    const passwd* pw = ::getpwnam("nobody");
    const uid_t uid = pw ? pw->pw_uid : 65534;
    const gid_t gid = pw ? pw->pw_gid : 65534;
    MountedCache cache(DaemonOptions{.args = {"-o", "allow_other"}});
    REQUIRE_SYS(::chmod(cache.root().c_str(), 0711));
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    const std::string mine = cache.p("k/root-file");  // root's, 0644
    const std::string open_to_all = cache.p("k/shared-file");
    REQUIRE(write_all(mine, "r") == 0);
    REQUIRE(write_all(open_to_all, "s") == 0);
    REQUIRE_SYS(::chmod(open_to_all.c_str(), 0666));
    REQUIRE_SYS(set(mine, "trusted.t", "root only"));
    REQUIRE_SYS(set(mine, "security.kcache", "label"));
    REQUIRE_SYS(set(mine, "user.u", "everyone reads"));
    CHECK(get(mine, "trusted.t") == "root only");
    CHECK(get(mine, "security.kcache") == "label");
    std::vector<std::string> names = list(mine);
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"security.kcache", "trusted.t", "user.u"});

    auto as_nobody = [&](const std::function<int()>& fn) {
        const ChildResult r = run_child([&] {
            if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0)
                return 120;
            return fn();
        });
        REQUIRE_FALSE(r.timed_out);
        return r.exit_code;
    };
    auto err = [](auto result) { return result < 0 ? errno : 0; };
    // trusted.*: neither written, read nor listed by others.
    CHECK(as_nobody([&] { return err(set(open_to_all, "trusted.x", "1")); }) == EPERM);
    CHECK(as_nobody([&] { return err(::getxattr(mine.c_str(), "trusted.t", nullptr, 0)); }) ==
          ENODATA);
    CHECK(as_nobody([&] {
              char buf[4096];
              const ssize_t n = ::listxattr(mine.c_str(), buf, sizeof buf);
              if (n < 0) return 100;
              const std::string all(buf, static_cast<std::size_t>(n));
              if (all.find("trusted.") != std::string::npos) return 101;
              return all.find("user.u") != std::string::npos ? 0 : 102;
          }) == 0);
    // user.*: read by whoever may read the file, written by its owner or with write permission.
    CHECK(as_nobody([&] { return err(::getxattr(mine.c_str(), "user.u", nullptr, 0)); }) == 0);
    CHECK(as_nobody([&] { return err(set(mine, "user.n", "1")); }) == EACCES);
    CHECK(as_nobody([&] { return err(::removexattr(mine.c_str(), "user.u")); }) == EACCES);
    CHECK(as_nobody([&] { return err(set(open_to_all, "user.n", "1")); }) == 0);
    CHECK(get(open_to_all, "user.n") == "1");
    CHECK(get(mine, "user.u") == "everyone reads");
}

TEST_CASE("xattrs: kept across a remount, a kill -9 of the serving daemon and an upgrade",
          "[fsd][xattrs][takeover]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    const std::string f = cache.p("k/f");
    REQUIRE(write_all(f, "content") == 0);
    REQUIRE_SYS(set(f, "user.one", "1"));
    REQUIRE_SYS(set(cache.p("k"), "user.dir", "d"));
    cache.remount();
    CHECK(get(f, "user.one") == "1");
    CHECK(get(cache.p("k"), "user.dir") == "d");

    // A takeover: the keeper's next daemon serves the same db.
    const pid_t keeper = cache.daemon_pid();
    REQUIRE(keeper > 0);
    const pid_t old = serving_daemon(keeper);
    REQUIRE(old > 0);
    REQUIRE_SYS(set(f, "user.two", "2"));
    REQUIRE(::kill(old, SIGKILL) == 0);
    REQUIRE(wait_until(
        [&] {
            const pid_t now = serving_daemon(keeper);
            return now > 0 && now != old;
        },
        10));
    if (io_uring_run()) {
        // Over io_uring a call the kernel was handing to the dead daemon's ring threads
        // ends ECANCELED (docs/operations.md, "A kill -9 over io_uring costs some calls"),
        // one made just after the kill included: the checks start once the successor
        // answers. Over /dev/fuse the first call is answered (a kill is a pause only).
        char buf[16];
        CHECK(wait_until(
            [&] {
                return ::lgetxattr(f.c_str(), "user.one", buf, sizeof buf) >= 0 ||
                       errno != ECANCELED;
            },
            10));
    }
    CHECK(get(f, "user.one") == "1");
    CHECK(get(f, "user.two") == "2");
    REQUIRE_SYS(set(f, "user.three", "3"));

    const ProcResult r = run_process({KCACHE_FSD_PATH, "--upgrade", cache.mnt().string()});
    INFO(r.describe());
    REQUIRE(r.exit_code == 0);
    CHECK(get(f, "user.three") == "3");
    std::vector<std::string> names = list(f);
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"user.one", "user.three", "user.two"});
    require_clean_db(cache);
}

TEST_CASE("xattrs: they belong to the inode and go with it (unlink, rename over, rmdir, evict)",
          "[fsd][xattrs]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    const std::string a = cache.p("k/a");
    REQUIRE(write_all(a, "a") == 0);
    REQUIRE_SYS(set(a, "user.x", "shared"));
    // A hard link is the same inode: the same attributes.
    REQUIRE_SYS(::link(a.c_str(), cache.p("k/a2").c_str()));
    CHECK(get(cache.p("k/a2"), "user.x") == "shared");
    REQUIRE_SYS(set(cache.p("k/a2"), "user.y", "via link"));
    CHECK(get(a, "user.y") == "via link");
    REQUIRE_SYS(::unlink(a.c_str()));
    CHECK(get(cache.p("k/a2"), "user.x") == "shared");
    REQUIRE_SYS(::unlink(cache.p("k/a2").c_str()));  // the last name: the inode goes

    // A file unlinked while open: its attributes went with its last name; a change is
    // accepted and dropped, as its writes are (docs/operations.md).
    {
        const std::string gone = cache.p("k/gone");
        REQUIRE(write_all(gone, "g") == 0);
        REQUIRE_SYS(set(gone, "user.g", "1"));
        Fd fd(::open(gone.c_str(), O_RDWR));
        REQUIRE_SYS(fd.get());
        REQUIRE_SYS(::unlink(gone.c_str()));
        REQUIRE_FAILS_WITH(::fgetxattr(fd.get(), "user.g", nullptr, 0), ENODATA);
        CHECK(::flistxattr(fd.get(), nullptr, 0) == 0);
        REQUIRE_SYS(::fsetxattr(fd.get(), "user.h", "2", 1, 0));
    }

    // A file made again under the name has none.
    REQUIRE(write_all(a, "again") == 0);
    REQUIRE_FAILS_WITH(::getxattr(a.c_str(), "user.x", nullptr, 0), ENODATA);

    // Renamed over: the replaced file's attributes go; the renamed one's move with it.
    const std::string b = cache.p("k/b");
    REQUIRE(write_all(b, "b") == 0);
    REQUIRE_SYS(set(a, "user.old", "replaced"));
    REQUIRE_SYS(set(b, "user.new", "moved"));
    REQUIRE_SYS(::rename(b.c_str(), a.c_str()));
    CHECK(get(a, "user.new") == "moved");
    REQUIRE_FAILS_WITH(::getxattr(a.c_str(), "user.old", nullptr, 0), ENODATA);

    // rmdir.
    REQUIRE_SYS(::mkdir(cache.p("k/d").c_str(), 0755));
    REQUIRE_SYS(set(cache.p("k/d"), "user.d", "dir"));
    REQUIRE_SYS(::rmdir(cache.p("k/d").c_str()));
    REQUIRE_SYS(::mkdir(cache.p("k/d").c_str(), 0755));
    REQUIRE_FAILS_WITH(::getxattr(cache.p("k/d").c_str(), "user.d", nullptr, 0), ENODATA);

    // An evicted entry takes its files' attributes with it.
    REQUIRE_SYS(::mkdir(cache.p("e").c_str(), 0755));
    REQUIRE(write_all(cache.p("e/kernel.bin"), "bin") == 0);
    REQUIRE_SYS(set(cache.p("e/kernel.bin"), "user.e", "evicted"));
    REQUIRE_SYS(set(cache.p("e"), "user.e", "evicted dir"));
    const ProcResult evicted = run_kcache_settled(cache.db(), {"evict", "e"});
    INFO(evicted.describe());
    REQUIRE(evicted.exit_code == 0);
    // kcache verify names attributes of inodes that are gone.
    require_clean_db(cache);
}

TEST_CASE("xattrs: a write removes security.capability, as on ext4", "[fsd][xattrs]") {
    if (::geteuid() != 0) skip("needs root (CAP_SETFCAP)");
    MountedCache cache;
    const std::string f = cache.p("tool");
    REQUIRE(write_all(f, "binary") == 0);
    // A VFS_CAP_REVISION_2 capability: cap_net_bind_service permitted.
    const std::uint32_t cap[5] = {0x02000000, 1u << 10, 0, 0, 0};
    REQUIRE_SYS(::setxattr(f.c_str(), "security.capability", cap, sizeof cap, 0));
    CHECK(::getxattr(f.c_str(), "security.capability", nullptr, 0) == sizeof cap);
    Fd fd(::open(f.c_str(), O_WRONLY));
    REQUIRE_SYS(fd.get());
    REQUIRE(::pwrite(fd.get(), "B", 1, 0) == 1);
    REQUIRE_SYS(fd.close());
    REQUIRE_FAILS_WITH(::getxattr(f.c_str(), "security.capability", nullptr, 0), ENODATA);
    CHECK(read_all(f) == std::optional<std::string>("Binary"));
}

TEST_CASE("xattrs: --no-xattrs answers none (EOPNOTSUPP)", "[fsd][xattrs]") {
    MountedCache cache(DaemonOptions{.args = {"--no-xattrs"}});
    const std::string f = cache.p("f");
    REQUIRE(write_all(f, "x") == 0);
    REQUIRE_FAILS_WITH(set(f, "user.a", "1"), EOPNOTSUPP);
    REQUIRE_FAILS_WITH(::getxattr(f.c_str(), "user.a", nullptr, 0), EOPNOTSUPP);
    REQUIRE_FAILS_WITH(::listxattr(f.c_str(), nullptr, 0), EOPNOTSUPP);
    REQUIRE(write_all(f, "still writes") == 0);
    CHECK(read_all(f) == std::optional<std::string>("still writes"));
}

TEST_CASE("fallocate: reserve, extend, punch and zero read back through every handle",
          "[fsd][fallocate]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    const std::string f = cache.p("k/data.bin");
    const std::string original = random_bytes(20000, 33);
    REQUIRE(write_all(f, original) == 0);
    Fd a(::open(f.c_str(), O_RDWR));
    REQUIRE_SYS(a.get());
    Fd b(::open(f.c_str(), O_RDWR));  // another handle of the same (shared) version
    REQUIRE_SYS(b.get());
    std::string expected = original;

    // KEEP_SIZE: a reservation past the end changes nothing visible.
    REQUIRE_SYS(::fallocate(a.get(), FALLOC_FL_KEEP_SIZE, 10000, 100000));
    CHECK(size_of(b.get()) == 20000);
    CHECK(pread_all(b.get(), 30000) == expected);

    // Mode 0 inside the file: nothing changes; past the end: zeros up to offset + length.
    REQUIRE_SYS(::fallocate(a.get(), 0, 0, 1000));
    CHECK(pread_all(b.get(), 30000) == expected);
    REQUIRE_SYS(::fallocate(a.get(), 0, 15000, 10000));
    expected.resize(25000, '\0');
    CHECK(size_of(b.get()) == 25000);
    CHECK(pread_all(b.get(), 30000) == expected);

    // PUNCH_HOLE|KEEP_SIZE: zeros, the size kept, also for a hole past the end.
    REQUIRE_SYS(::fallocate(a.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 5000));
    std::fill(expected.begin() + 100, expected.begin() + 5100, '\0');
    REQUIRE_SYS(::fallocate(a.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 24000, 9000));
    std::fill(expected.begin() + 24000, expected.end(), '\0');
    CHECK(size_of(b.get()) == 25000);
    CHECK(pread_all(b.get(), 30000) == expected);
    CHECK(pread_all(a.get(), 30000) == expected);

    // ZERO_RANGE: zeros; without KEEP_SIZE it extends the file.
    REQUIRE(::pwrite(a.get(), "ZZZZ", 4, 24990) == 4);
    std::memcpy(expected.data() + 24990, "ZZZZ", 4);
    REQUIRE_SYS(::fallocate(a.get(), FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 6000, 50000));
    std::fill(expected.begin() + 6000, expected.end(), '\0');
    CHECK(size_of(b.get()) == 25000);
    REQUIRE(::pwrite(a.get(), "tail", 4, 24000) == 4);
    std::memcpy(expected.data() + 24000, "tail", 4);
    REQUIRE_SYS(::fallocate(a.get(), FALLOC_FL_ZERO_RANGE, 24002, 6000));
    expected.resize(30002, '\0');
    std::fill(expected.begin() + 24002, expected.end(), '\0');
    CHECK(size_of(b.get()) == 30002);
    CHECK(pread_all(b.get(), 40000) == expected);

    // What the kernel and the daemon refuse.
    REQUIRE_FAILS_WITH(::fallocate(a.get(), FALLOC_FL_PUNCH_HOLE, 0, 10), EOPNOTSUPP);
    REQUIRE_FAILS_WITH(::fallocate(a.get(), FALLOC_FL_COLLAPSE_RANGE, 0, 4096), EOPNOTSUPP);
    REQUIRE_FAILS_WITH(::fallocate(a.get(), FALLOC_FL_INSERT_RANGE, 0, 4096), EOPNOTSUPP);
    REQUIRE_FAILS_WITH(::fallocate(a.get(), 0, 0, 0), EINVAL);
    Fd ro(::open(f.c_str(), O_RDONLY));
    REQUIRE_SYS(ro.get());
    REQUIRE_FAILS_WITH(::fallocate(ro.get(), 0, 0, 10), EBADF);
    ro.reset();

    REQUIRE_SYS(b.close());
    REQUIRE_SYS(a.close());
    CHECK(read_all(f) == std::optional<std::string>(expected));
    cache.remount();
    CHECK(read_all(f) == std::optional<std::string>(expected));
}

TEST_CASE("fallocate: the zeros of a hole are not stored byte for byte", "[fsd][fallocate]") {
    MountedCache cache;
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    const std::string f = cache.p("k/sparse.bin");
    const auto before = stat_value(cache_stats(cache.db()), "stored_bytes");
    Fd fd(::open(f.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644));
    REQUIRE_SYS(fd.get());
    const std::string head = random_bytes(4096, 7);
    REQUIRE(::pwrite(fd.get(), head.data(), head.size(), 0) == 4096);
    REQUIRE_SYS(::fallocate(fd.get(), 0, 0, 8 << 20));  // 8 MiB, all zeros after the head
    REQUIRE_SYS(fd.close());
    const auto got = read_all(f);
    REQUIRE(got.has_value());
    REQUIRE(got->size() == std::size_t{8} << 20);
    CHECK(got->substr(0, 4096) == head);
    CHECK(got->find_first_not_of('\0', 4096) == std::string::npos);
    const auto after = stat_value(cache_stats(cache.db()), "stored_bytes");
    INFO("stored bytes " << before << " -> " << after);
    CHECK(after - before < 64 * 1024);  // the head's segment and one shared zero segment
}

TEST_CASE("fallocate: ENOSPC at the call when the file cannot be stored, EFBIG past the limit",
          "[fsd][fallocate]") {
    MountedCache cache(DaemonOptions{.args = {"--max-size", "1M", "--max-file-size", "4M"}});
    REQUIRE_SYS(::mkdir(cache.p("k").c_str(), 0755));
    const std::string f = cache.p("k/big.bin");
    Fd fd(::open(f.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644));
    REQUIRE_SYS(fd.get());
    REQUIRE(::pwrite(fd.get(), "x", 1, 0) == 1);
    REQUIRE_FAILS_WITH(::fallocate(fd.get(), 0, 0, 2 << 20), ENOSPC);
    REQUIRE_FAILS_WITH(::fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, 0, 2 << 20), ENOSPC);
    CHECK(size_of(fd.get()) == 1);  // nothing changed
    REQUIRE_FAILS_WITH(::fallocate(fd.get(), 0, 0, 5 << 20), EFBIG);
    // What fits is reserved; zeroing needs no room.
    REQUIRE_SYS(::fallocate(fd.get(), 0, 0, 512 << 10));
    CHECK(size_of(fd.get()) == 512 << 10);
    REQUIRE_SYS(::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 2 << 20));
    REQUIRE_SYS(fd.close());
    const auto got = read_all(f);
    REQUIRE(got.has_value());
    CHECK(got->size() == std::size_t{512} << 10);
    CHECK(got->find_first_not_of('\0') == std::string::npos);
}
