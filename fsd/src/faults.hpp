// Test-only fault points: KCACHE_FSD_FAULT in the daemon's environment names one.
//  - kill_after_commit=OP, kill_before_reply=OP: resend.hpp's kill points;
//  - slow_uploader: the shared tier's uploader thread starts kSlowStart late
//    (remote_tier.hpp), as a loaded machine may start it: what the mount stores
//    meanwhile is uploaded all the same.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string_view>

namespace kcache::fsd {

// The fault point KCACHE_FSD_FAULT names; empty when unset.
inline std::string_view fault_point() {
    const char* text = std::getenv("KCACHE_FSD_FAULT");
    return text ? std::string_view(text) : std::string_view();
}

inline constexpr auto kSlowStart = std::chrono::seconds(2);  // slow_uploader's delay

}  // namespace kcache::fsd
