// Skipping a test whose requirement (root, FUSE, a GPU, a display) is absent.
// CTest runs each Catch2 test case in its own process and treats exit code 77 as
// "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kcache::test {

[[noreturn]] inline void skip(const std::string& why) {
    std::fprintf(stderr, "SKIPPED: %s\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(77);
}

}  // namespace kcache::test
