#include "kcache/core/roles.hpp"

#include <array>

namespace kcache::core {
namespace {

struct Suffix {
    std::string_view suffix;
    Role role;
};
// The one table of file roles. Longer suffixes first where one ends another.
constexpr std::array kRoles{
    Suffix{".cubin", Role::binary},   Suffix{".fatbin", Role::binary},
    Suffix{".hsaco", Role::binary},   Suffix{".vmfb", Role::binary},
    Suffix{".so", Role::binary},      Suffix{".o", Role::binary},
    Suffix{".bin", Role::binary},     Suffix{".spv", Role::binary},
    Suffix{".xclbin", Role::binary},  Suffix{".neff", Role::binary},
    Suffix{".json", Role::signature}, Suffix{"kernel_sig", Role::signature},
    Suffix{".sig", Role::signature},  Suffix{".ptx", Role::ir},
    Suffix{".mlir", Role::ir},        Suffix{".llir", Role::ir},
    Suffix{".ll", Role::ir},          Suffix{".ttir", Role::ir},
    Suffix{".ttgir", Role::ir},       Suffix{".amdgcn", Role::ir},
    Suffix{".source", Role::ir},      Suffix{".sass", Role::ir},
    Suffix{".cu", Role::ir},          Suffix{".py", Role::ir},
    Suffix{".hlo", Role::ir},
};

}  // namespace

Role role_of(std::string_view name) {
    // Triton's group file lists the files of a kernel; it is not a kernel's signature.
    if (name.starts_with("__grp__")) return Role::other;
    for (const auto& [suffix, role] : kRoles) {
        if (name.ends_with(suffix)) return role;
    }
    return Role::other;
}

std::string_view file_kind(std::string_view name) {
    if (name.starts_with("__grp__")) return "group";
    for (const auto& entry : kRoles) {
        const std::string_view suffix = entry.suffix;
        if (name.ends_with(suffix)) return suffix.starts_with('.') ? suffix.substr(1) : suffix;
    }
    return "other";
}

void Completion::add(std::string_view name) {
    if (file_kind(name) == "group") marked = true;
    m_cpp = m_cpp || name.ends_with(".cpp");
    m_so = m_so || name.ends_with(".so");
    expects_mark = expects_mark || m_cpp || producer_of(name) == Producer::triton;
    marked = marked || (m_cpp && m_so);
}

Producer producer_of(std::string_view name) {
    // .source: the first file Triton writes into an entry (its kernel's IR before any
    // stage), also with TRITON_STORE_BINARY_ONLY.
    if (name.starts_with("__grp__") || name.ends_with(".ttir") || name.ends_with(".ttgir") ||
        name.ends_with(".llir") || name.ends_with(".amdgcn") || name.ends_with(".source")) {
        return Producer::triton;
    }
    if (name.ends_with(".vmfb")) return Producer::wave;
    if (name.ends_with("-cache") || name.ends_with("-atime")) return Producer::jax;
    if (name.ends_with(".manifest") || name.ends_with("R") || name.ends_with("M") ||
        name == "stats") {
        return Producer::ccache;
    }
    if (name.ends_with(".py") || name.ends_with(".best_config")) return Producer::inductor;
    if (name == "kernel.json" || name == "kernel.cubin" || name == "kernel.fatbin" ||
        name == "kernel.ptx") {
        return Producer::kcache;
    }
    return Producer::unknown;
}

std::string_view role_name(Role r) {
    switch (r) {
        case Role::binary:
            return "binary";
        case Role::signature:
            return "signature";
        case Role::ir:
            return "ir";
        case Role::other:
            return "other";
    }
    return "other";
}

std::string_view producer_name(Producer p) {
    switch (p) {
        case Producer::unknown:
            return "unknown";
        case Producer::triton:
            return "triton";
        case Producer::wave:
            return "wave";
        case Producer::inductor:
            return "inductor";
        case Producer::jax:
            return "jax";
        case Producer::ccache:
            return "ccache";
        case Producer::cutedsl:
            return "cutedsl";
        case Producer::helion:
            return "helion";
        case Producer::kcache:
            return "kcache";
    }
    return "unknown";
}

}  // namespace kcache::core
