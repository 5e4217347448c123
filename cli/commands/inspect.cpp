// Looking inside GPU binaries: inspect-binary (the loader's offline introspection).

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/units.hpp"
#include "kcache/loader/introspect.hpp"

namespace kcache::cli {
namespace {

struct InspectOptions {
    std::string file;
    bool json = false;
};

std::string read_whole_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Failure(fmt::format("{}: {}", path, std::strerror(errno)));
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw Failure(fmt::format("{}: read failed", path));
    return bytes;
}

nlohmann::ordered_json kernels_json(const std::vector<loader::KernelInfo>& kernels) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& kernel : kernels) {
        nlohmann::ordered_json params = nlohmann::ordered_json::array();
        for (const auto& p : kernel.params) {
            params.push_back({{"index", p.index}, {"offset", p.offset}, {"size", p.size}});
        }
        list.push_back({{"name", kernel.name},
                        {"params", std::move(params)},
                        {"param_bytes", kernel.param_bytes}});
    }
    return list;
}

nlohmann::ordered_json binary_json(const std::string& file, const loader::BinaryInfo& info) {
    nlohmann::ordered_json out = {{"file", file}, {"format", loader::format_name(info.format)}};
    out["arch"] =
        info.arch.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(info.arch);
    if (!info.ptx_version.empty()) out["ptx_version"] = info.ptx_version;
    if (!info.host_section.empty()) out["host_section"] = info.host_section;
    out["kernels"] = kernels_json(info.kernels);
    nlohmann::ordered_json entries = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < info.entries.size(); ++i) {
        const auto& e = info.entries[i];
        nlohmann::ordered_json entry = {{"index", i},
                                        {"container", e.container},
                                        {"kind", loader::kind_name(e.kind)},
                                        {"arch", e.arch},
                                        {"size", e.size},
                                        {"uncompressed_size", e.uncompressed_size},
                                        {"compressed", e.compressed},
                                        {"compression", loader::compression_name(e.compression)},
                                        {"debug", e.debug}};
        if (e.kind == loader::EntryKind::unknown) entry["raw_kind"] = e.raw_kind;
        if (!e.ptx_version.empty()) entry["ptx_version"] = e.ptx_version;
        if (e.kernels) entry["kernels"] = kernels_json(*e.kernels);
        entries.push_back(std::move(entry));
    }
    out["entries"] = std::move(entries);
    return out;
}

void print_kernels(const std::vector<loader::KernelInfo>& kernels, std::string_view indent) {
    for (const auto& kernel : kernels) {
        fmt::print("{}kernel {}: {}, {} bytes\n", indent, kernel.name,
                   count(kernel.params.size(), "param", "params"), kernel.param_bytes);
        if (kernel.params.empty()) continue;
        fmt::print("{}  {:>5}  {:>6}  {:>6}\n", indent, "index", "offset", "size");
        for (const auto& p : kernel.params) {
            fmt::print("{}  {:>5}  {:>6}  {:>6}\n", indent, p.index, p.offset, p.size);
        }
    }
}

void print_human(const std::string& file, const loader::BinaryInfo& info) {
    if (info.format != loader::Format::fatbin) {
        fmt::print("{}: {} {}{}, {}\n", file, loader::format_name(info.format), info.arch,
                   info.ptx_version.empty() ? "" : fmt::format(" (PTX ISA {})", info.ptx_version),
                   count(info.kernels.size(), "kernel", "kernels"));
        print_kernels(info.kernels, "");
        return;
    }
    fmt::print("{}: fatbin{}, {}\n", file,
               info.host_section.empty() ? "" : fmt::format(" in {}", info.host_section),
               count(info.entries.size(), "entry", "entries"));
    for (std::size_t i = 0; i < info.entries.size(); ++i) {
        const auto& e = info.entries[i];
        std::string line = fmt::format("entry {}: {} {}", i, loader::kind_name(e.kind), e.arch);
        if (e.kind == loader::EntryKind::unknown) line += fmt::format(" (kind {})", e.raw_kind);
        if (!e.ptx_version.empty()) line += fmt::format(" (PTX ISA {})", e.ptx_version);
        line += fmt::format(", {}", core::format_size(e.size));
        if (e.compressed) {
            line += fmt::format(" ({}, {} uncompressed)", loader::compression_name(e.compression),
                                core::format_size(e.uncompressed_size));
        }
        if (e.debug) line += ", debug";
        if (e.kernels) line += ", " + count(e.kernels->size(), "kernel", "kernels");
        fmt::print("{}\n", line);
        if (e.kernels) print_kernels(*e.kernels, "  ");
    }
}

int run_inspect(const Cli&, const InspectOptions& opts) {
    const std::string bytes = read_whole_file(opts.file);
    const loader::BinaryInfo info = check(loader::inspect(bytes), opts.file);
    if (opts.json) {
        // Kernel names are bytes from the file: replace what is not UTF-8.
        fmt::print("{}\n",
                   binary_json(opts.file, info)
                       .dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    } else {
        print_human(opts.file, info);
    }
    return kExitOk;
}

}  // namespace

void add_inspect_commands(CLI::App& app, Cli& cli) {
    auto opts = std::make_shared<InspectOptions>();
    auto* sub = app.add_subcommand(
        "inspect-binary", "list the kernels, parameters and archs of a cubin, fatbin or PTX file");
    sub->add_option("FILE", opts->file,
                    "a cubin, PTX or fatbin file, or a host object, library "
                    "or executable with embedded device code")
        ->required();
    sub->add_flag("--json", opts->json, "print as JSON");
    on_run(sub, cli, opts, &run_inspect);
}

}  // namespace kcache::cli
