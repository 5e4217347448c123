// kcache-bench-store-dir DIR DB: imports a directory tree into a db through the core
// API, one entry per top-level item of DIR (a kernel/config directory, or a flat
// file), one write transaction per entry, then prints raw bytes, stored bytes, the
// compression ratio and the blob count (dedup).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_support.hpp"

#ifndef KCACHE_BENCH_BUILD_TYPE
#define KCACHE_BENCH_BUILD_TYPE "unknown"
#endif

namespace core = kcache::core;
namespace fs = std::filesystem;
using namespace kcache::bench;

namespace {

struct Totals {
    std::uint64_t files = 0;
    std::uint64_t bytes = 0;
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_ext;  // files, bytes
    void add(const fs::path& path, std::string_view content) {
        ++files;
        bytes += content.size();
        const std::string name = path.filename().string();
        auto& ext = by_ext[path.extension().empty() ? name : path.extension().string()];
        ++ext.first;
        ext.second += content.size();
    }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3 || argc > 4) {
        std::fprintf(stderr, "usage: kcache-bench-store-dir DIR DB [full|no_meta_sync|none]\n");
        return 2;
    }
    const fs::path src = argv[1];
    core::OpenOptions options;
    options.path = argv[2];
    options.durability = argc == 4 ? parse_durability(argv[3]) : core::Durability::full;
    auto store = must(core::Store::open(options), std::string("open ") + options.path);
    const core::Origin origin = core::Origin::current();

    Totals totals;
    std::uint64_t entries = 0;
    const auto t0 = SteadyClock::now();
    for (const fs::path& item : sorted_children(src)) {
        if (fs::is_symlink(item)) continue;
        if (!fs::is_directory(item) && !fs::is_regular_file(item)) continue;
        auto txn = must(store->write(), "write txn");
        import_tree(
            txn, core::kRootIno, item, origin,
            [&](const fs::path& path, std::string_view content) { totals.add(path, content); });
        must(txn.commit(), "commit " + item.string());
        ++entries;
    }
    const double seconds = seconds_since(t0);

    auto txn = must(store->read(), "read txn");
    const core::Stats stats = must(txn.stats(), "stats");
    const std::uint64_t stored = stats.get(core::Counter::stored_bytes);
    const std::uint64_t blob_raw = stats.get(core::Counter::blob_raw_bytes);
    const std::uint64_t blobs = stats.get(core::Counter::blobs);
    const std::uint64_t files = stats.get(core::Counter::files);
    std::printf("kcache-bench-store-dir (build %s)\n", KCACHE_BENCH_BUILD_TYPE);
    std::printf("imported %s into %s: %llu entries, %llu files in %.3f s (durability %s)\n",
                src.c_str(), options.path.c_str(), static_cast<unsigned long long>(entries),
                static_cast<unsigned long long>(totals.files), seconds,
                std::string(durability_name(options.durability)).c_str());
    std::printf("by extension (files, raw bytes):\n");
    for (const auto& [ext, v] : totals.by_ext) {
        std::printf("  %-10s %5llu  %s\n", ext.c_str(), static_cast<unsigned long long>(v.first),
                    human_bytes(v.second).c_str());
    }
    std::printf("raw bytes          %12llu  (%s)\n", static_cast<unsigned long long>(totals.bytes),
                human_bytes(totals.bytes).c_str());
    std::printf("bytes gauge        %12llu\n",
                static_cast<unsigned long long>(stats.get(core::Counter::bytes)));
    std::printf("blob_raw_bytes     %12llu  (after dedup, before compression)\n",
                static_cast<unsigned long long>(blob_raw));
    std::printf("stored_bytes       %12llu  (%s; after dedup and compression)\n",
                static_cast<unsigned long long>(stored), human_bytes(stored).c_str());
    std::printf("ratio raw/stored   %12.2fx  (dedup %.2fx x compression %.2fx)\n",
                stored ? static_cast<double>(totals.bytes) / static_cast<double>(stored) : 0.0,
                blob_raw ? static_cast<double>(totals.bytes) / static_cast<double>(blob_raw) : 0.0,
                stored ? static_cast<double>(blob_raw) / static_cast<double>(stored) : 0.0);
    std::printf("files / blobs      %12llu / %llu  (%llu files share content; dedup_hits %llu)\n",
                static_cast<unsigned long long>(files), static_cast<unsigned long long>(blobs),
                static_cast<unsigned long long>(files > blobs ? files - blobs : 0),
                static_cast<unsigned long long>(stats.get(core::Counter::dedup_hits)));
    std::printf("data.mdb           %12llu  (%s)\n",
                static_cast<unsigned long long>(store->data_file_bytes()),
                human_bytes(store->data_file_bytes()).c_str());
    return 0;
}
