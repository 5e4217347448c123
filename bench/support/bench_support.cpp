#include "bench_support.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
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

}  // namespace kcache::bench
