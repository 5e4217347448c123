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

std::string read_whole(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "cannot read %s\n", path.c_str());
        std::exit(1);
    }
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

std::vector<fs::path> sorted_children(const fs::path& dir) {
    std::vector<fs::path> children;
    for (const auto& e : fs::directory_iterator(dir)) children.push_back(e.path());
    std::sort(children.begin(), children.end());
    return children;
}

struct Totals {
    std::uint64_t files = 0;
    std::uint64_t bytes = 0;
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_ext;  // files, bytes
};

void import_file(core::WriteTxn& txn, core::Ino parent, const fs::path& path,
                 const core::Origin& origin, Totals& totals) {
    const std::string content = read_whole(path);
    const std::string name = path.filename().string();
    const auto attr = must(txn.create(parent, name, 0644), "create " + path.string());
    must(txn.write(attr.ino, content, origin), "write " + path.string());
    ++totals.files;
    totals.bytes += content.size();
    auto& ext = totals.by_ext[path.extension().empty() ? name : path.extension().string()];
    ++ext.first;
    ext.second += content.size();
}

void import_tree(core::WriteTxn& txn, core::Ino parent, const fs::path& dir,
                 const core::Origin& origin, Totals& totals) {
    const auto attr =
        must(txn.mkdir(parent, dir.filename().string(), 0755), "mkdir " + dir.string());
    for (const fs::path& child : sorted_children(dir)) {
        if (fs::is_symlink(child)) continue;
        if (fs::is_directory(child)) {
            import_tree(txn, attr.ino, child, origin, totals);
        } else if (fs::is_regular_file(child)) {
            import_file(txn, attr.ino, child, origin, totals);
        }
    }
}

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
        auto txn = must(store->write(), "write txn");
        if (fs::is_directory(item)) {
            import_tree(txn, core::kRootIno, item, origin, totals);
        } else if (fs::is_regular_file(item)) {
            import_file(txn, core::kRootIno, item, origin, totals);
        } else {
            continue;
        }
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
