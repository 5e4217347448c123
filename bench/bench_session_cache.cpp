// The loader's session cache on a hit, against a bare std::unordered_map<std::string>
// lookup of the same key in the same run (issue 4's target: a hit within 2x).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kcache/loader/session_cache.hpp"

namespace {

using kcache::loader::KernelKey;
using kcache::loader::SessionCache;

constexpr int kKernels = 1000;

// Keys as a compiler's cache has them: a 64-hex-digit entry hash and a kernel name.
std::vector<KernelKey> make_keys() {
    std::vector<KernelKey> keys;
    for (int i = 0; i < kKernels; ++i) {
        char hash[65];
        for (int j = 0; j < 64; ++j) hash[j] = "0123456789abcdef"[(i * 31 + j * 7) % 16];
        hash[64] = 0;
        keys.push_back({hash, "matmul_kernel_BLOCK_M_128_BLOCK_N_" + std::to_string(i), 0});
    }
    return keys;
}

std::string flat(const KernelKey& k) {
    return k.entry + "/" + k.kernel + ":" + std::to_string(k.device);
}

void BM_BareMapHit(benchmark::State& state) {
    const auto keys = make_keys();
    std::unordered_map<std::string, std::shared_ptr<const int>> map;
    std::vector<std::string> flat_keys;
    for (int i = 0; i < kKernels; ++i) {
        flat_keys.push_back(flat(keys[static_cast<std::size_t>(i)]));
        map.emplace(flat_keys.back(), std::make_shared<const int>(i));
    }
    std::size_t i = 0;
    for (auto _ : state) {
        auto it = map.find(flat_keys[i++ % kKernels]);
        benchmark::DoNotOptimize(it->second.get());
    }
}

void BM_SessionCacheHit(benchmark::State& state) {
    const auto keys = make_keys();
    SessionCache<int> cache(kKernels);
    for (int i = 0; i < kKernels; ++i)
        cache.insert(keys[static_cast<std::size_t>(i)], std::make_shared<const int>(i));
    std::size_t i = 0;
    for (auto _ : state) {
        auto hit = cache.find(keys[i++ % kKernels]);
        benchmark::DoNotOptimize(hit.get());
    }
}

BENCHMARK(BM_BareMapHit);
BENCHMARK(BM_SessionCacheHit);
BENCHMARK(BM_SessionCacheHit)->Threads(2);

// Prints the ratio of the two single-thread means after the run.
class RatioReporter : public benchmark::ConsoleReporter {
  public:
    void ReportRuns(const std::vector<Run>& runs) override {
        for (const Run& r : runs) {
            if (r.threads != 1) continue;
            if (r.benchmark_name() == "BM_BareMapHit") m_bare = r.GetAdjustedRealTime();
            if (r.benchmark_name() == "BM_SessionCacheHit") m_cache = r.GetAdjustedRealTime();
        }
        ConsoleReporter::ReportRuns(runs);
    }
    void Finalize() override {
        ConsoleReporter::Finalize();
        if (m_bare > 0 && m_cache > 0) {
            std::printf(
                "session-cache hit / bare unordered_map<std::string> lookup: %.2fx (%.1f ns vs "
                "%.1f ns; target <= 2x)\n",
                m_cache / m_bare, m_cache, m_bare);
        }
    }

  private:
    double m_bare = 0, m_cache = 0;
};

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    return 0;
}
