// PTX introspection: `.version`, `.target` and the `.entry` kernels with their
// parameters.
//
// Parameters are declared as
//   .param .u64 name                         a scalar: size and alignment of its type
//   .param .align 16 .b8 name[16]            an aggregate: bytes and explicit alignment
//   .param .u64 .ptr .global .align 8 name   a pointer (the .align after .ptr is the
//                                            pointee's, not the parameter's)
// and laid out in order, each at the next multiple of its alignment. That is the PTX
// ABI; the cubin ptxas makes from it normally has the same offsets, but may place
// some parameters differently (a __grid_constant__ CUtensorMap on sm_90), so the
// cubin is the authority when there is one.
//
// The lexer skips comments (// and /* */) and string literals, and the parser looks at
// directives outside braces only, so text inside kernel bodies never matters.

#include <cerrno>
#include <cstdint>
#include <optional>

#include <fmt/format.h>

#include "kcache/core/byte_reader.hpp"
#include "parsers.hpp"

namespace kcache::loader::detail {
namespace {

using core::fail;

constexpr std::uint64_t kMaxParamBytes = UINT32_MAX;  // offsets and sizes fit ParamInfo
constexpr std::uint64_t kMaxAlign = 1u << 16;

bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '$' || c == '%' || c == '.';
}

class Lexer {
  public:
    explicit Lexer(std::string_view text) : m_in(text, "ptx") {}

    // The next token: a word (directive, identifier, number), a string literal, or one
    // punctuation character. Empty at the end of the text.
    std::string_view next() {
        if (m_peeked) {
            m_peeked = false;
            return m_peek;
        }
        return scan();
    }
    std::string_view peek() {
        if (!m_peeked) {
            m_peek = scan();
            m_peeked = true;
        }
        return m_peek;
    }
    std::size_t line() const { return m_line; }

  private:
    // The lexer's position is m_in's; it looks ahead in m_in.rest() (the unread text)
    // and consumes with bytes() / skip(), which cannot pass the end: a string literal
    // cut short by the end (or by a trailing backslash) ends there.
    std::string_view scan() {
        skip_space_and_comments();
        const std::string_view rest = m_in.rest();
        if (rest.empty()) return {};
        std::size_t n = 1;
        const char c = rest[0];
        if (word_char(c)) {
            while (n < rest.size() && word_char(rest[n])) ++n;
        } else if (c == '"') {
            while (n < rest.size() && rest[n] != '"' && rest[n] != '\n')
                n += rest[n] == '\\' ? 2 : 1;
            n = std::min(n + 1, rest.size());
        }
        return m_in.bytes(n).value_or(std::string_view{});  // n <= rest.size(): never fails
    }

    void skip_space_and_comments() {
        for (std::string_view rest = m_in.rest(); !rest.empty(); rest = m_in.rest()) {
            const char c = rest[0];
            std::size_t n = 0;
            if (c == '\n') {
                ++m_line;
                n = 1;
            } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
                n = 1;
            } else if (rest.starts_with("//")) {
                n = std::min(rest.find('\n'), rest.size());
            } else if (rest.starts_with("/*")) {
                const std::size_t end = rest.find("*/", 2);
                n = end == std::string_view::npos ? rest.size() : end + 2;
                for (std::size_t i = 0; i < n; ++i) m_line += rest[i] == '\n';
            } else {
                return;
            }
            if (!m_in.skip(n)) return;  // n <= rest.size(): never fails
        }
    }

    core::ByteReader m_in;
    std::size_t m_line = 1;
    std::string_view m_peek;
    bool m_peeked = false;
};

// Size in bytes of a PTX fundamental type usable for a kernel parameter, or 0.
std::uint64_t type_size(std::string_view t) {
    if (t == ".b8" || t == ".u8" || t == ".s8") return 1;
    if (t == ".b16" || t == ".u16" || t == ".s16" || t == ".f16" || t == ".bf16") return 2;
    if (t == ".b32" || t == ".u32" || t == ".s32" || t == ".f32" || t == ".f16x2" ||
        t == ".bf16x2") {
        return 4;
    }
    if (t == ".b64" || t == ".u64" || t == ".s64" || t == ".f64") return 8;
    if (t == ".b128") return 16;
    if (t == ".texref" || t == ".samplerref" || t == ".surfref") return 8;  // opaque handles
    return 0;
}

bool state_space(std::string_view t) {
    return t == ".global" || t == ".const" || t == ".local" || t == ".shared";
}

std::optional<std::uint64_t> number(std::string_view t) {
    if (t.empty() || t.size() > 12) return std::nullopt;
    std::uint64_t value = 0;
    for (char c : t) {
        if (c < '0' || c > '9') return std::nullopt;
        value = value * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return value;
}

std::string quoted(std::string_view token) {
    if (token.empty()) return "the end of the text";
    return fmt::format("'{}'", token.substr(0, 40));
}

class Parser {
  public:
    explicit Parser(std::string_view text) : m_lex(text) {}

    Result<BinaryInfo> run() {
        BinaryInfo info;
        info.format = Format::ptx;
        if (m_lex.next() != ".version") return error("does not start with .version");
        const std::string_view version = m_lex.next();
        if (!valid_version(version)) {
            return error(fmt::format(".version {} is not a version number", quoted(version)));
        }
        info.ptx_version = std::string(version);

        int depth = 0;
        for (std::string_view t = m_lex.next(); !t.empty(); t = m_lex.next()) {
            if (t == "{") {
                ++depth;
            } else if (t == "}") {
                if (--depth < 0) return error("unbalanced '}'");
            } else if (depth == 0 && t == ".target" && info.arch.empty()) {
                const std::string_view target = m_lex.next();
                if (!target.starts_with("sm_") && !target.starts_with("compute_")) {
                    return error(
                        fmt::format(".target {} is not an SM architecture", quoted(target)));
                }
                info.arch = std::string(target);
            } else if (depth == 0 && t == ".entry") {
                auto kernel = KCACHE_TRY(entry());
                if (kernel) info.kernels.push_back(std::move(*kernel));
            }
        }
        if (depth != 0) return error("unbalanced '{' at the end of the text");
        if (info.arch.empty()) return error("no .target directive");
        return info;
    }

  private:
    static bool valid_version(std::string_view v) {
        const std::size_t dot = v.find('.');
        return dot != std::string_view::npos && number(v.substr(0, dot)) &&
               number(v.substr(dot + 1));
    }

    tl::unexpected<core::Error> error(const std::string& why) const {
        return fail(EIO, fmt::format("ptx: line {}: {}", m_lex.line(), why));
    }

    // After `.entry`: the kernel, or nullopt for a declaration without a body.
    Result<std::optional<KernelInfo>> entry() {
        KernelInfo kernel;
        const std::string_view name = m_lex.next();
        if (name.empty() || !word_char(name.front()) || name.front() == '.') {
            return error(fmt::format(".entry followed by {}", quoted(name)));
        }
        kernel.name = std::string(name);
        if (m_lex.peek() == "(") {
            m_lex.next();
            std::uint64_t offset = 0;
            if (m_lex.peek() == ")") {
                m_lex.next();
            } else {
                while (true) {
                    KCACHE_TRY(param(kernel, offset));
                    const std::string_view sep = m_lex.next();
                    if (sep == ")") break;
                    if (sep != ",") {
                        return error(
                            fmt::format("kernel {}: expected ',' or ')' after a "
                                        "parameter, found {}",
                                        kernel.name, quoted(sep)));
                    }
                }
            }
        }
        // Performance directives (.maxntid 128, 1, 1 ...) may come before the body.
        while (true) {
            const std::string_view t = m_lex.peek();
            if (t.empty()) return error(fmt::format("kernel {} has no body", kernel.name));
            if (t == "{") break;  // the caller counts the braces
            m_lex.next();
            if (t == ";") return std::optional<KernelInfo>{};  // a declaration
        }
        KCACHE_TRY(finish_kernel(kernel, "ptx: kernel " + kernel.name));
        return std::optional<KernelInfo>(std::move(kernel));
    }

    Status param(KernelInfo& kernel, std::uint64_t& offset) {
        const std::uint32_t index = static_cast<std::uint32_t>(kernel.params.size());
        const std::string what = fmt::format("kernel {} parameter {}", kernel.name, index);
        if (const auto t = m_lex.next(); t != ".param") {
            return error(fmt::format("{}: expected .param, found {}", what, quoted(t)));
        }
        std::uint64_t align = 0;
        std::uint64_t element = 0;
        std::uint64_t vector = 1;
        std::uint64_t count = 1;
        bool pointer = false;
        std::string_view name;
        while (true) {
            const std::string_view t = m_lex.peek();
            if (t == "," || t == ")" || t.empty()) break;
            m_lex.next();
            if (t == ".align") {
                const auto n = number(m_lex.next());
                if (!n || *n == 0 || *n > kMaxAlign || (*n & (*n - 1)) != 0) {
                    return error(fmt::format("{}: bad .align", what));
                }
                if (!pointer) align = *n;  // after .ptr it is the pointee's alignment
            } else if (t == ".ptr") {
                pointer = true;
            } else if (state_space(t) && pointer) {
                continue;
            } else if (t == ".v2" || t == ".v4") {
                vector = t == ".v2" ? 2 : 4;
            } else if (type_size(t) != 0 && element == 0) {
                element = type_size(t);
            } else if (t == "[") {
                const auto n = number(m_lex.next());
                if (!n || m_lex.next() != "]")
                    return error(fmt::format("{}: bad array size", what));
                if (*n != 0 && count > kMaxParamBytes / *n) {
                    return error(fmt::format("{}: array too large", what));
                }
                count *= *n;
            } else if (t.front() != '.' && word_char(t.front()) && name.empty()) {
                name = t;
            } else {
                return error(fmt::format("{}: unexpected {}", what, quoted(t)));
            }
        }
        if (element == 0) return error(fmt::format("{}: no type", what));
        if (name.empty()) return error(fmt::format("{}: no name", what));
        const std::uint64_t size = element * vector * count;
        if (align == 0) align = element * vector;
        offset = (offset + align - 1) / align * align;
        if (size > kMaxParamBytes || offset + size > kMaxParamBytes) {
            return error(fmt::format("{}: parameters end past 4 GiB", what));
        }
        kernel.params.push_back(
            ParamInfo{index, static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(size)});
        offset += size;
        return {};
    }

    Lexer m_lex;
};

}  // namespace

bool looks_like_ptx(std::string_view text) {
    // Only text: a binary file that happens to contain ".version" is not PTX.
    if (text.find('\0') != std::string_view::npos) {
        const std::size_t end = text.find_last_not_of('\0');
        if (end == std::string_view::npos ||
            text.substr(0, end + 1).find('\0') != std::string_view::npos) {
            return false;
        }
    }
    return Lexer(text).next() == ".version";
}

Result<BinaryInfo> parse_ptx(std::string_view text) {
    return Parser(text).run();
}

}  // namespace kcache::loader::detail
