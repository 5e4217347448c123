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

enum class Fault { none, kill_after_commit, kill_before_reply, slow_uploader, unknown };

// Every fault point, by its spelling: a whole name, or a prefix its argument follows
// (a kill point's resend::Op, by resend::name_of's spelling).
struct FaultSpelling {
    Fault fault;
    std::string_view spelling;
    bool takes_argument;  // `spelling` is a prefix
};
inline constexpr FaultSpelling kFaultPoints[] = {
    {Fault::kill_after_commit, "kill_after_commit=", true},
    {Fault::kill_before_reply, "kill_before_reply=", true},
    {Fault::slow_uploader, "slow_uploader", false},
};

// KCACHE_FSD_FAULT read against kFaultPoints: none when unset, unknown when it names
// no fault point; `argument` is what follows a prefix.
struct NamedFault {
    Fault fault = Fault::none;
    std::string_view argument;
};
inline NamedFault named_fault() {
    const std::string_view text = fault_point();
    if (text.empty()) return {};
    for (const FaultSpelling& point : kFaultPoints) {
        if (point.takes_argument && text.substr(0, point.spelling.size()) == point.spelling)
            return {point.fault, text.substr(point.spelling.size())};
        if (!point.takes_argument && text == point.spelling) return {point.fault, {}};
    }
    return {Fault::unknown, {}};
}

inline constexpr auto kSlowStart = std::chrono::seconds(2);  // slow_uploader's delay

}  // namespace kcache::fsd
