// What a store of content the db already holds costs (issue 32, item 2): since
// deduplication compares the new bytes with the stored blob's (XXH3 collisions can be
// constructed), a duplicate costs a read of the stored blob (decompressed when zstd)
// and a memcmp. For each kind and size: N stores of one content the db holds (each in
// an entry of its own, one write transaction each, durability none so that the disk
// does not hide the CPU), next to N stores of distinct contents of the same kind and
// size in the same run. Rounds alternate the two; medians are printed. Then a 16 MiB
// file rewritten in place, one segment changed each time (what it keeps is not read).
//
//   kcache-bench-dedup [rounds]     (default 5)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_support.hpp"

#ifndef KCACHE_BENCH_BUILD_TYPE
#define KCACHE_BENCH_BUILD_TYPE "unknown"
#endif

namespace core = kcache::core;
using namespace kcache::bench;

namespace {

std::string make_random(std::uint64_t seed, std::size_t size) {
    Rng rng(seed);
    std::string out(size, '\0');
    for (std::size_t i = 0; i < size; i += 8) {
        const std::uint64_t v = rng.next();
        std::memcpy(out.data() + i, &v, std::min<std::size_t>(8, size - i));
    }
    return out;
}

struct Case {
    const char* name;
    std::size_t size;
    int n;  // stores per round
    std::string (*make)(std::uint64_t, std::size_t);
};

// Seconds for storing each of `contents` as its own entry, one transaction each.
double store_all(core::Store& store, const std::vector<std::string>& contents, std::uint64_t& seq,
                 const core::Origin& origin) {
    const auto t0 = SteadyClock::now();
    for (const std::string& content : contents) {
        auto txn = must(store.write(), "write");
        const FileSpec file{"kernel.bin", content};
        must(put_entry(txn, entry_name(seq++), std::span<const FileSpec>(&file, 1), origin), "put");
        must(txn.commit(), "commit");
    }
    return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
    const std::vector<Case> cases = {
        {"cubin 8 KiB (zstd)", 8 << 10, 400,
         [](std::uint64_t s, std::size_t n) { return make_cubin(s, n); }},
        {"ptx 64 KiB (zstd)", 64 << 10, 200,
         [](std::uint64_t s, std::size_t n) { return make_ptx(s, n); }},
        {"random 64 KiB (raw)", 64 << 10, 200, make_random},
        {"ptx 512 KiB (zstd)", 512 << 10, 50,
         [](std::uint64_t s, std::size_t n) { return make_ptx(s, n); }},
        {"random 4 MiB (segments, raw)", 4 << 20, 20, make_random},
        {"ptx 4 MiB (segments, zstd)", 4 << 20, 20,
         [](std::uint64_t s, std::size_t n) { return make_ptx(s, n); }},
    };
    fmt::print("kcache-bench-dedup: build {}, {} rounds, durability none\n",
               KCACHE_BENCH_BUILD_TYPE, rounds);
    fmt::print("{:<30} {:>6} {:>16} {:>16} {:>8}\n", "content", "n", "duplicate us", "distinct us",
               "dup/new");
    TempDir dir("kcache-bench-dedup");
    const core::Origin origin = core::Origin::current();
    std::uint64_t db = 0;
    for (const Case& c : cases) {
        core::OpenOptions options;
        options.path = (dir / fmt::format("db{}", db++)).string();
        options.durability = core::Durability::none;
        auto store = must(core::Store::open(options), "open");
        std::uint64_t seq = 0, seed = 1;
        const std::string original = c.make(seed++, c.size);
        store_all(*store, {original}, seq, origin);
        const std::vector<std::string> duplicates(static_cast<std::size_t>(c.n), original);
        std::vector<double> dup, fresh;
        for (int r = 0; r < rounds; ++r) {
            std::vector<std::string> distinct;
            for (int i = 0; i < c.n; ++i) distinct.push_back(c.make(seed++, c.size));
            dup.push_back(store_all(*store, duplicates, seq, origin) / c.n);
            fresh.push_back(store_all(*store, distinct, seq, origin) / c.n);
        }
        const double d = median(dup) * 1e6, f = median(fresh) * 1e6;
        fmt::print("{:<30} {:>6} {:>16.1f} {:>16.1f} {:>8.2f}\n", c.name, c.n, d, f, d / f);
        std::fflush(stdout);
    }

    // A big file rewritten in place (a few pages of a .so or a SQLite db): the
    // segments it keeps are the file's own and are not read back.
    {
        core::OpenOptions options;
        options.path = (dir / "rewrite").string();
        options.durability = core::Durability::none;
        auto store = must(core::Store::open(options), "open");
        std::string content = make_ptx(7, 16 << 20);
        std::uint64_t seq = 0;
        store_all(*store, {content}, seq, origin);
        core::Ino file = 0;
        {
            auto txn = must(store->read(), "read");
            file = must(txn.resolve(entry_name(0) + "/kernel.bin"), "resolve");
        }
        constexpr int kRewrites = 20;
        std::vector<double> times;
        for (int r = 0; r < rounds; ++r) {
            const auto t0 = SteadyClock::now();
            for (int i = 0; i < kRewrites; ++i) {
                content[static_cast<std::size_t>(r * kRewrites + i) * 65536 % content.size()] ^= 1;
                auto txn = must(store->write(), "write");
                must(txn.write(file, content, origin), "rewrite");
                must(txn.commit(), "commit");
            }
            times.push_back(seconds_since(t0) / kRewrites);
        }
        fmt::print("{:<30} {:>6} {:>16.1f} us per rewrite (one 64 KiB segment changed)\n",
                   "ptx 16 MiB, rewritten", kRewrites, median(times) * 1e6);
    }
    return 0;
}
