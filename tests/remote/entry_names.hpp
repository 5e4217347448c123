// The entry names the shared-tier tests push and pull (24 hex digits), spelled once for
// every test file that uses them.
#pragma once

#include <string>

namespace kcache::test {

inline const std::string kEntryA = "ABCDEF0123456789ABCDEF01";
inline const std::string kEntryB = "BCDEF0123456789ABCDEF012";

}  // namespace kcache::test
