// libFuzzer target for the loader's parsers (run by tests/support/run_fuzz.sh with clang++-14
// -fsanitize=fuzzer,address,undefined). Any input must give a result or an error;
// results must be self-consistent, or the target aborts.

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kcache/loader/introspect.hpp"

namespace {

void check(bool condition) {
    if (!condition) std::abort();
}

void check_kernels(const std::vector<kcache::loader::KernelInfo>& kernels) {
    for (const auto& k : kernels) {
        std::vector<std::size_t> sizes;
        for (std::size_t i = 0; i < k.params.size(); ++i) {
            check(k.params[i].index == i);
            sizes.push_back(k.params[i].size);
        }
        check(kcache::loader::check_arguments(k, sizes).has_value());
        sizes.push_back(0);
        check(!kcache::loader::check_arguments(k, sizes).has_value());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    kcache::loader::InspectOptions options;
    options.max_decompressed_size = 1u << 20;  // keep each run fast
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    const auto info = kcache::loader::inspect(bytes, options);
    if (!info) {
        check(!info.error().message.empty());
        return 0;
    }
    check_kernels(info->kernels);
    for (const auto& entry : info->entries) {
        if (entry.kernels) check_kernels(*entry.kernels);
    }
    return 0;
}
