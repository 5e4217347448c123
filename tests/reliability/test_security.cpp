// Who may use the mount, and what kcache does with what clients write (issue 6, point 6).
// Run as root: children drop to an unprivileged user (nobody) and try the mount.
//   - By default only the mounting user gets in (no allow_other): others get EACCES.
//   - With -o allow_other,default_permissions the kernel checks modes and owners, which
//     clients set (chmod/chown) and which survive a remount.
//   - Content that looks like a bundle, JSON, a shell script or an ELF program is only
//     stored and served back byte-exact: the daemon spawns nothing and runs nothing.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mount_fixture.hpp"
#include "processes.hpp"
#include "skip.hpp"

using namespace kcache::test;

namespace {

struct Ids {
    uid_t uid;
    gid_t gid;
};

// Root is needed to become another user; nobody (65534 without a passwd entry) is that user.
Ids require_root_and_nobody() {
    if (::geteuid() != 0) skip("needs root (to run checks as another user)");
    const passwd* pw = ::getpwnam("nobody");
    return pw ? Ids{pw->pw_uid, pw->pw_gid} : Ids{65534, 65534};
}

// Runs `fn` in a child as `ids` (no supplementary groups). The child's exit code is fn's
// result: 0 or an errno value; 120+ when it could not change user.
int as_user(const Ids& ids, const std::function<int()>& fn) {
    const ChildResult r = run_child([&] {
        if (::setgroups(0, nullptr) != 0) return 120;
        if (::setgid(ids.gid) != 0) return 121;
        if (::setuid(ids.uid) != 0) return 122;
        if (::geteuid() != ids.uid) return 123;
        return fn();
    });
    REQUIRE_FALSE(r.timed_out);
    return r.exit_code;
}

// 0 or errno of one call.
int result(int rc) {
    return rc < 0 ? errno : 0;
}

int stat_errno(const std::string& path) {
    struct stat st {};
    return result(::stat(path.c_str(), &st));
}

int open_errno(const std::string& path, int flags, mode_t mode = 0644) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd < 0) return errno;
    ::close(fd);
    return 0;
}

// Reads `path` as the calling user: 0 when it holds `expected`, 99 when it differs.
int read_equals(const std::string& path, const std::string& expected) {
    const auto bytes = read_all(path);
    if (!bytes) return errno;
    return *bytes == expected ? 0 : 99;
}

// Lets the unprivileged user reach the mount point (mkdtemp made its parent 0700) so
// that what refuses access is the mount, not the path to it.
void open_path_to_mount(const MountedCache& cache) {
    REQUIRE_SYS(::chmod(cache.root().c_str(), 0711));
}

struct stat stat_of(const std::string& path) {
    struct stat st {};
    REQUIRE_SYS(::stat(path.c_str(), &st));
    return st;
}

// Mount options of `mnt` as /proc/self/mountinfo lists them (per-mount and super block).
std::string mount_options(const fs::path& mnt) {
    std::ifstream in("/proc/self/mountinfo");
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string id, parent, dev, root, point, options;
        fields >> id >> parent >> dev >> root >> point >> options;
        if (point == mnt.string()) return line;
    }
    return {};
}

}  // namespace

TEST_CASE("security: by default the mount serves only its owner", "[reliability][security]") {
    const Ids nobody = require_root_and_nobody();
    MountedCache cache;
    open_path_to_mount(cache);
    REQUIRE(mkdir(cache.p("k").c_str(), 0777) == 0);
    REQUIRE(write_all(cache.p("k/public"), "public") == 0);
    REQUIRE_SYS(::chmod(cache.p("k/public").c_str(), 0666));
    INFO(mount_options(cache.mnt()));
    CHECK(mount_options(cache.mnt()).find("allow_other") == std::string::npos);

    // The path up to the mount is open to nobody; the mount itself is not, whatever the modes.
    CHECK(as_user(nobody, [&] { return stat_errno(cache.root().string()); }) == 0);
    CHECK(as_user(nobody, [&] { return stat_errno(cache.mnt().string()); }) == EACCES);
    CHECK(as_user(nobody, [&] { return stat_errno(cache.p("k/public")); }) == EACCES);
    CHECK(as_user(nobody, [&] { return open_errno(cache.p("k/public"), O_RDONLY); }) == EACCES);
    CHECK(as_user(nobody, [&] { return open_errno(cache.p("k/new"), O_WRONLY | O_CREAT); }) ==
          EACCES);
    CHECK(as_user(nobody, [&] { return result(::mkdir(cache.p("mine").c_str(), 0755)); }) ==
          EACCES);
    // The owner is served as usual; nothing was created by the refused calls.
    CHECK(read_all(cache.p("k/public")) == std::optional<std::string>("public"));
    CHECK_FALSE(fs::exists(cache.path("k/new")));
    CHECK_FALSE(fs::exists(cache.path("mine")));
}

TEST_CASE("security: with allow_other,default_permissions modes and owners set by clients apply",
          "[reliability][security]") {
    const Ids nobody = require_root_and_nobody();
    DaemonOptions options;
    options.args = {"-o", "allow_other,default_permissions"};
    MountedCache cache(options);
    open_path_to_mount(cache);
    const mode_t old_umask = ::umask(022);
    const std::string mounted_with = mount_options(cache.mnt());
    INFO(mounted_with);
    CHECK(mounted_with.find("allow_other") != std::string::npos);
    // Set-user-ID bits and device nodes on the mount have no effect.
    CHECK(mounted_with.find("nosuid") != std::string::npos);
    CHECK(mounted_with.find("nodev") != std::string::npos);

    REQUIRE(mkdir(cache.p("k").c_str(), 0755) == 0);
    REQUIRE(write_all(cache.p("k/secret"), "secret") == 0);
    REQUIRE_SYS(::chmod(cache.p("k/secret").c_str(), 0600));
    REQUIRE(write_all(cache.p("k/public"), "public") == 0);
    REQUIRE_SYS(::chmod(cache.p("k/public").c_str(), 0644));
    REQUIRE(write_all(cache.p("k/later"), "later") == 0);
    REQUIRE_SYS(::chmod(cache.p("k/later").c_str(), 0644));
    REQUIRE(mkdir(cache.p("k/theirs").c_str(), 0700) == 0);
    REQUIRE_SYS(::chown(cache.p("k/theirs").c_str(), nobody.uid, nobody.gid));  // given to nobody
    REQUIRE(write_all(cache.p("k/handed"), "handed") == 0);
    REQUIRE_SYS(::chmod(cache.p("k/handed").c_str(), 0600));
    REQUIRE_SYS(::chown(cache.p("k/handed").c_str(), nobody.uid, nobody.gid));
    REQUIRE_SYS(::chmod(cache.p("k/later").c_str(), 0640));  // a chmod after the fact

    auto check_permissions = [&](const char* when) {
        INFO(when);
        CHECK(as_user(nobody, [&] { return stat_errno(cache.p("k/secret")); }) == 0);
        CHECK(as_user(nobody, [&] { return open_errno(cache.p("k/secret"), O_RDONLY); }) == EACCES);
        CHECK(as_user(nobody, [&] { return read_equals(cache.p("k/public"), "public"); }) == 0);
        CHECK(as_user(nobody, [&] { return open_errno(cache.p("k/public"), O_WRONLY); }) == EACCES);
        CHECK(as_user(nobody, [&] { return open_errno(cache.p("k/later"), O_RDONLY); }) == EACCES);
        // Root's 0755 directory: no creating, removing or renaming in it.
        CHECK(as_user(nobody, [&] { return open_errno(cache.p("k/new"), O_WRONLY | O_CREAT); }) ==
              EACCES);
        CHECK(as_user(nobody, [&] { return result(::mkdir(cache.p("k/sub").c_str(), 0755)); }) ==
              EACCES);
        CHECK(as_user(nobody, [&] { return result(::unlink(cache.p("k/public").c_str())); }) ==
              EACCES);
        CHECK(as_user(nobody, [&] {
                  return result(::rename(cache.p("k/public").c_str(), cache.p("k/stolen").c_str()));
              }) == EACCES);
        // Nobody may not change root's file, nor give its own away.
        CHECK(as_user(nobody, [&] { return result(::chmod(cache.p("k/secret").c_str(), 0666)); }) ==
              EPERM);
        CHECK(as_user(nobody, [&] { return result(::chown(cache.p("k/handed").c_str(), 0, 0)); }) ==
              EPERM);
        // What was handed to nobody is its own: readable, writable, and its directory usable.
        CHECK(as_user(nobody, [&] { return read_equals(cache.p("k/handed"), "handed"); }) == 0);
        CHECK(as_user(nobody, [&] { return result(::chmod(cache.p("k/handed").c_str(), 0640)); }) ==
              0);
        CHECK(as_user(nobody, [&] { return result(::chmod(cache.p("k/handed").c_str(), 0600)); }) ==
              0);
        const std::string theirs_file =
            cache.p(std::string("k/theirs/") + (std::string(when) == "as set" ? "a" : "b"));
        CHECK(as_user(nobody, [&] { return write_all(theirs_file, "by nobody"); }) == 0);
        CHECK(stat_of(theirs_file).st_uid == nobody.uid);
        CHECK(stat_of(theirs_file).st_gid == nobody.gid);
        // Root's view is unchanged by all the refused calls.
        CHECK(read_all(cache.p("k/secret")) == std::optional<std::string>("secret"));
        CHECK_FALSE(fs::exists(cache.path("k/new")));
        CHECK_FALSE(fs::exists(cache.path("k/sub")));
        CHECK_FALSE(fs::exists(cache.path("k/stolen")));
        // Modes and owners as set.
        CHECK((stat_of(cache.p("k/secret")).st_mode & 07777) == 0600);
        CHECK((stat_of(cache.p("k/later")).st_mode & 07777) == 0640);
        CHECK(stat_of(cache.p("k/handed")).st_uid == nobody.uid);
        CHECK(stat_of(cache.p("k/theirs")).st_uid == nobody.uid);
        CHECK((stat_of(cache.p("k/theirs")).st_mode & 07777) == 0700);
    };
    check_permissions("as set");
    cache.remount();
    check_permissions("after a remount");
    ::umask(old_umask);
}

TEST_CASE("security: what clients write is served back, never executed or interpreted",
          "[reliability][security]") {
    MountedCache cache;
    const fs::path marker = cache.root() / "pwned";  // what any of the payloads would create
    const std::string m = marker.string();

    // A real bundle (exported from this cache) stored as a plain file.
    REQUIRE(mkdir(cache.p("src").c_str(), 0755) == 0);
    REQUIRE(write_all(cache.p("src/kernel.json"), "{\"name\": \"k\"}") == 0);
    const std::string bundle_path = (cache.root() / "export.kcb").string();
    const ProcResult exported = run_kcache(cache.db(), {"export", "-o", bundle_path});
    INFO(exported.describe());
    REQUIRE(exported.exit_code == 0);
    const auto bundle = read_all(bundle_path);
    REQUIRE(bundle.has_value());

    const auto elf = read_all("/bin/true");
    REQUIRE(elf.has_value());
    struct Payload {
        std::string name;
        std::string bytes;
        mode_t mode;
    };
    const std::vector<Payload> payloads{
        {"k/import-me.kcb", *bundle, 0644},
        {"k/kernel.json",
         "{\"name\": \"$(touch " + m + ")\", \"cmd\": \"`touch " + m +
             "`\", \"__reduce__\": [\"os.system\", \"touch " + m + "\"]}",
         0644},
        {"k/kernel_sig", "{\"signature\": \"*fp32\", \"launcher\": \"sh -c 'touch " + m + "'\"}",
         0644},
        {"k/run.sh", "#!/bin/sh\ntouch " + m + "\n", 0755},
        {"k/launcher.so", *elf, 0755},
        {"k/kernel.cubin", *elf, 0644},
        {"k/$(touch " + marker.filename().string() + ")", "name as a command", 0755},
    };
    REQUIRE(mkdir(cache.p("k").c_str(), 0755) == 0);
    for (const auto& p : payloads) {
        INFO(p.name);
        REQUIRE(write_all(cache.p(p.name), p.bytes) == 0);
        REQUIRE_SYS(::chmod(cache.p(p.name).c_str(), p.mode));
    }
    const pid_t daemon = cache.daemon_pid();
    REQUIRE(daemon > 0);

    auto check_served = [&](const char* when) {
        INFO(when);
        for (const auto& p : payloads) {
            INFO(p.name);
            CHECK(read_all(cache.p(p.name)) == std::optional<std::string>(p.bytes));
            CHECK((stat_of(cache.p(p.name)).st_mode & 07777) == p.mode);
        }
        // The keeper's one child is the serving daemon (fsd/src/survival/keeper.hpp), which runs
        // nothing.
        const std::vector<pid_t> daemons = children_of(cache.daemon_pid());
        CHECK(daemons.size() == 1);
        for (const pid_t d : daemons) CHECK(children_of(d).empty());
        CHECK_FALSE(fs::exists(marker));
    };
    check_served("as written");
    // The CLI reads the same db: listing, showing and verifying interpret no content either.
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"ls"}, {"show", "k"}, {"verify"}, {"stats"}}) {
        const ProcResult r = run_kcache(cache.db(), args);
        INFO("kcache " << args[0] << ": " << r.describe());
        CHECK(r.exit_code == 0);
    }
    CHECK_FALSE(fs::exists(marker));
    cache.remount();
    check_served("after a remount");
    // The stored bundle was never imported: its entry "src" exists once, as written.
    CHECK(read_all(cache.p("src/kernel.json")) == std::optional<std::string>("{\"name\": \"k\"}"));
}
