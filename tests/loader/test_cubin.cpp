// Cubin introspection: nvcc-built cubins for several archs, and synthetic cubins for
// every record and arch encoding the parser knows.

#include <cerrno>

#include "builders.hpp"
#include "expected.hpp"

namespace kcache::test {
namespace {

using loader::Format;

std::string note(std::uint32_t type, const std::string& desc) {
    std::string n;
    put(n, 12, 4);
    put(n, desc.size(), 4);
    put(n, type, 4);
    n += std::string("NVIDIA Corp") + '\0';
    n += desc;
    while (n.size() % 4) n.push_back('\0');
    return n;
}

// .note.nv.tkinfo with `options` as the ptxas command line.
SectionSpec tkinfo(const std::string& options) {
    std::string strings = std::string("\0ptxas\0", 7);
    const std::size_t options_at = strings.size();
    strings += options + '\0';
    std::string desc;
    put(desc, 2, 4);
    put(desc, 0, 4);
    put(desc, 1, 4);
    put(desc, 0, 4);
    put(desc, 0, 4);
    put(desc, options_at, 4);
    return {".note.nv.tkinfo", 7, note(2000, desc + strings)};
}

std::string axpy_info() {
    return eiattr_bytes(0x37, std::string("\x82\0\0\0", 4)) + kparam_info(3, 24, 4) +
           kparam_info(2, 16, 8) + kparam_info(1, 8, 8) + kparam_info(0, 0, 4) +
           eiattr_value(3, 0x1b, 0xff) + eiattr_value(3, 0x19, 28);
}

loader::BinaryInfo inspect_ok(const std::string& bytes) {
    return ok(loader::inspect(bytes));
}

core::Error inspect_error(const std::string& bytes) {
    auto info = loader::inspect(bytes);
    REQUIRE_FALSE(info.has_value());
    return info.error();
}

}  // namespace

TEST_CASE("nvcc cubins: kernels, parameters and arch for every arch", "[loader][cubin]") {
    const auto archs = cubin_archs();
    for (const auto& arch : archs) {
        INFO("arch sm_" << arch);
        const auto info = inspect_ok(kernel_bytes("params_sm_" + arch + ".cubin"));
        CHECK(info.format == Format::cubin);
        CHECK(info.arch == "sm_" + arch);
        CHECK(info.entries.empty());
        require_kernels(info.kernels, params_cu_kernels());
    }
    if (archs.empty()) skip("nvcc built no cubins");
}

TEST_CASE("nvcc cubin with more than 4 KiB of parameters (KPARAM_INFO_V2)", "[loader][cubin]") {
    const std::string arch(kernels::kBigArch);
    const auto info = inspect_ok(kernel_bytes("big_params_sm_" + arch + ".cubin"));
    CHECK(info.arch == "sm_" + arch);
    require_kernels(info.kernels, {big_param_kernel()});
}

TEST_CASE("launch arguments are checked against a cubin's kernel", "[loader][cubin]") {
    const auto info = inspect_ok(build_cubin({{"axpy", axpy_info()}}));
    const loader::KernelInfo* axpy = info.find_kernel("axpy");
    REQUIRE(axpy != nullptr);
    CHECK(info.find_kernel("nope") == nullptr);

    CHECK(loader::check_arguments(*axpy, {4, 8, 8, 4}).has_value());
    auto too_few = loader::check_arguments(*axpy, {4, 8, 8});
    REQUIRE_FALSE(too_few.has_value());
    CHECK(too_few.error().code == EINVAL);
    CHECK(too_few.error().message == "axpy: 3 arguments given, the kernel takes 4");
    auto wrong = loader::check_arguments(*axpy, {4, 4, 8, 4});
    REQUIRE_FALSE(wrong.has_value());
    CHECK(wrong.error().code == EINVAL);
    CHECK(wrong.error().message == "axpy: argument 1 is 4 bytes, the kernel expects 8");
}

TEST_CASE("synthetic cubin: classic parameter records, any order", "[loader][cubin]") {
    const auto info = inspect_ok(build_cubin({{"axpy", axpy_info()}}));
    CHECK(info.format == Format::cubin);
    CHECK(info.arch == "sm_90");
    require_kernels(info.kernels, {{"axpy", {{0, 0, 4}, {1, 8, 8}, {2, 16, 8}, {3, 24, 4}}, 28}});
}

TEST_CASE("synthetic cubin: V2 parameter records and pointer flags", "[loader][cubin]") {
    const std::string info =
        kparam_info_v2(2, 8008, 8, 5) + kparam_info_v2(1, 8, 8000) + kparam_info_v2(0, 0, 4);
    // sm_100 as CUDA 13 writes it: SM in bits 8..15, 0x02 in the low byte.
    const auto bin = inspect_ok(build_cubin({{"big", info}}, 0x6006402));
    CHECK(bin.arch == "sm_100");
    require_kernels(bin.kernels, {{"big", {{0, 0, 4}, {1, 8, 8000}, {2, 8008, 8}}, 8016}});
}

TEST_CASE("synthetic cubin: device functions are not kernels", "[loader][cubin]") {
    const auto info = inspect_ok(build_cubin(
        {{"kernel", kparam_info(0, 0, 8)}, {"helper", eiattr_value(3, 0x5f, 0x101), false}}));
    REQUIRE(info.kernels.size() == 1);
    CHECK(info.kernels[0].name == "kernel");
}

TEST_CASE("synthetic cubin: a kernel without .nv.info has no parameters", "[loader][cubin]") {
    ElfSpec spec;
    spec.sections.push_back({".text.k", 1, std::string(16, '\0')});
    spec.symbols.push_back({"k", 0x12, 0x10, 1});
    const auto info = inspect_ok(build_elf(spec));
    REQUIRE(info.kernels.size() == 1);
    CHECK(info.kernels[0].params.empty());
    CHECK(info.kernels[0].param_bytes == 0);
}

TEST_CASE("cubin arch encodings", "[loader][cubin]") {
    const std::vector<KernelSpec> kernels{{"k", kparam_info(0, 0, 8)}};
    SECTION("CUDA 13 e_flags (ABI version 8): SM in bits 8..15") {
        CHECK(inspect_ok(build_cubin(kernels, 0x6004b04)).arch == "sm_75");
        CHECK(inspect_ok(build_cubin(kernels, 0x6005004)).arch == "sm_80");
        CHECK(inspect_ok(build_cubin(kernels, 0xe005a04)).arch == "sm_90");  // -G
        CHECK(inspect_ok(build_cubin(kernels, 0x6007802)).arch == "sm_120");
    }
    SECTION("older e_flags (ABI version 7): SM in bits 0..7") {
        CHECK(inspect_ok(build_cubin(kernels, 0x00500550, {}, 7)).arch == "sm_80");
        CHECK(inspect_ok(build_cubin(kernels, 0x005a055a, {}, 7)).arch == "sm_90");
    }
    SECTION(".note.nv.cuinfo when e_flags has no SM") {
        std::string desc;
        put(desc, 2, 2);
        put(desc, 89, 2);
        put(desc, 0x82, 4);
        const SectionSpec cuinfo{".note.nv.cuinfo", 7, note(1000, desc)};
        CHECK(inspect_ok(build_cubin(kernels, 0x6000004, {cuinfo})).arch == "sm_89");
        const auto error = inspect_error(build_cubin(kernels, 0x6000004));
        CHECK(error.code == EIO);
        CHECK_THAT(error.message, Catch::Contains("no SM architecture"));
    }
    SECTION("sm_XXa: .nv.compat record 9 = 1") {
        const SectionSpec compat{".nv.compat", 0x70000086,
                                 eiattr_value(2, 9, 1) + eiattr_value(2, 2, 1)};
        CHECK(inspect_ok(build_cubin(kernels, 0x6005a04, {compat})).arch == "sm_90a");
        const SectionSpec plain{".nv.compat", 0x70000086, eiattr_value(2, 9, 0)};
        CHECK(inspect_ok(build_cubin(kernels, 0x6005a04, {plain})).arch == "sm_90");
    }
    SECTION("sm_XXf: the ptxas command line in .note.nv.tkinfo") {
        CHECK(inspect_ok(build_cubin(kernels, 0x6006402, {tkinfo("-arch sm_100f -m 64 ")})).arch ==
              "sm_100f");
        CHECK(
            inspect_ok(build_cubin(kernels, 0x6006402, {tkinfo("--gpu-name=sm_100a -O3")})).arch ==
            "sm_100a");
        // A command line naming another SM does not change the arch.
        CHECK(inspect_ok(build_cubin(kernels, 0x6006402, {tkinfo("-arch sm_90a")})).arch ==
              "sm_100");
        CHECK(inspect_ok(build_cubin(kernels, 0x6006402, {tkinfo("")})).arch == "sm_100");
    }
}

TEST_CASE("synthetic cubin: inconsistent parameter records are errors", "[loader][cubin]") {
    SECTION("a missing index") {
        const auto e =
            inspect_error(build_cubin({{"k", kparam_info(0, 0, 8) + kparam_info(2, 16, 8)}}));
        CHECK(e.code == EIO);
        CHECK(e.message == "cubin: .nv.info.k: parameter 1 is missing");
    }
    SECTION("an index described twice") {
        const auto e =
            inspect_error(build_cubin({{"k", kparam_info(0, 0, 8) + kparam_info(0, 0, 8)}}));
        CHECK(e.code == EIO);
        CHECK_THAT(e.message, Catch::Contains("parameter 1 is described twice"));
    }
    SECTION("a parameter past the 64 KiB parameter space") {
        const auto e = inspect_error(build_cubin({{"k", kparam_info_v2(0, 0xfff0, 0x100)}}));
        CHECK(e.code == EIO);
        CHECK_THAT(e.message, Catch::Contains("ends past the parameter space"));
    }
    SECTION("a short parameter record") {
        const auto e = inspect_error(build_cubin({{"k", eiattr_bytes(0x17, "abcd")}}));
        CHECK_THAT(e.message, Catch::Contains("parameter record at 0 is 4 bytes (expected 12)"));
    }
    SECTION("a record running past its section") {
        std::string info = kparam_info(0, 0, 8);
        info[2] = 40;  // declares 40 bytes, 12 follow
        const auto e = inspect_error(build_cubin({{"k", info}}));
        CHECK_THAT(e.message, Catch::Contains("runs past the end"));
    }
    SECTION("an unknown record format") {
        const auto e = inspect_error(build_cubin({{"k", eiattr_value(9, 0x17, 0)}}));
        CHECK_THAT(e.message, Catch::Contains("unknown format 9"));
    }
    SECTION("stray bytes after the last record") {
        const auto e = inspect_error(build_cubin({{"k", kparam_info(0, 0, 8) + "xy"}}));
        CHECK_THAT(e.message, Catch::Contains("2 stray bytes"));
    }
}

TEST_CASE("ELF files that are not cubins", "[loader][cubin]") {
    SECTION("a host ELF without device code") {
        ElfSpec spec;
        spec.machine = 62;  // x86-64
        spec.sections.push_back({".text", 1, "code"});
        const auto e = inspect_error(build_elf(spec));
        CHECK(e.code == ENOEXEC);
        CHECK(e.message ==
              "not a cubin, fatbin or PTX file (an ELF file without CUDA device code (no "
              ".nv_fatbin section))");
    }
    SECTION("a 32-bit ELF") {
        std::string bytes = build_cubin({{"k", kparam_info(0, 0, 8)}});
        bytes[4] = 1;
        const auto e = inspect_error(bytes);
        CHECK(e.code == ENOEXEC);
        CHECK_THAT(e.message, Catch::Contains("not a 64-bit ELF file"));
    }
}

}  // namespace kcache::test
