// What the loader must report for tests/loader/kernels/*.cu, and helpers shared by
// the loader tests: reading the nvcc-built binaries (skipping when there are none)
// and comparing kernels.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "kcache/loader/introspect.hpp"
#include "skip.hpp"
#include "temp_dir.hpp"
#include "test_kernels.hpp"

namespace kcache::test {

struct ExpectedKernel {
    std::string name;
    std::vector<loader::ParamInfo> params;
    std::uint32_t param_bytes = 0;
};

inline std::vector<loader::ParamInfo> many_params_layout() {
    std::vector<loader::ParamInfo> params{{0, 0, 8}};  // float* out
    for (std::uint32_t i = 1; i <= 16; ++i) params.push_back({i, 8 + 4 * (i - 1), 4});
    params.push_back({17, 72, 1});  // char last
    return params;
}

// params.cu, in any order (cubins list kernels by symbol, PTX by definition).
inline std::vector<ExpectedKernel> params_cu_kernels() {
    return {
        {"axpy", {{0, 0, 4}, {1, 8, 8}, {2, 16, 8}, {3, 24, 4}}, 28},
        {"no_params", {}, 0},
        // Vec4 (16, align 16), Mixed (24, align 8), char, short, double*
        {"by_value", {{0, 0, 16}, {1, 16, 24}, {2, 40, 1}, {3, 42, 2}, {4, 48, 8}}, 56},
        {"many_params", many_params_layout(), 73},
        {"_Z10cpp_kernelix", {{0, 0, 4}, {1, 8, 8}}, 16},
    };
}

// big_params.cu: char, Big (8000 bytes, align 4), short, double*.
inline ExpectedKernel big_param_kernel() {
    return {"big_param", {{0, 0, 1}, {1, 4, 8000}, {2, 8004, 2}, {3, 8008, 8}}, 8016};
}

inline std::string describe(const std::vector<loader::ParamInfo>& params) {
    std::string s;
    for (const auto& p : params) {
        s += std::to_string(p.index) + "@" + std::to_string(p.offset) + ":" +
             std::to_string(p.size) + " ";
    }
    return s;
}

// Every expected kernel is present with exactly its parameters, and nothing else.
inline void require_kernels(const std::vector<loader::KernelInfo>& actual,
                            const std::vector<ExpectedKernel>& expected) {
    REQUIRE(actual.size() == expected.size());
    for (const auto& want : expected) {
        INFO("kernel " << want.name);
        const loader::KernelInfo* found = nullptr;
        for (const auto& k : actual) {
            if (k.name == want.name) found = &k;
        }
        REQUIRE(found != nullptr);
        INFO("got " << describe(found->params) << " want " << describe(want.params));
        CHECK(found->params == want.params);
        CHECK(found->param_bytes == want.param_bytes);
    }
}

// The bytes of a binary nvcc built for the tests; skips the test without nvcc.
inline std::string kernel_bytes(const std::string& name) {
    if (!kernels::kHaveNvcc) skip("nvcc was not found at configure time: no compiled kernels");
    const auto path = std::filesystem::path(std::string(kernels::kDir)) / name;
    if (!std::filesystem::exists(path)) skip(path.string() + " was not built with this nvcc");
    return read_file(path);
}

inline std::vector<std::string> cubin_archs() {
    std::vector<std::string> archs;
    std::string_view list = kernels::kCubinArchs;
    while (!list.empty()) {
        const auto semi = list.find(';');
        archs.emplace_back(list.substr(0, semi));
        list = semi == std::string_view::npos ? std::string_view{} : list.substr(semi + 1);
    }
    return archs;
}

template <class T>
T ok(core::Result<T> result) {
    INFO((result ? std::string() : result.error().message));
    REQUIRE(result.has_value());
    return std::move(*result);
}

}  // namespace kcache::test
