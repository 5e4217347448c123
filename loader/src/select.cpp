// Choosing an entry's binary for a device, and finding its signature.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kcache/core/roles.hpp"
#include "kcache/loader/cache.hpp"

namespace kcache::loader {
namespace {

using core::fail;

std::string_view base_name(std::string_view path) {
    const auto slash = path.rfind('/');
    return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::string_view stem(std::string_view path) {
    const auto name = base_name(path);
    const auto dot = name.find('.');
    return dot == std::string_view::npos ? name : name.substr(0, dot);
}

bool has_suffix(std::string_view name, std::string_view suffix) {
    return name.size() > suffix.size() && name.ends_with(suffix);
}

std::string sm_name(int sm) {
    return fmt::format("sm_{}", sm);
}

// A usable binary, ranked: lower tier first (cubin file, fatbin cubin entry, PTX),
// then an exact SM before a compatible one, then the highest SM.
struct Candidate {
    int tier = 0;
    bool exact = false;
    int sm = 0;
    std::size_t file = 0;  // index into the inspected files
    int fatbin_entry = -1;
    bool jit = false;
    std::string arch;
    auto rank() const { return std::make_tuple(tier, exact ? 0 : 1, -sm); }
};

}  // namespace

std::optional<Arch> parse_arch(std::string_view arch) {
    if (arch.starts_with("sm_")) {
        arch.remove_prefix(3);
    } else if (arch.starts_with("compute_")) {
        arch.remove_prefix(8);
    } else {
        return std::nullopt;
    }
    int sm = 0;
    const auto [end, ec] = std::from_chars(arch.data(), arch.data() + arch.size(), sm);
    if (ec != std::errc() || end == arch.data() || sm <= 0) return std::nullopt;
    const std::string_view variant(end, static_cast<std::size_t>(arch.data() + arch.size() - end));
    if (!variant.empty() && variant != "a" && variant != "f") return std::nullopt;
    return Arch{sm, std::string(variant)};
}

bool cubin_runs_on(const Arch& arch, int device_sm) {
    if (arch.sm == device_sm) return true;
    if (arch.variant == "a") return false;
    return arch.sm / 10 == device_sm / 10 && arch.sm < device_sm;
}

bool ptx_runs_on(const Arch& arch, int device_sm) {
    if (arch.variant.empty()) return arch.sm <= device_sm;
    return cubin_runs_on(arch, device_sm);
}

const std::vector<KernelInfo>* Selection::kernels() const {
    if (format != Format::fatbin) return &info.kernels;
    if (fatbin_entry < 0 || static_cast<std::size_t>(fatbin_entry) >= info.entries.size()) {
        return nullptr;
    }
    const auto& entry = info.entries[static_cast<std::size_t>(fatbin_entry)];
    return entry.kernels ? &*entry.kernels : nullptr;
}

namespace {

// The files of `entry` a binary may be in (`only_file`: that one), in the order they are
// read.
std::vector<const EntryFile*> binary_files(Entry& entry, std::string_view only_file) {
    // Cubins first, then fatbins, then PTX: once a cubin for the exact SM is found,
    // nothing else can rank higher and the other files are not read.
    const auto kind_rank = [](std::string_view name) {
        return has_suffix(name, ".cubin") ? 0 : has_suffix(name, ".fatbin") ? 1 : 2;
    };
    std::vector<const EntryFile*> files;
    for (const auto& file : entry.files()) {
        const std::string_view name = file.path;
        if (!only_file.empty() ? name == only_file
                               : (has_suffix(name, ".cubin") || has_suffix(name, ".fatbin") ||
                                  has_suffix(name, ".ptx"))) {
            files.push_back(&file);
        }
    }
    std::stable_sort(files.begin(), files.end(), [&](const EntryFile* a, const EntryFile* b) {
        return kind_rank(a->path) < kind_rank(b->path);
    });
    return files;
}

// The candidates file `name` (inspected as `info`, the index-th one inspected) offers a
// GPU of `device_sm`; why it offers none (or which entries it holds) in `reasons`.
void add_candidates(const BinaryInfo& info, std::string_view name, std::size_t index, int device_sm,
                    std::vector<Candidate>& candidates, std::vector<std::string>& reasons) {
    const auto add = [&](int tier, const Arch& arch, int fatbin_entry, bool jit,
                         const std::string& arch_text) {
        candidates.push_back(
            Candidate{tier, arch.sm == device_sm, arch.sm, index, fatbin_entry, jit, arch_text});
    };
    if (info.format == Format::cubin || info.format == Format::ptx) {
        const bool ptx = info.format == Format::ptx;
        const auto arch = parse_arch(info.arch);
        if (arch && (ptx ? ptx_runs_on(*arch, device_sm) : cubin_runs_on(*arch, device_sm))) {
            add(ptx ? 2 : 0, *arch, -1, ptx, info.arch);
        } else {
            reasons.push_back(fmt::format("{} {} {}", name, ptx ? "targets" : "is", info.arch));
        }
    } else {
        std::vector<std::string> held;
        for (std::size_t i = 0; i < info.entries.size(); ++i) {
            const auto& e = info.entries[i];
            const auto arch = parse_arch(e.arch);
            const int at = static_cast<int>(i);
            if (e.kind == EntryKind::cubin && arch && cubin_runs_on(*arch, device_sm)) {
                add(1, *arch, at, false, e.arch);
            } else if (e.kind == EntryKind::ptx && arch && ptx_runs_on(*arch, device_sm)) {
                add(2, *arch, at, true, e.arch);
            } else {
                held.push_back(fmt::format("{} {}", e.arch, kind_name(e.kind)));
            }
        }
        reasons.push_back(
            fmt::format("{} holds {}", name,
                        held.empty() ? "no entries" : fmt::format("{}", fmt::join(held, ", "))));
    }
}

}  // namespace

Result<Selection> select_binary(Entry& entry, int device_sm, std::string_view only_file) {
    std::vector<std::pair<std::string, BinaryInfo>> inspected;
    std::vector<std::string> reasons;
    std::vector<Candidate> candidates;
    const std::vector<const EntryFile*> files = binary_files(entry, only_file);
    for (const EntryFile* file : files) {
        const std::string_view name = file->path;
        if (std::any_of(candidates.begin(), candidates.end(),
                        [](const Candidate& c) { return c.tier == 0 && c.exact; })) {
            break;
        }
        auto bytes = KCACHE_TRY(entry.read(name));
        auto info = inspect(bytes);
        if (!info) {
            reasons.push_back(fmt::format("{}: {}", name, info.error().message));
            continue;
        }
        add_candidates(*info, name, inspected.size(), device_sm, candidates, reasons);
        inspected.emplace_back(std::string(name), std::move(*info));
    }
    if (candidates.empty()) {
        std::string what;
        if (reasons.empty()) {
            what = only_file.empty() ? "it has no .cubin, .fatbin or .ptx file"
                                     : fmt::format("it has no file {}", only_file);
        } else {
            what = fmt::format("{}", fmt::join(reasons, "; "));
        }
        return fail(ENXIO, fmt::format("entry {}: no binary for this GPU ({}): {}", entry.key(),
                                       sm_name(device_sm), what));
    }
    const auto best = std::min_element(
        candidates.begin(), candidates.end(),
        [](const Candidate& a, const Candidate& b) { return a.rank() < b.rank(); });
    Selection selection;
    selection.file = inspected[best->file].first;
    selection.info = std::move(inspected[best->file].second);
    selection.format = selection.info.format;
    selection.arch = best->arch;
    selection.jit = best->jit;
    selection.fatbin_entry = best->fatbin_entry;
    return selection;
}

Result<Signature> find_signature(Entry& entry, std::string_view preferred_stem) {
    std::vector<const EntryFile*> files;
    for (const auto& file : entry.files()) {
        if (file.role == core::Role::signature) files.push_back(&file);
    }
    std::stable_partition(files.begin(), files.end(), [&](const EntryFile* f) {
        return !preferred_stem.empty() && stem(f->path) == preferred_stem;
    });
    std::vector<std::string> skipped;
    for (const EntryFile* file : files) {
        auto bytes = KCACHE_TRY(entry.read(file->path));
        auto signature = parse_signature(bytes);
        if (signature) return signature;
        if (signature.error().code != ENOEXEC) {
            return tl::unexpected(core::with_context(
                signature.error(), fmt::format("entry {}: {}", entry.key(), file->path)));
        }
        skipped.push_back(fmt::format("{}: {}", file->path, signature.error().message));
    }
    if (skipped.empty()) {
        return fail(ENOENT, fmt::format("entry {} has no signature file", entry.key()));
    }
    return fail(ENOENT, fmt::format("entry {} has no signature ({})", entry.key(),
                                    fmt::join(skipped, "; ")));
}

}  // namespace kcache::loader
