// Hostile inputs: truncated at every length, bytes flipped at random (seeded), and
// headers crafted with huge offsets and counts. Every input must give a result or an
// error, never a crash or a hang (run under ASan/UBSan as well; the fuzzer goes
// further). Results that do come back must be self-consistent.

#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "builders.hpp"
#include "expected.hpp"

namespace kcache::test {
namespace {

const char* const kPtx = R"(.version 9.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p, .param .align 16 .b8 v[16], .param .u32 n)
{
	ret;
}
)";

std::string synthetic_cubin() {
    return build_cubin(
        {{"axpy", kparam_info(3, 24, 4) + kparam_info(2, 16, 8) + kparam_info(1, 8, 8) +
                      kparam_info(0, 0, 4) + eiattr_value(3, 0x19, 28)},
         {"big", kparam_info_v2(1, 8, 8000) + kparam_info_v2(0, 0, 8)}});
}

std::string synthetic_fatbin() {
    std::string z(ZSTD_compressBound(std::strlen(kPtx)), '\0');
    z.resize(ZSTD_compress(z.data(), z.size(), kPtx, std::strlen(kPtx), 3));
    return build_container({{2, 90, 0x11, synthetic_cubin()},
                            {1, 90, 0x8011, z, std::strlen(kPtx), 9, 0},
                            {1, 80, 0x2011, lz4_block(std::string(kPtx) + std::string(64, ' ')),
                             std::strlen(kPtx) + 64, 9, 0}});
}

void validate_kernels(const std::vector<loader::KernelInfo>& kernels) {
    for (const auto& k : kernels) {
        std::vector<std::size_t> sizes;
        for (std::size_t i = 0; i < k.params.size(); ++i) {
            REQUIRE(k.params[i].index == i);
            REQUIRE(std::uint64_t{k.params[i].offset} + k.params[i].size >= k.params[i].offset);
            REQUIRE(k.param_bytes >=
                    std::min<std::uint64_t>(UINT32_MAX,
                                            std::uint64_t{k.params[i].offset} + k.params[i].size));
            sizes.push_back(k.params[i].size);
        }
        REQUIRE(loader::check_arguments(k, sizes).has_value());
        sizes.push_back(1);
        REQUIRE_FALSE(loader::check_arguments(k, sizes).has_value());
    }
}

// Inspects `bytes`; a success must be consistent, a failure must carry a known code.
// Returns whether it succeeded.
bool survive(std::string_view bytes) {
    loader::InspectOptions options;
    options.max_decompressed_size = 1u << 20;
    const auto info = loader::inspect(bytes, options);
    if (!info) {
        const int code = info.error().code;
        REQUIRE((code == EIO || code == ENOEXEC || code == ENOMEM));
        REQUIRE_FALSE(info.error().message.empty());
        return false;
    }
    validate_kernels(info->kernels);
    for (const auto& e : info->entries) {
        if (e.kernels) validate_kernels(*e.kernels);
    }
    return true;
}

// Every proper prefix of a cubin, fatbin or host object is an error: the section
// header table is at the end of an ELF file, and a container declares its size.
void every_prefix_fails(const std::string& bytes) {
    REQUIRE(survive(bytes));
    for (std::size_t n = 0; n < bytes.size(); ++n) {
        if (survive(std::string_view(bytes).substr(0, n)))
            FAIL("prefix of " << n << " bytes parsed");
    }
}

void random_flips(const std::string& bytes, std::uint32_t seed, int rounds) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::size_t> where(0, bytes.size() - 1);
    std::uniform_int_distribution<int> how_many(1, 8);
    std::uniform_int_distribution<int> value(0, 255);
    int parsed = 0;
    for (int round = 0; round < rounds; ++round) {
        std::string damaged = bytes;
        for (int i = how_many(rng); i > 0; --i) damaged[where(rng)] = static_cast<char>(value(rng));
        parsed += survive(damaged) ? 1 : 0;
    }
    // Flips in code or padding leave a valid binary: some rounds must still parse.
    CHECK(parsed > 0);
}

core::Error error_of(const std::string& bytes) {
    const auto info = loader::inspect(bytes);
    REQUIRE_FALSE(info.has_value());
    return info.error();
}

}  // namespace

TEST_CASE("truncated at every length: synthetic cubin and fatbin", "[loader][hostile]") {
    every_prefix_fails(synthetic_cubin());
    every_prefix_fails(synthetic_fatbin());
}

TEST_CASE("truncated at every length: nvcc cubin, fatbin and host object", "[loader][hostile]") {
    every_prefix_fails(kernel_bytes("params_sm_" + std::string(kernels::kFirstArch) + ".cubin"));
    every_prefix_fails(kernel_bytes("params.fatbin"));
    every_prefix_fails(kernel_bytes("params.o"));
}

TEST_CASE("truncated PTX parses to a prefix of its kernels or fails", "[loader][hostile]") {
    const std::string text = kPtx;
    for (std::size_t n = 0; n < text.size(); ++n) {
        const auto info = loader::inspect(text.substr(0, n));
        // The only kernel needs its closing brace.
        if (info && !info->kernels.empty()) CHECK(n > text.rfind('}'));
    }
}

TEST_CASE("random byte flips (seeded)", "[loader][hostile]") {
    random_flips(synthetic_cubin(), 1, 3000);
    random_flips(synthetic_fatbin(), 2, 3000);
    random_flips(kPtx, 3, 3000);
}

TEST_CASE("random byte flips (seeded) in nvcc output", "[loader][hostile]") {
    random_flips(kernel_bytes("params_sm_" + std::string(kernels::kLastArch) + ".cubin"), 4, 2000);
    random_flips(kernel_bytes("params_compressed.fatbin"), 5, 2000);
    random_flips(kernel_bytes("params.o"), 6, 1000);
    random_flips(kernel_bytes("params.ptx"), 7, 1000);
}

TEST_CASE("crafted ELF headers", "[loader][hostile]") {
    const std::string good = synthetic_cubin();
    const std::size_t shoff = get_at(good, kElfShoff, 8);
    const std::size_t shnum = get_at(good, kElfShnum, 2);
    auto patched = [&](std::size_t at, std::uint64_t value, int bytes) {
        std::string b = good;
        put_at(b, at, value, bytes);
        return b;
    };
    // Offset of field `field` in section header `index`.
    auto sh = [&](std::size_t index, std::size_t field) { return shoff + index * 64 + field; };

    CHECK_THAT(error_of(patched(kElfShoff, ~std::uint64_t{0} - 8, 8)).message,
               Catch::Contains("past the end of the file"));
    CHECK_THAT(error_of(patched(kElfShnum, 0xffff, 2)).message,
               Catch::Contains("run past the end of the file"));
    // Program headers (a cubin has them after the sections): bounds of the table.
    {
        std::string b = patched(54, 56, 2);  // e_phentsize
        put_at(b, 56, 1, 2);                 // e_phnum
        put_at(b, 32, b.size() - 8, 8);      // e_phoff: 8 bytes of 56 left
        CHECK_THAT(error_of(b).message, Catch::Contains("program headers at"));
        put_at(b, 56, 0xfffe, 2);
        put_at(b, 32, 0, 8);
        CHECK_THAT(error_of(b).message, Catch::Contains("program headers at"));
        put_at(b, 54, 64, 2);
        CHECK_THAT(error_of(b).message, Catch::Contains("program header size 64"));
    }
    CHECK_THAT(error_of(patched(kElfShentsize, 32, 2)).message,
               Catch::Contains("section header size 32"));
    CHECK_THAT(error_of(patched(kElfShstrndx, shnum, 2)).message,
               Catch::Contains("section name table index"));
    CHECK_THAT(error_of(patched(kElfShstrndx, 1, 2)).message,
               Catch::Contains("is not a string table"));
    // e_shnum = 0: the count is in section 0's sh_size.
    {
        std::string b = patched(kElfShnum, 0, 2);
        put_at(b, sh(0, 32), std::uint64_t{1} << 62, 8);
        CHECK_THAT(error_of(b).message, Catch::Contains("run past the end of the file"));
        put_at(b, sh(0, 32), shnum, 8);
        CHECK(survive(b));
        put_at(b, sh(0, 32), 0, 8);
        CHECK_THAT(error_of(b).message, Catch::Contains("no sections"));
    }
    // e_shstrndx = SHN_XINDEX: the index is in section 0's sh_link.
    {
        std::string b = patched(kElfShstrndx, 0xffff, 2);
        put_at(b, sh(0, 40), get_at(good, kElfShstrndx, 2), 4);
        CHECK(survive(b));
        put_at(b, sh(0, 40), 0xffffffff, 4);
        CHECK_THAT(error_of(b).message, Catch::Contains("section name table index"));
    }
    for (std::size_t i = 1; i < shnum; ++i) {
        INFO("section " << i);
        CHECK_THAT(error_of(patched(sh(i, 24), ~std::uint64_t{0} - 100, 8)).message,
                   Catch::Contains("runs past the end of the file"));
        CHECK_THAT(error_of(patched(sh(i, 32), std::uint64_t{1} << 40, 8)).message,
                   Catch::Contains("runs past the end of the file"));
        CHECK_THAT(error_of(patched(sh(i, 0), 0x7fffffff, 4)).message,
                   Catch::Contains("outside the name table"));
    }
    // The symbol table: bad entry size, bad string table link, huge name offset.
    std::size_t symtab = 0;
    for (std::size_t i = 1; i < shnum; ++i) {
        if (get_at(good, sh(i, 4), 4) == 2) symtab = i;
    }
    REQUIRE(symtab != 0);
    CHECK_THAT(error_of(patched(sh(symtab, 56), 16, 8)).message,
               Catch::Contains("symbol table entry size 16"));
    CHECK_THAT(error_of(patched(sh(symtab, 40), 0xffffff, 4)).message,
               Catch::Contains("not a string table"));
    const std::size_t first_symbol = get_at(good, sh(symtab, 24), 8) + 24;
    CHECK_THAT(error_of(patched(first_symbol, 0xfffffff0, 4)).message,
               Catch::Contains("outside the string table"));
}

TEST_CASE("crafted fatbin headers", "[loader][hostile]") {
    const std::string good = synthetic_fatbin();
    auto patched = [&](std::size_t at, std::uint64_t value, int bytes) {
        std::string b = good;
        put_at(b, at, value, bytes);
        return b;
    };
    constexpr std::size_t kEntry = 16;  // the first entry header
    CHECK_THAT(error_of(patched(8, ~std::uint64_t{0}, 8)).message,
               Catch::Contains("runs past the end"));
    CHECK_THAT(error_of(patched(6, 4, 2)).message, Catch::Contains("runs past the end"));
    CHECK_THAT(error_of(patched(6, 0xffff, 2)).message, Catch::Contains("runs past the end"));
    CHECK_THAT(error_of(patched(kEntry + 4, 0, 4)).message,
               Catch::Contains("runs past its container"));
    CHECK_THAT(error_of(patched(kEntry + 4, 0xffffffff, 4)).message,
               Catch::Contains("runs past its container"));
    CHECK_THAT(error_of(patched(kEntry + 8, ~std::uint64_t{0} - 0x3f, 8)).message,
               Catch::Contains("runs past its container"));
    // A body too short for an entry header.
    {
        std::string b = good.substr(0, 16) + std::string("\x01\x00\x01\x01", 4);
        put_at(b, 8, 4, 8);
        CHECK_THAT(error_of(b).message, Catch::Contains("entry header at 16 truncated"));
    }
    // A compressed entry declaring a huge uncompressed size: listed without kernels
    // (beyond the limit), nothing allocated.
    {
        const std::size_t second = kEntry + 0x40 + ((synthetic_cubin().size() + 7) / 8 * 8);
        const auto info = loader::inspect(patched(second + 0x38, ~std::uint64_t{0}, 8));
        REQUIRE(info.has_value());
        CHECK(info->entries[1].uncompressed_size == ~std::uint64_t{0});
        CHECK_FALSE(info->entries[1].kernels.has_value());
    }
}

TEST_CASE("crafted host ELF: a fatbin section that is not a fatbin", "[loader][hostile]") {
    ElfSpec host;
    host.machine = 62;
    host.sections.push_back({".nv_fatbin", 1, "this is not a fatbin"});
    const auto e = error_of(build_elf(host));
    CHECK(e.code == EIO);
    CHECK(e.message == ".nv_fatbin: fatbin: no container header at offset 0");
}

}  // namespace kcache::test
