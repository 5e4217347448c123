// Fatbin introspection: nvcc-built fatbins (plain, compressed, embedded in objects and
// an executable) and synthetic containers for each entry kind, flag and compression.

#include <lz4.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "builders.hpp"
#include "expected.hpp"

namespace kcache::test {
namespace {

using loader::Compression;
using loader::EntryKind;
using loader::Format;

const char* const kPtx = R"(
.version 9.0
.target sm_90
.address_size 64
.visible .entry k(
	.param .u64 k_param_0,
	.param .u32 k_param_1
)
{
	ret;
}
)";

std::string zstd(std::string_view text) {
    std::string out(ZSTD_compressBound(text.size()), '\0');
    const std::size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
    REQUIRE_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
}

// A raw LZ4 block as liblz4's compressor makes it (what nvcc -compress-mode=speed
// writes): many matches, overlapping and not, unlike builders.hpp's lz4_block.
std::string lz4(std::string_view text) {
    const int bound = LZ4_compressBound(static_cast<int>(text.size()));
    std::string out(static_cast<std::size_t>(bound), '\0');
    const int n = LZ4_compress_default(text.data(), out.data(), static_cast<int>(text.size()),
                                       static_cast<int>(out.size()));
    REQUIRE(n > 0);
    out.resize(static_cast<std::size_t>(n));
    return out;
}

const ExpectedKernel kPtxKernel{"k", {{0, 0, 8}, {1, 8, 4}}, 12};

std::string tiny_cubin() {
    return build_cubin({{"c", kparam_info(0, 0, 8)}});
}

loader::BinaryInfo inspect_ok(const std::string& bytes,
                              const loader::InspectOptions& options = {}) {
    return ok(loader::inspect(bytes, options));
}

core::Error inspect_error(const std::string& bytes) {
    auto info = loader::inspect(bytes);
    REQUIRE_FALSE(info.has_value());
    return info.error();
}

}  // namespace

TEST_CASE("nvcc fatbin: two cubins and compressed PTX", "[loader][fatbin]") {
    const auto info = inspect_ok(kernel_bytes("params.fatbin"));
    const std::string first = "sm_" + std::string(kernels::kFirstArch);
    const std::string last = "sm_" + std::string(kernels::kLastArch);
    CHECK(info.format == Format::fatbin);
    CHECK(info.arch.empty());
    CHECK(info.kernels.empty());
    CHECK(info.host_section.empty());
    REQUIRE(info.entries.size() == 3);

    std::set<std::pair<std::string, std::string>> seen;  // (kind, arch)
    for (const auto& e : info.entries) {
        INFO("entry " << loader::kind_name(e.kind) << " " << e.arch);
        seen.emplace(loader::kind_name(e.kind), e.arch);
        CHECK(e.container == 0);
        CHECK(e.size > 0);
        if (e.kind == EntryKind::cubin) CHECK_FALSE(e.compressed);
        if (e.kind == EntryKind::ptx) CHECK(e.ptx_version.find('.') != std::string::npos);
        if (e.compressed) CHECK(e.uncompressed_size > e.size);
        REQUIRE(e.kernels.has_value());
        require_kernels(*e.kernels, params_cu_kernels());
    }
    CHECK(seen == std::set<std::pair<std::string, std::string>>{
                      {"cubin", first}, {"cubin", last}, {"ptx", last}});
}

TEST_CASE("nvcc fatbin: compressed cubin and PTX", "[loader][fatbin]") {
    const auto info = inspect_ok(kernel_bytes("params_compressed.fatbin"));
    REQUIRE(info.entries.size() == 2);
    for (const auto& e : info.entries) {
        INFO("entry " << loader::kind_name(e.kind));
        CHECK(e.compressed);
        CHECK((e.compression == Compression::zstd || e.compression == Compression::lz4));
        CHECK(e.uncompressed_size > e.size);
        REQUIRE(e.kernels.has_value());
        require_kernels(*e.kernels, params_cu_kernels());
    }

    SECTION("without decompression, or beyond the size limit, kernels are not listed") {
        loader::InspectOptions no_decompress;
        no_decompress.decompress = false;
        for (const auto& e :
             inspect_ok(kernel_bytes("params_compressed.fatbin"), no_decompress).entries) {
            CHECK_FALSE(e.kernels.has_value());
        }
        loader::InspectOptions small;
        small.max_decompressed_size = 1024;
        for (const auto& e : inspect_ok(kernel_bytes("params_compressed.fatbin"), small).entries) {
            CHECK_FALSE(e.kernels.has_value());
        }
    }
}

TEST_CASE("nvcc fatbin: LZ4-compressed entries", "[loader][fatbin]") {
    if (!kernels::kHaveLz4Fatbin) skip("this fatbinary has no -compress-mode=speed");
    const auto info = inspect_ok(kernel_bytes("params_lz4.fatbin"));
    REQUIRE(info.entries.size() == 2);
    for (const auto& e : info.entries) {
        CHECK(e.compression == Compression::lz4);
        REQUIRE(e.kernels.has_value());
        require_kernels(*e.kernels, params_cu_kernels());
    }
}

TEST_CASE("nvcc host object: the fatbin in .nv_fatbin", "[loader][fatbin]") {
    const auto info = inspect_ok(kernel_bytes("params.o"));
    CHECK(info.format == Format::fatbin);
    CHECK(info.host_section == ".nv_fatbin");
    REQUIRE(info.entries.size() == 3);
    for (const auto& e : info.entries) {
        REQUIRE(e.kernels.has_value());
        require_kernels(*e.kernels, params_cu_kernels());
    }
}

TEST_CASE("nvcc relocatable object: the fatbin in __nv_relfatbin", "[loader][fatbin]") {
    const auto info = inspect_ok(kernel_bytes("params_rdc.o"));
    CHECK(info.host_section == "__nv_relfatbin");
    REQUIRE_FALSE(info.entries.empty());
    for (const auto& e : info.entries) {
        CHECK(e.arch == "sm_" + std::string(kernels::kFirstArch));
        REQUIRE(e.kernels.has_value());
        require_kernels(*e.kernels, params_cu_kernels());
    }
}

TEST_CASE("nvcc executable: one container per translation unit", "[loader][fatbin]") {
    const auto info = inspect_ok(kernel_bytes("app"));
    CHECK(info.host_section == ".nv_fatbin");
    std::set<std::uint32_t> containers;
    std::set<std::uint32_t> with_main;
    std::set<std::uint32_t> with_axpy;
    for (const auto& e : info.entries) {
        containers.insert(e.container);
        if (!e.kernels) continue;
        for (const auto& k : *e.kernels) {
            if (k.name == "main_kernel") {
                with_main.insert(e.container);
                CHECK(k.params == std::vector<loader::ParamInfo>{{0, 0, 8}, {1, 8, 4}});
            }
            if (k.name == "axpy") with_axpy.insert(e.container);
        }
    }
    CHECK(containers.size() >= 2);
    REQUIRE(with_main.size() == 1);
    REQUIRE(with_axpy.size() == 1);
    CHECK(*with_main.begin() != *with_axpy.begin());
}

TEST_CASE("synthetic fatbin: entry kinds, archs, flags and compressions", "[loader][fatbin]") {
    std::vector<EntrySpec> entries;
    entries.push_back({2, 90, 0x11, tiny_cubin()});
    entries.push_back({1, 90, 0x100011, kPtx, 0, 9, 0});                         // sm_90a PTX
    entries.push_back({1, 100, 0x208011, zstd(kPtx), std::strlen(kPtx), 9, 0});  // sm_100f
    entries.push_back({1, 80, 0x2013, lz4_block(std::string(kPtx) + std::string(300, ' ')),
                       std::strlen(kPtx) + 300, 8, 7});  // debug, LZ4
    entries.push_back({8, 90, 0x18011, zstd("lto-ir"), 6});
    entries.push_back({77, 90, 0x11, "whatever"});
    const auto info = inspect_ok(build_container(entries));
    REQUIRE(info.entries.size() == 6);
    const auto& e = info.entries;

    CHECK(e[0].kind == EntryKind::cubin);
    CHECK(e[0].arch == "sm_90");
    CHECK_FALSE(e[0].compressed);
    CHECK(e[0].compression == Compression::none);
    CHECK(e[0].uncompressed_size == e[0].size);
    REQUIRE(e[0].kernels);
    require_kernels(*e[0].kernels, {{"c", {{0, 0, 8}}, 8}});

    CHECK(e[1].kind == EntryKind::ptx);
    CHECK(e[1].arch == "sm_90a");
    CHECK(e[1].ptx_version == "9.0");
    REQUIRE(e[1].kernels);
    require_kernels(*e[1].kernels, {kPtxKernel});

    CHECK(e[2].arch == "sm_100f");
    CHECK(e[2].compressed);
    CHECK(e[2].compression == Compression::zstd);
    CHECK(e[2].uncompressed_size == std::strlen(kPtx));
    REQUIRE(e[2].kernels);
    require_kernels(*e[2].kernels, {kPtxKernel});

    CHECK(e[3].compression == Compression::lz4);
    CHECK(e[3].debug);
    CHECK(e[3].ptx_version == "8.7");
    REQUIRE(e[3].kernels);
    require_kernels(*e[3].kernels, {kPtxKernel});

    CHECK(e[4].kind == EntryKind::ltoir);
    CHECK(e[4].compressed);
    CHECK_FALSE(e[4].kernels);

    CHECK(e[5].kind == EntryKind::unknown);
    CHECK(e[5].raw_kind == 77);
    CHECK_FALSE(e[5].kernels);
}

TEST_CASE("synthetic fatbin: an LZ4 block from liblz4's compressor", "[loader][fatbin]") {
    // 64 kernels of one body: the block is mostly matches, so it decodes to the right
    // text only if every match is copied right.
    std::string ptx = ".version 9.0\n.target sm_90\n.address_size 64\n";
    std::vector<ExpectedKernel> expected;
    for (int i = 0; i < 64; ++i) {
        const std::string name = "k" + std::to_string(i);
        ptx += ".visible .entry " + name + "(\n\t.param .u64 " + name +
               "_param_0,\n\t.param .u32 " + name + "_param_1\n)\n{\n\tret;\n}\n";
        expected.push_back({name, {{0, 0, 8}, {1, 8, 4}}, 12});
    }
    const std::string block = lz4(ptx);
    REQUIRE(block.size() < ptx.size() / 4);

    const auto info = inspect_ok(build_container({{1, 90, 0x2011, block, ptx.size(), 9, 0}}));
    REQUIRE(info.entries.size() == 1);
    CHECK(info.entries[0].compression == Compression::lz4);
    CHECK(info.entries[0].uncompressed_size == ptx.size());
    REQUIRE(info.entries[0].kernels);
    require_kernels(*info.entries[0].kernels, expected);

    SECTION("declaring a byte less than it decodes to") {
        const auto e =
            inspect_error(build_container({{1, 90, 0x2011, block, ptx.size() - 1, 9, 0}}));
        CHECK(e.code == EIO);
        CHECK_THAT(e.message, Catch::Contains("LZ4 payload damaged"));
    }
    SECTION("cut short by a byte") {
        const auto e = inspect_error(build_container(
            {{1, 90, 0x2011, block.substr(0, block.size() - 1), ptx.size(), 9, 0}}));
        CHECK(e.code == EIO);
        CHECK_THAT(e.message, Catch::Contains("LZ4 payload"));
    }
}

TEST_CASE("synthetic fatbins: several containers, plain and in a host ELF", "[loader][fatbin]") {
    const std::string one = build_container({{2, 75, 0x11, tiny_cubin()}});
    const std::string two = build_container({{1, 90, 0x11, kPtx, 0, 9, 0}});
    const std::string both = one + std::string(16, '\0') + two + std::string(8, '\0');

    const auto plain = inspect_ok(both);
    REQUIRE(plain.entries.size() == 2);
    CHECK(plain.entries[0].container == 0);
    CHECK(plain.entries[1].container == 1);

    ElfSpec host;
    host.machine = 62;
    host.sections.push_back({".text", 1, "code"});
    host.sections.push_back({".nv_fatbin", 1, both});
    const auto embedded = inspect_ok(build_elf(host));
    CHECK(embedded.format == Format::fatbin);
    CHECK(embedded.host_section == ".nv_fatbin");
    REQUIRE(embedded.entries.size() == 2);
    CHECK(embedded.entries[1].arch == "sm_90");
    CHECK(embedded.entries[1].container == 1);
}

TEST_CASE("synthetic fatbins: damaged payloads are errors naming the entry", "[loader][fatbin]") {
    SECTION("a cubin entry that is not a cubin") {
        const auto e = inspect_error(build_container({{2, 90, 0x11, "not an ELF at all"}}));
        CHECK(e.code == EIO);
        CHECK_THAT(e.message, Catch::StartsWith("fatbin entry 0 (cubin sm_90): "));
    }
    SECTION("a zstd payload declaring another size") {
        const auto e = inspect_error(
            build_container({{1, 90, 0x8011, zstd(kPtx), std::strlen(kPtx) + 1, 9, 0}}));
        CHECK(e.code == EIO);
        CHECK_THAT(e.message, Catch::Contains("the entry declares"));
    }
    SECTION("a zstd payload that is not zstd") {
        const auto e = inspect_error(build_container({{1, 90, 0x8011, "garbage!", 100, 9, 0}}));
        CHECK_THAT(e.message, Catch::Contains("not a zstd frame"));
    }
    SECTION("an LZ4 payload declaring more than LZ4 can expand to") {
        const auto e =
            inspect_error(build_container({{1, 90, 0x2011, lz4_block(kPtx), 100u << 20, 9, 0}}));
        CHECK_THAT(e.message, Catch::Contains("cannot hold"));
    }
    SECTION("an LZ4 payload decompressing to a different size") {
        const auto e = inspect_error(
            build_container({{1, 90, 0x2011, lz4_block(kPtx), std::strlen(kPtx) + 3, 9, 0}}));
        CHECK_THAT(e.message, Catch::Contains("LZ4 payload"));
    }
    SECTION("garbage after a container") {
        const auto e = inspect_error(build_container({{2, 90, 0x11, tiny_cubin()}}) + "garbage!");
        CHECK_THAT(e.message, Catch::Contains("no container header at offset"));
    }
}

}  // namespace kcache::test
