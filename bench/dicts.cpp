// kcache-bench-dicts DIR: stored/raw by file kind without and with trained
// dictionaries (core/include/kcache/core/dictionaries.hpp), on a real cache tree DIR
// (bench/triton_corpus.py writes one), one entry per top-level item, and the speed of
// reading every file back (decompression) in both forms, from the same db in the same
// run.
//
//   1. import all of DIR into a fresh db: per-file zstd, no dictionary ("before");
//      read every file back, `rounds` times;
//   2. `kcache gc`'s part (recompress_blobs): train, rewrite ("after", in-sample);
//      read every file back again;
//   3. held out: a fresh db imports the first half of DIR's entries, trains, then
//      imports the second half, whose new blobs use the dictionaries: that half's
//      stored/raw is what a cache that already trained gets for new kernels.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_support.hpp"
#include "kcache/core/dictionaries.hpp"
#include "kcache/core/entry_files.hpp"
#include "kcache/core/maintenance.hpp"

#ifndef KCACHE_BENCH_BUILD_TYPE
#define KCACHE_BENCH_BUILD_TYPE "unknown"
#endif

namespace core = kcache::core;
namespace fs = std::filesystem;
using namespace kcache::bench;

namespace {

std::unique_ptr<core::Store> open_db(const fs::path& path) {
    core::OpenOptions options;
    options.path = path.string();
    options.durability = core::Durability::none;
    return must(core::Store::open(options), "open " + options.path);
}

// Imports `items`, one write transaction each; returns the inodes of the files.
std::vector<core::Ino> import_items(core::Store& store, const std::vector<fs::path>& items) {
    const core::Origin origin = core::Origin::current();
    std::vector<core::Ino> files;
    for (const fs::path& item : items) {
        auto txn = must(store.write(), "write txn");
        import_tree(txn, core::kRootIno, item, origin);
        must(txn.commit(), "commit " + item.string());
    }
    auto txn = must(store.read(), "read txn");
    must(core::walk_below(txn, core::kRootIno,
                          [&](const core::EntryFile& f) {
                              if (f.attr.is_regular()) files.push_back(f.attr.ino);
                              return core::Walk::next;
                          }),
         "list files");
    return files;
}

std::map<std::string, core::KindStats> kinds_of(const core::Store& store) {
    auto txn = must(store.read(), "read txn");
    std::map<std::string, core::KindStats> out;
    for (auto& k : must(core::kind_stats(txn), "kind stats")) out[k.name] = k;
    return out;
}

double ratio(std::uint64_t stored, std::uint64_t raw) {
    return raw ? static_cast<double>(stored) / static_cast<double>(raw) : 0.0;
}

// Reads every file `rounds` times in one snapshot; returns raw MB/s.
double read_speed(const core::Store& store, const std::vector<core::Ino>& files, int rounds) {
    auto txn = must(store.read(), "read txn");
    std::uint64_t bytes = 0;
    const auto t0 = SteadyClock::now();
    for (int r = 0; r < rounds; ++r) {
        for (const core::Ino ino : files) bytes += must(txn.read(ino), "read").bytes().size();
    }
    return static_cast<double>(bytes) / 1e6 / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || argc > 5) {
        std::fprintf(stderr,
                     "usage: kcache-bench-dicts DIR [read rounds, default 20] "
                     "[sample share] [max dictionary bytes]\n");
        return 2;
    }
    const fs::path src = argv[1];
    const int rounds = argc >= 3 ? std::max(1, std::atoi(argv[2])) : 20;
    core::DictionaryPolicy policy;  // the defaults, or what the command line says
    if (argc >= 4) policy.sample_share = std::strtoull(argv[3], nullptr, 10);
    if (argc >= 5) policy.max_dictionary_bytes = std::strtoull(argv[4], nullptr, 10);
    std::vector<fs::path> items;
    for (const fs::path& item : sorted_children(src)) {
        if (fs::is_directory(item) || fs::is_regular_file(item)) items.push_back(item);
    }
    TempDir tmp("kcache-bench-dicts");
    std::printf(
        "kcache-bench-dicts (build %s): %s, %zu entries; dictionaries of at most 1/%llu "
        "of their samples and %llu bytes\n",
        KCACHE_BENCH_BUILD_TYPE, src.c_str(), items.size(),
        static_cast<unsigned long long>(policy.sample_share),
        static_cast<unsigned long long>(policy.max_dictionary_bytes));

    // 1 and 2: the whole tree, before and after.
    auto store = open_db(tmp / "all");
    const std::vector<core::Ino> files = import_items(*store, items);
    const auto before = kinds_of(*store);
    const std::uint64_t stored_before = gauge(*store, core::Counter::stored_bytes);
    const std::uint64_t raw = gauge(*store, core::Counter::bytes);
    // Alternated, the median of 5 each: the two forms see the same machine.
    std::vector<double> speed_before, speed_after;
    speed_before.push_back(read_speed(*store, files, rounds));
    const core::RecompressReport report =
        must(core::recompress_blobs(*store, policy), "recompress");
    const auto after = kinds_of(*store);
    const std::uint64_t stored_after = gauge(*store, core::Counter::stored_bytes);
    std::uint64_t dictionaries = 0;
    for (const auto& [name, k] : after) dictionaries += k.dictionaries_footprint;
    speed_after.push_back(read_speed(*store, files, rounds));
    auto verified = must(core::verify(*store), "verify");
    if (!verified.ok()) {
        std::fprintf(stderr, "verify after gc: %s\n", verified.problems.front().c_str());
        return 1;
    }

    // The "before" form again, for the alternation: a copy of the tree without training.
    auto plain = open_db(tmp / "plain");
    const std::vector<core::Ino> plain_files = import_items(*plain, items);
    for (int i = 0; i < 4; ++i) {
        speed_before.push_back(read_speed(*plain, plain_files, rounds));
        speed_after.push_back(read_speed(*store, files, rounds));
    }

    // 3: held out.
    auto held = open_db(tmp / "held");
    const std::vector<fs::path> first(items.begin(), items.begin() + items.size() / 2);
    const std::vector<fs::path> second(items.begin() + items.size() / 2, items.end());
    import_items(*held, first);
    const auto trained = must(core::train_dictionaries(*held, policy), "train");
    const auto half = kinds_of(*held);
    import_items(*held, second);
    const auto full = kinds_of(*held);

    std::printf("\n%-22s %6s %10s %8s %8s %8s %10s\n", "kind", "blobs", "raw", "before", "after",
                "held-out", "dictionary");
    std::uint64_t held_raw = 0, held_stored = 0;
    for (const auto& [name, b] : before) {
        const core::KindStats a = after.count(name) ? after.at(name) : core::KindStats{};
        const core::KindStats h0 = half.count(name) ? half.at(name) : core::KindStats{};
        const core::KindStats h1 = full.count(name) ? full.at(name) : core::KindStats{};
        const std::uint64_t hr = h1.raw_bytes - h0.raw_bytes,
                            hs = h1.stored_bytes - h0.stored_bytes;
        held_raw += hr;
        held_stored += hs;
        std::printf("%-22s %6llu %10llu %8.3f %8.3f %8.3f %10llu\n", name.c_str(),
                    static_cast<unsigned long long>(b.blobs),
                    static_cast<unsigned long long>(b.raw_bytes),
                    ratio(b.stored_bytes, b.raw_bytes), ratio(a.stored_bytes, a.raw_bytes),
                    ratio(hs, hr), static_cast<unsigned long long>(a.dictionary_bytes));
    }
    std::printf("\nall files: raw %s\n", human_bytes(raw).c_str());
    std::printf("  before: stored %s, stored/raw %.3f\n", human_bytes(stored_before).c_str(),
                ratio(stored_before, raw));
    std::printf(
        "  after gc: stored %s + dictionaries %s, stored/raw %.3f (%.3f without the "
        "dictionaries); %llu blobs rewritten\n",
        human_bytes(stored_after).c_str(), human_bytes(dictionaries).c_str(),
        ratio(stored_after + dictionaries, raw), ratio(stored_after, raw),
        static_cast<unsigned long long>(report.rewritten));
    std::uint64_t held_dicts = 0;
    for (const auto& t : trained) held_dicts += t.id ? t.bytes : 0;
    std::printf(
        "  held out (trained on the first %zu entries, %s of dictionaries): the other "
        "%zu entries' new blobs stored/raw %.3f\n",
        first.size(), human_bytes(held_dicts).c_str(), second.size(), ratio(held_stored, held_raw));
    std::sort(speed_before.begin(), speed_before.end());
    std::sort(speed_after.begin(), speed_after.end());
    std::printf("\nreading every file back (%d rounds, median of 5 alternated runs):\n", rounds);
    std::printf("  no dictionary   %8.1f MB/s (raw bytes)\n", speed_before[2]);
    std::printf("  dictionaries    %8.1f MB/s  (%.2fx)\n", speed_after[2],
                speed_after[2] / speed_before[2]);
    return 0;
}
