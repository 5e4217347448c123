#include "bench_support.hpp"

#include <array>
#include <iterator>

#include <fmt/format.h>

#include "kcache/core/byte_writer.hpp"

namespace kcache::bench {

namespace {

// Little-endian fields, as core writes its own (ByteWriter).
void append_u16(std::string& out, std::uint32_t v) {
    core::ByteWriter(out).u16(static_cast<std::uint16_t>(v & 0xffff));
}
void append_u32(std::string& out, std::uint32_t v) {
    core::ByteWriter(out).u32(v);
}
void append_u64(std::string& out, std::uint64_t v) {
    core::ByteWriter(out).u64(v);
}

std::string kernel_name(Rng& rng) {
    static constexpr std::array<std::string_view, 8> kStems = {"matmul_kernel",
                                                               "fused_softmax",
                                                               "layer_norm_fwd",
                                                               "attn_fwd",
                                                               "triton_poi_fused_add_mul",
                                                               "triton_red_fused_sum",
                                                               "vector_add",
                                                               "conv2d_implicit_gemm"};
    return fmt::format("{}_{:04x}", kStems[rng.below(kStems.size())], rng.below(0x10000));
}

}  // namespace

std::string make_cubin(std::uint64_t seed, std::size_t size) {
    Rng rng(seed * 0x2545f4914f6cdd1dull + 1);
    const std::string name = kernel_name(rng);
    std::string out;
    out.reserve(size + 64);

    // ELF64 header for EM_CUDA (190), plausible offsets; the flags carry an sm arch.
    static constexpr std::array<unsigned char, 16> kIdent = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33,
                                                             7,    0,   0,   0,   0, 0, 0, 0};
    out.append(reinterpret_cast<const char*>(kIdent.data()), kIdent.size());
    append_u16(out, 2);                               // ET_EXEC
    append_u16(out, 190);                             // EM_CUDA
    append_u32(out, 128);                             // version (CUDA ABI)
    append_u64(out, 0);                               // entry
    append_u64(out, 64 + rng.below(8) * 64);          // phoff
    append_u64(out, size - 64 * (6 + rng.below(6)));  // shoff
    static constexpr std::array<std::uint32_t, 6> kArchFlags = {0x4b054b, 0x500550, 0x560556,
                                                                0x590559, 0x5a055a, 0x640564};
    append_u32(out, kArchFlags[rng.below(kArchFlags.size())]);
    append_u16(out, 64);
    append_u16(out, 56);
    append_u16(out, 3);
    append_u16(out, 64);
    append_u16(out, static_cast<std::uint32_t>(12 + rng.below(6)));
    append_u16(out, 1);

    // String table and .nv.info records take the tail; code fills ~70% of the file.
    std::string tail;
    for (std::string_view sec :
         {".shstrtab", ".strtab", ".symtab", ".symtab_shndx", ".nv.info", ".debug_frame",
          ".nv.callgraph", ".nv.prototype", ".nv.rel.action"}) {
        tail.append(sec);
        tail.push_back('\0');
    }
    for (std::string_view sec :
         {".text.", ".nv.info.", ".nv.shared.", ".nv.constant0.", ".rel.nv.constant0."}) {
        tail.append(sec);
        tail.append(name);
        tail.push_back('\0');
    }
    tail.append(name);
    tail.push_back('\0');
    const std::uint32_t params = 3 + rng.below(10);
    for (std::uint32_t i = 0; i < params; ++i) {  // EIATTR_KPARAM_INFO-like records
        tail.push_back(0x04);
        tail.push_back(0x17);
        append_u16(tail, 12);
        append_u32(tail, 0);
        append_u32(tail, (i << 16) | (i * 8));
        append_u32(tail, 0x0021f000);
    }
    for (std::uint32_t i = 0; i < 8; ++i) {  // other attributes
        tail.push_back(0x04);
        tail.push_back(static_cast<char>(0x0a + rng.below(0x30)));
        append_u16(tail, 8);
        append_u32(tail, rng.below(4) == 0 ? rng.below(0x10000) : 0);
        append_u32(tail, rng.below(256));
    }

    // SASS-like 128-bit instruction words: an opcode from a small set, small register
    // numbers, mostly-zero immediates, a control word from a few patterns; with some
    // probability a run of earlier instructions is repeated (unrolled loops).
    static constexpr std::array<std::uint16_t, 20> kOpcodes = {
        0x7ab9, 0x7919, 0x7c24, 0x7221, 0x7223, 0x7981, 0x7986, 0x794d, 0x7947, 0x7918,
        0x7210, 0x7819, 0x720c, 0x7984, 0x7388, 0x7b1d, 0x7e02, 0x7c11, 0x723c, 0x7f89};
    static constexpr std::array<std::uint64_t, 8> kControl = {
        0x000fe20000000f00ull, 0x000fc40000000000ull, 0x001fe200078e00ffull, 0x000fca0000000000ull,
        0x004fe40000010000ull, 0x000fe40007ffe0ffull, 0x003fde0003800000ull, 0x000fc800078e0203ull};
    const std::size_t code_begin = out.size();
    std::size_t code_end = size > tail.size() + 128 ? size - tail.size() - 64 : out.size();
    code_end = code_begin + (code_end - code_begin) / 16 * 16;
    while (out.size() + 16 <= code_end) {
        const std::size_t have = (out.size() - code_begin) / 16;
        if (have >= 8 && rng.below(4) == 0) {
            const std::size_t len = 4 + rng.below(5);
            const std::size_t from =
                code_begin + 16 * rng.below(static_cast<std::uint32_t>(have - 4));
            for (std::size_t k = 0;
                 k < len * 16 && from + k < code_begin + have * 16 && out.size() + 16 <= code_end;
                 k += 16) {
                const std::string word = out.substr(from + k, 16);
                out.append(word);
            }
            continue;
        }
        append_u16(out, kOpcodes[rng.below(kOpcodes.size())]);
        out.push_back(static_cast<char>(rng.below(64)));
        out.push_back(static_cast<char>(rng.below(4) == 0 ? 0xff : rng.below(64)));
        if (rng.below(5) == 0) {
            append_u32(out, static_cast<std::uint32_t>(rng.next() & 0xffffu) << rng.below(17));
        } else {
            out.push_back(static_cast<char>(rng.below(64)));
            out.append(3, '\0');
        }
        std::uint64_t control = kControl[rng.below(kControl.size())];
        if (rng.below(3) == 0) control ^= static_cast<std::uint64_t>(rng.below(256)) << 40;
        append_u64(out, control);
    }
    out.append(tail);
    out.resize(size, '\0');  // section alignment padding (or truncation when tiny)
    return out;
}

std::string make_json(std::uint64_t seed, std::size_t size) {
    Rng rng(seed * 0x9e3779b97f4a7c15ull + 2);
    const std::string name = kernel_name(rng);
    static constexpr std::array<int, 6> kArchs = {75, 80, 86, 89, 90, 100};
    static constexpr std::array<std::string_view, 6> kTypes = {"*fp16", "*fp32", "*bf16",
                                                               "i32",   "i64",   "fp32"};
    std::string out;
    out.reserve(size + 256);
    auto it = std::back_inserter(out);
    fmt::format_to(it,
                   "{{\"hash\": \"{:016x}{:016x}\", \"target\": {{\"backend\": \"cuda\", "
                   "\"arch\": {}, \"warp_size\": 32}}, \"num_warps\": {}, \"num_ctas\": 1, "
                   "\"num_stages\": {}, \"maxnreg\": null, \"cluster_dims\": [1, 1, 1], "
                   "\"ptx_version\": null, \"enable_fp_fusion\": true, "
                   "\"launch_cooperative_grid\": false, \"supported_fp8_dtypes\": "
                   "[\"fp8e4b15\", \"fp8e4nv\", \"fp8e5\"], \"default_dot_input_precision\": "
                   "\"tf32\", \"allowed_dot_input_precisions\": [\"tf32\", \"tf32x3\", "
                   "\"ieee\"], \"max_num_imprecise_acc_default\": 0, \"extern_libs\": "
                   "[[\"libdevice\", \"/usr/lib/python3/dist-packages/triton/backends/nvidia/"
                   "lib/libdevice.10.bc\"]], \"debug\": false, \"backend_name\": \"cuda\", "
                   "\"sanitize_overflow\": true, \"shared\": {}, \"tmem_size\": 0, "
                   "\"global_scratch_size\": 0, \"global_scratch_align\": 1, \"name\": \"{}\", "
                   "\"signature\": {{",
                   rng.next(), rng.next(), kArchs[rng.below(kArchs.size())], 1u << rng.below(4),
                   1 + rng.below(5), 1024 * rng.below(200), name);
    const std::uint32_t args = 2 + rng.below(5);
    for (std::uint32_t i = 0; i < args; ++i) {
        fmt::format_to(it, "{}\"arg_{}\": \"{}\"", i ? ", " : "", i,
                       kTypes[rng.below(kTypes.size())]);
    }
    fmt::format_to(it, "}}, \"constants\": {{\"BLOCK_M\": {}, \"BLOCK_N\": {}, \"BLOCK_K\": {}}}",
                   16u << rng.below(4), 16u << rng.below(4), 16u << rng.below(3));
    // Pad with a build-id-like field to exactly `size` bytes (when there is room).
    static constexpr std::string_view kPadKey = ", \"build_id\": \"";
    const std::size_t fixed = out.size() + kPadKey.size() + 2;  // + closing "\"}"
    if (fixed < size) {
        out.append(kPadKey);
        for (std::size_t i = fixed; i < size; ++i) {
            out.push_back("0123456789abcdef"[rng.below(16)]);
        }
        out.append("\"}");
    } else {
        out.append("}");
        out.resize(std::min(out.size(), size));
    }
    return out;
}

std::string make_ptx(std::uint64_t seed, std::size_t size) {
    Rng rng(seed * 0xd1b54a32d192ed03ull + 3);
    const std::string name = kernel_name(rng);
    static constexpr std::array<int, 6> kArchs = {75, 80, 86, 89, 90, 100};
    std::string out;
    out.reserve(size + 256);
    auto it = std::back_inserter(out);
    fmt::format_to(it,
                   "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 8.{}\n.target sm_{}\n"
                   ".address_size 64\n\n\t// .globl\t{}\n.extern .shared .align 16 .b8 "
                   "global_smem[];\n\n.visible .entry {}(\n",
                   rng.below(8), kArchs[rng.below(kArchs.size())], name, name);
    const std::uint32_t params = 3 + rng.below(8);
    for (std::uint32_t i = 0; i < params; ++i) {
        fmt::format_to(it, "\t.param .u64 {}_param_{}{}\n", name, i, i + 1 < params ? "," : "");
    }
    fmt::format_to(it,
                   ")\n.maxntid {}, 1, 1\n{{\n\t.reg .pred \t%p<{}>;\n\t.reg .b16 \t%rs<{}>;\n"
                   "\t.reg .b32 \t%r<{}>;\n\t.reg .f32 \t%f<{}>;\n\t.reg .b64 \t%rd<{}>;\n"
                   "\t.loc\t1 {} 0\n$L__func_begin0:\n",
                   32u << rng.below(4), 8 + rng.below(40), 8 + rng.below(64), 32 + rng.below(400),
                   32 + rng.below(300), 16 + rng.below(60), 10 + rng.below(200));

    const std::string footer =
        "\tret;\n$L__func_end0:\n\n}\n\t.file\t1 \"/tmp/torchinductor/kernel.py\"\n";
    std::uint32_t label = 1;
    std::uint32_t line = 20;
    std::string buf;
    while (true) {
        buf.clear();
        auto b = std::back_inserter(buf);
        const auto r = [&](std::uint32_t n) { return rng.below(n); };
        switch (rng.below(20)) {
            case 0:
                fmt::format_to(b, "\tld.global.f32 \t%f{}, [%rd{}+{}];\n", r(200), r(60),
                               4 * r(64));
                break;
            case 1:
                fmt::format_to(b, "\tst.global.f32 \t[%rd{}+{}], %f{};\n", r(60), 4 * r(64),
                               r(200));
                break;
            case 2:
            case 3:
                fmt::format_to(b, "\tfma.rn.f32 \t%f{}, %f{}, %f{}, %f{};\n", r(200), r(200),
                               r(200), r(200));
                break;
            case 4:
                fmt::format_to(b, "\tadd.s32 \t%r{}, %r{}, %r{};\n", r(300), r(300), r(300));
                break;
            case 5:
                fmt::format_to(b, "\tmul.wide.s32 \t%rd{}, %r{}, {};\n", r(60), r(300), 1u << r(4));
                break;
            case 6:
                fmt::format_to(b, "\tadd.s64 \t%rd{}, %rd{}, %rd{};\n", r(60), r(60), r(60));
                break;
            case 7:
                fmt::format_to(b, "\tsetp.lt.s32 \t%p{}, %r{}, %r{};\n", r(40), r(300), r(300));
                break;
            case 8:
                fmt::format_to(b, "\t@%p{} bra \t$L__BB0_{};\n", r(40), label + r(3));
                break;
            case 9:
                fmt::format_to(b, "\tmov.u32 \t%r{}, %tid.x;\n", r(300));
                break;
            case 10:
                fmt::format_to(b, "\tshl.b32 \t%r{}, %r{}, {};\n", r(300), r(300), r(8));
                break;
            case 11:
                fmt::format_to(b, "\tld.shared.f32 \t%f{}, [%r{}+{}];\n", r(200), r(300),
                               4 * r(256));
                break;
            case 12:
                fmt::format_to(b, "\tbar.sync \t0;\n");
                break;
            case 13:
                fmt::format_to(b, "\tcvt.rn.f16.f32 \t%rs{}, %f{};\n", r(60), r(200));
                break;
            case 14:
                fmt::format_to(b, "\tmax.f32 \t%f{}, %f{}, %f{};\n", r(200), r(200), r(200));
                break;
            case 15:
                fmt::format_to(b, "\tex2.approx.f32 \t%f{}, %f{};\n", r(200), r(200));
                break;
            case 16:
                fmt::format_to(b, "\tshfl.sync.bfly.b32\t%r{}, %r{}, {}, 31, -1;\n", r(300), r(300),
                               1u << r(5));
                break;
            case 17:
                fmt::format_to(b, "\t.loc\t1 {} {}\n", line += r(4), r(40));
                break;
            case 18:
                fmt::format_to(b, "$L__BB0_{}:\n", label++);
                break;
            default:
                fmt::format_to(b, "\tmov.b32 \t%f{}, 0f{:08X};\n", r(200),
                               r(4) ? 0u : static_cast<std::uint32_t>(rng.next()));
                break;
        }
        if (out.size() + buf.size() + footer.size() > size) break;
        out.append(buf);
    }
    // Pad to exactly `size` with one comment line (or spaces when there is no room).
    std::size_t room = size > out.size() + footer.size() ? size - out.size() - footer.size() : 0;
    if (room >= 4) {
        out.append("\t//");
        for (std::size_t i = 3; i + 1 < room; ++i) out.push_back("0123456789abcdef"[rng.below(16)]);
        out.push_back('\n');
    } else {
        out.append(room, ' ');
    }
    out.append(footer);
    out.resize(size, '\n');
    return out;
}

std::string entry_name(std::uint64_t i) {
    Rng rng(i ^ 0x6a09e667f3bcc909ull);
    return fmt::format("{:016x}{:016x}", rng.next(), rng.next());
}

}  // namespace kcache::bench
