#include "bench_support.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

namespace kcache::bench {

core::Status put_entry(core::WriteTxn& txn, std::string_view entry, std::span<const FileSpec> files,
                       const core::Origin& origin, std::vector<core::Ino>* inos) {
    auto dir = txn.mkdir(core::kRootIno, entry, 0755);
    if (!dir) return tl::unexpected(dir.error());
    for (const FileSpec& f : files) {
        auto file = txn.create(dir->ino, f.name, 0644);
        if (!file) return tl::unexpected(file.error());
        auto written = txn.write(file->ino, f.content, origin);
        if (!written) return tl::unexpected(written.error());
        if (inos) inos->push_back(file->ino);
    }
    return {};
}

std::uint64_t gauge(const core::Store& store, core::Counter c) {
    auto txn = store.read();
    if (!txn) {
        std::fprintf(stderr, "read txn: %s\n", txn.error().message.c_str());
        return 0;
    }
    auto v = txn->counter(c);
    if (!v) {
        std::fprintf(stderr, "counter %u: %s\n", static_cast<unsigned>(c),
                     v.error().message.c_str());
        return 0;
    }
    return *v;
}

void die(const core::Error& error, std::string_view what) {
    std::fprintf(stderr, "fatal: %.*s: %s (errno %d)\n", static_cast<int>(what.size()), what.data(),
                 error.message.c_str(), error.code);
    std::exit(1);
}

TempDir::TempDir(std::string_view prefix) {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = fmt::format("{}/{}-XXXXXX", base && *base ? base : "/tmp", prefix);
    if (!mkdtemp(pattern.data())) {
        std::perror(("mkdtemp " + pattern).c_str());
        std::exit(1);
    }
    m_path = pattern;
}

TempDir::~TempDir() {
    if (m_path.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(m_path, ignored);
}

double median(std::vector<double>& v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double quantile_sorted(const std::vector<double>& v, double p) {
    if (v.empty()) return 0;
    const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

std::string human_bytes(std::uint64_t bytes) {
    static constexpr std::array<const char*, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes);
    std::size_t u = 0;
    while (v >= 1024 && u + 1 < kUnits.size()) {
        v /= 1024;
        ++u;
    }
    return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, kUnits[u]);
}

core::Durability parse_durability(std::string_view text) {
    if (text == "full") return core::Durability::full;
    if (text == "no_meta_sync") return core::Durability::no_meta_sync;
    if (text == "none") return core::Durability::none;
    std::fprintf(stderr, "bad durability '%.*s' (full, no_meta_sync, none)\n",
                 static_cast<int>(text.size()), text.data());
    std::exit(2);
}

std::string_view durability_name(core::Durability d) {
    switch (d) {
        case core::Durability::full:
            return "full";
        case core::Durability::no_meta_sync:
            return "no_meta_sync";
        case core::Durability::none:
            return "none";
    }
    return "?";
}

std::string read_whole(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "cannot read %s\n", path.c_str());
        std::exit(1);
    }
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

std::vector<std::filesystem::path> sorted_children(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> children;
    for (const auto& e : std::filesystem::directory_iterator(dir)) children.push_back(e.path());
    std::sort(children.begin(), children.end());
    return children;
}

void import_tree(
    core::WriteTxn& txn, core::Ino parent, const std::filesystem::path& item,
    const core::Origin& origin,
    const std::function<void(const std::filesystem::path&, std::string_view)>& on_file) {
    namespace fs = std::filesystem;
    const std::string name = item.filename().string();
    if (fs::is_symlink(item)) return;
    if (fs::is_regular_file(item)) {
        const std::string content = read_whole(item);
        const auto attr = must(txn.create(parent, name, 0644), "create " + item.string());
        must(txn.write(attr.ino, content, origin), "write " + item.string());
        if (on_file) on_file(item, content);
        return;
    }
    if (!fs::is_directory(item)) return;
    const auto attr = must(txn.mkdir(parent, name, 0755), "mkdir " + item.string());
    for (const fs::path& child : sorted_children(item)) {
        import_tree(txn, attr.ino, child, origin, on_file);
    }
}

}  // namespace kcache::bench
