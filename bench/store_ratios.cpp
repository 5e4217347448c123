#include "store_ratios.hpp"

#include <cstdint>
#include <cstdio>
#include <string_view>

#include <fmt/format.h>

namespace kcache::bench {
namespace {

std::string us(double seconds) {
    return fmt::format("{:.2f} us", seconds * 1e6);
}

}  // namespace

std::string size_label(std::size_t size) {
    return fmt::format("{}KiB", size / 1024);
}

void print_ratios(const RatioReporter& r) {
    std::printf("\nRatios (measured in this run; time per operation, wall clock)\n");
    auto pair = [&](const std::string& label, const std::string& a, const std::string& b,
                    const char* meaning) {
        const auto* fa = r.find(a);
        const auto* fb = r.find(b);
        if (!fa || !fb || fb->seconds <= 0) return;
        std::printf("  %-34s kcache %12s  baseline %12s  kcache/baseline = %6.2fx  (%s)\n",
                    label.c_str(), us(fa->seconds).c_str(), us(fb->seconds).c_str(),
                    fa->seconds / fb->seconds, meaning);
    };
    for (std::size_t size : {1024, 8192, 16384}) {
        for (const char* d : {"none", "full"}) {
            const std::string suffix = fmt::format("{}/{}", size_label(size), d);
            pair("put/" + suffix, "put/kcache/" + suffix, "put/plain/" + suffix,
                 std::string_view(d) == "full" ? "plain: write+fsync" : "plain: write, no fsync");
        }
    }
    for (const char* kind : {"", "-random"}) {
        for (std::size_t size : {1024, 8192, 16384}) {
            const std::string label = size_label(size) + kind;
            pair("get/" + label + " (txn per read)", "get/kcache-txn-per-read/" + label,
                 "get/plain/" + label, "plain: open+fstat+read+close");
            pair("get/" + label + " (one snapshot)", "get/kcache-one-snapshot/" + label,
                 "get/plain/" + label, "plain: open+fstat+read+close");
        }
    }
    // What the digest check (kcache/core/integrity.hpp) costs a hit: the same reads with
    // the check on (the default) against off.
    for (const char* kind : {"", "-random"}) {
        for (std::size_t size : {1024, 8192, 16384}) {
            const std::string label = size_label(size) + kind;
            pair("get/" + label + " (digest check)", "get/kcache-txn-per-read/" + label,
                 "get/kcache-unchecked/" + label, "baseline: the same read, no digest check");
        }
    }
    {
        const auto* k = r.find("evict/kcache/none");
        const auto* p = r.find("evict/plain/none");
        if (k && p && k->items_per_second > 0) {
            std::printf(
                "  %-34s kcache %9.0f entries/s  plain %9.0f entries/s  "
                "time per entry kcache/plain = %6.2fx\n",
                "evict/none", k->items_per_second, p->items_per_second,
                p->items_per_second / k->items_per_second);
        }
        const auto* kf = r.find("evict/kcache/full");
        if (kf)
            std::printf("  %-34s kcache %9.0f entries/s  (no plain baseline)\n", "evict/full",
                        kf->items_per_second);
    }
    for (const char* kind : {"stats", "read+stats"}) {
        const auto* base = r.find(fmt::format("{}/1000", kind));
        if (!base) continue;
        for (std::uint64_t n : {10000, 100000}) {
            const auto* f = r.find(fmt::format("{}/{}", kind, n));
            if (!f) continue;
            std::printf("  %-34s %s at %llu entries vs %s at 1000: %.2fx  (should stay ~1)\n",
                        fmt::format("{} growth {}k/1k", kind, n / 1000).c_str(),
                        us(f->seconds).c_str(), static_cast<unsigned long long>(n),
                        us(base->seconds).c_str(), f->seconds / base->seconds);
        }
    }
}

}  // namespace kcache::bench
