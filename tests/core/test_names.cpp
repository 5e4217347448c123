// The validators of names and paths (names.hpp).
#include <cerrno>
#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/names.hpp"

using namespace kcache;
using test::err;

TEST_CASE("names: a path component", "[core][names]") {
    CHECK(err(core::check_name("kernel.cubin")) == 0);
    CHECK(err(core::check_name("..x")) == 0);
    CHECK(err(core::check_name(std::string(core::kMaxNameLength, 'a'))) == 0);
    CHECK(err(core::check_name(std::string(core::kMaxNameLength + 1, 'a'))) == ENAMETOOLONG);
    for (const std::string& bad :
         std::vector<std::string>{"", ".", "..", "a/b", std::string("a\0b", 3)}) {
        INFO(bad);
        CHECK(err(core::check_name(bad)) == EINVAL);
    }
}

TEST_CASE("names: a relative path below the root", "[core][names]") {
    CHECK(err(core::check_path("a")) == 0);
    CHECK(err(core::check_path("triton/ABC/kernel.cubin")) == 0);
    for (const std::string& bad : std::vector<std::string>{
             "", "/a", "a/", "a//b", "./a", "a/.", "a/../b", "..", std::string("a/\0", 3)}) {
        INFO(bad);
        CHECK(err(core::check_path(bad)) == EINVAL);
    }
    // A long component is EINVAL here too, and the bound on the length is the caller's.
    CHECK(err(core::check_path("a/" + std::string(core::kMaxNameLength + 1, 'b'))) == EINVAL);
    const std::string long_path = std::string(200, 'a') + "/" + std::string(200, 'b');
    CHECK(err(core::check_path(long_path)) == 0);
    CHECK(err(core::check_path(long_path, 400)) == EINVAL);
    CHECK(err(core::check_path(long_path, long_path.size())) == 0);
    const auto message = core::check_path("a//b").error().message;
    CHECK_THAT(message, Catch::Contains("a//b"));
}

TEST_CASE("names: a symlink target stays inside the cache", "[core][names]") {
    CHECK(err(core::check_link_target("a/link", "target")) == 0);
    CHECK(err(core::check_link_target("a/link", "../b/target")) == 0);
    CHECK(err(core::check_link_target("a/b/link", "./../../c")) == 0);
    CHECK(err(core::check_link_target("a/link", "x/../../b")) == 0);
    CHECK(err(core::check_link_target("link", "../outside")) == EINVAL);
    CHECK(err(core::check_link_target("a/link", "../../outside")) == EINVAL);
    CHECK(err(core::check_link_target("a/link", "/etc/passwd")) == EINVAL);
    CHECK(err(core::check_link_target("a/link", "")) == EINVAL);
    CHECK_THAT(core::check_link_target("a/link", "../../x").error().message,
               Catch::Contains("leaves the cache"));
}
