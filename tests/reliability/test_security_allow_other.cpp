// Issue 6, point 6: "with allow_other, default_permissions applies". A mount given
// -o allow_other alone must still check modes and owners: otherwise every local user
// can read, overwrite and delete every file in the cache, whatever its mode.
// Run as root; a child drops to nobody.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>

#include "mount_fixture.hpp"
#include "skip.hpp"

using namespace kcache::test;

TEST_CASE("security: -o allow_other alone still applies default_permissions",
          "[reliability][security]") {
    if (::geteuid() != 0) skip("needs root (to run checks as another user)");
    const passwd* pw = ::getpwnam("nobody");
    const uid_t uid = pw ? pw->pw_uid : 65534;
    const gid_t gid = pw ? pw->pw_gid : 65534;
    DaemonOptions options;
    options.args = {"-o", "allow_other"};
    MountedCache cache(options);
    REQUIRE_SYS(::chmod(cache.root().c_str(), 0711));  // the path to the mount is open
    REQUIRE(mkdir(cache.p("k").c_str(), 0755) == 0);
    REQUIRE(write_all(cache.p("k/secret"), "secret") == 0);
    REQUIRE_SYS(::chmod(cache.p("k/secret").c_str(), 0600));

    auto as_nobody = [&](const std::function<int()>& fn) {
        const ChildResult r = run_child([&] {
            if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0)
                return 120;
            return fn();
        });
        REQUIRE_FALSE(r.timed_out);
        return r.exit_code;
    };
    CHECK(as_nobody([&] {
              const int fd = ::open(cache.p("k/secret").c_str(), O_RDONLY | O_CLOEXEC);
              return fd < 0 ? errno : 0;
          }) == EACCES);
    CHECK(as_nobody([&] { return ::unlink(cache.p("k/secret").c_str()) < 0 ? errno : 0; }) ==
          EACCES);
    CHECK(as_nobody([&] { return ::chmod(cache.p("k/secret").c_str(), 0666) < 0 ? errno : 0; }) ==
          EPERM);
    CHECK(read_all(cache.p("k/secret")) == std::optional<std::string>("secret"));
}
