#include "kcache/core/roles.hpp"

#include <array>

namespace kcache::core {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view s, std::string_view prefix) {
    return s.substr(0, prefix.size()) == prefix;
}

struct Suffix {
    std::string_view suffix;
    Role role;
};
// The one table of file roles. Longer suffixes first where one ends another.
constexpr std::array kRoles{
    Suffix{".cubin", Role::binary},  Suffix{".fatbin", Role::binary},
    Suffix{".hsaco", Role::binary},  Suffix{".vmfb", Role::binary},
    Suffix{".so", Role::binary},     Suffix{".o", Role::binary},
    Suffix{".bin", Role::binary},    Suffix{".spv", Role::binary},
    Suffix{".xclbin", Role::binary}, Suffix{".neff", Role::binary},
    Suffix{".json", Role::signature}, Suffix{"kernel_sig", Role::signature},
    Suffix{".sig", Role::signature},
    Suffix{".ptx", Role::ir},        Suffix{".mlir", Role::ir},
    Suffix{".llir", Role::ir},       Suffix{".ll", Role::ir},
    Suffix{".ttir", Role::ir},       Suffix{".ttgir", Role::ir},
    Suffix{".amdgcn", Role::ir},     Suffix{".source", Role::ir},
    Suffix{".sass", Role::ir},       Suffix{".cu", Role::ir},
    Suffix{".py", Role::ir},         Suffix{".hlo", Role::ir},
};

}  // namespace

Role role_of(std::string_view name) {
    // Triton's group file lists the files of a kernel; it is not a kernel's signature.
    if (starts_with(name, "__grp__")) return Role::other;
    for (const auto& [suffix, role] : kRoles) {
        if (ends_with(name, suffix)) return role;
    }
    return Role::other;
}

Producer producer_of(std::string_view name) {
    if (starts_with(name, "__grp__") || ends_with(name, ".ttir") || ends_with(name, ".ttgir") ||
        ends_with(name, ".llir") || ends_with(name, ".amdgcn")) {
        return Producer::triton;
    }
    if (ends_with(name, ".vmfb")) return Producer::wave;
    if (ends_with(name, "-cache") || ends_with(name, "-atime")) return Producer::jax;
    if (ends_with(name, ".manifest") || ends_with(name, "R") || ends_with(name, "M") ||
        name == "stats") {
        return Producer::ccache;
    }
    if (ends_with(name, ".py") || ends_with(name, ".best_config")) return Producer::inductor;
    if (name == "kernel.json" || name == "kernel.cubin" || name == "kernel.fatbin" ||
        name == "kernel.ptx") {
        return Producer::kcache;
    }
    return Producer::unknown;
}

std::string_view role_name(Role r) {
    switch (r) {
        case Role::binary: return "binary";
        case Role::signature: return "signature";
        case Role::ir: return "ir";
        case Role::other: return "other";
    }
    return "other";
}

std::string_view producer_name(Producer p) {
    switch (p) {
        case Producer::unknown: return "unknown";
        case Producer::triton: return "triton";
        case Producer::wave: return "wave";
        case Producer::inductor: return "inductor";
        case Producer::jax: return "jax";
        case Producer::ccache: return "ccache";
        case Producer::cutedsl: return "cutedsl";
        case Producer::helion: return "helion";
        case Producer::kcache: return "kcache";
    }
    return "unknown";
}

}  // namespace kcache::core
