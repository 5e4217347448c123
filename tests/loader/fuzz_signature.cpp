// libFuzzer target for the signature parser (kcache's schema and Triton's metadata),
// run by tests/support/run_fuzz.sh with clang++-14 -fsanitize=fuzzer,address,undefined.
// Any input must give a signature or an error; a signature must be self-consistent, or the
// target aborts.

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kcache/loader/signature.hpp"

namespace {

void check(bool condition) {
    if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view json(reinterpret_cast<const char*>(data), size);
    const auto signature = kcache::loader::parse_signature(json);
    if (!signature) {
        check(!signature.error().message.empty());
        return 0;
    }
    check(!signature->kernel.empty());
    std::uint64_t threads = 1;
    for (auto d : signature->block) {
        check(d >= 1);
        threads *= d;
    }
    check(threads <= 1024);
    for (auto d : signature->cluster) check(d >= 1);
    if (signature->params) {
        std::uint64_t bytes = 0;
        for (const auto& p : *signature->params) {
            check(p.size >= 1);
            const auto known = kcache::loader::signature_type_size(p.type);
            check(known ? *known == p.size : p.type == "bytes");
            bytes += p.size;
        }
        check(bytes <= 32764);
    }
    return 0;
}
