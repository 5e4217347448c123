// What explaining misses costs (core/misses.hpp), measured in one run:
//   store      N Triton-like entries (ttir, ptx, cubin, metadata json, group json: the
//              files Triton writes) stored with no classifier, then the same with a
//              thread classifying every 200 ms as kcache-fsd's classifier thread does
//              (--nice N: at that nice value, 0 as the daemon's): the ratio is what classification
//              adds to a store. With
//              --runs R the pair runs R times, in alternating order (each into a fresh
//              db), and the median ratio is printed; each db's size and LMDB's pages
//              in use (mdb_env_info's last page) say whether the classifier's
//              snapshots kept LMDB from reusing freed pages
//   classify   the classifier's own time per miss (off the request path)
//   hit        a hit (WriteTxn::record_hit, what the daemon flushes) with and without
//              classified misses in the db: the hit path runs no classifier code
// Usage: kcache-bench-misses [--entries N] [--families F] [--runs R] [--nice N] [--db-dir DIR]
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>
#include <lmdb.h>

#include "kcache/core/misses.hpp"
#include "kcache/core/store.hpp"

namespace {

using namespace kcache;
namespace fs = std::filesystem;

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

std::string key_of(std::size_t i) {
    static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    std::string k(52, 'A');
    std::size_t v = i * 2654435761u + 12345;
    for (std::size_t j = 0; j < 52; ++j) {
        k[j] = kAlphabet[v % 32];
        v = v / 32 + (j + 1) * 7919 + i;
    }
    return k;
}

std::string text(std::size_t i, std::size_t lines, const char* what) {
    std::string out;
    for (std::size_t l = 0; l < lines; ++l) {
        out += fmt::format("  %{} = {}.op %arg{}, {} : tensor<128xf32> loc(#loc{})\n", l, what,
                           l % 7, (i * 31 + l) % 997, l);
    }
    return out;
}

core::Status store_entry(core::Store& store, std::size_t i, std::size_t families) {
    const std::string name = fmt::format("kernel_{}", i % families);
    const std::string dir = "triton/" + key_of(i);
    return store.update([&](core::WriteTxn& txn) -> core::Status {
        auto d = KCACHE_TRY(txn.mkdirs(dir));
        auto put = [&](const std::string& file, const std::string& content) -> core::Status {
            auto a = KCACHE_TRY(txn.create(d, file, 0644));
            KCACHE_TRY(txn.write(a.ino, content, core::Origin::current()));
            return {};
        };
        KCACHE_TRY(put(name + ".ttir", text(i, 60, "tt")));
        KCACHE_TRY(put(name + ".ptx", text(i, 200, "ptx")));
        KCACHE_TRY(put(name + ".cubin",
                       std::string(6000, static_cast<char>('a' + i % 26)) + std::to_string(i)));
        KCACHE_TRY(
            put(name + ".json", fmt::format(R"({{"hash": "{}", "num_warps": {}, "num_stages": 3, )"
                                            R"("triton_version": "3.9.0", "name": "{}"}})",
                                            key_of(i), 4 << (i % 3), name)));
        KCACHE_TRY(put("__grp__" + name + ".json", "{\"child_paths\": {}}"));
        return {};
    });
}

std::unique_ptr<core::Store> open_fresh(const fs::path& path, core::Clock clock = {}) {
    fs::remove_all(path);
    core::OpenOptions o;
    o.path = path.string();
    o.durability = core::Durability::none;
    o.clock = std::move(clock);
    auto s = core::Store::open(o);
    if (!s) {
        std::fprintf(stderr, "open %s: %s\n", o.path.c_str(), s.error().message.c_str());
        std::exit(1);
    }
    return std::move(*s);
}

// The classifier thread's own time in classify_pending (wall and CPU), per store_run.
double g_wall = 0, g_cpu = 0;
std::size_t g_calls = 0, g_classified = 0;
double thread_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// LMDB's last page in use and the file's size: pages a long snapshot kept from reuse
// show as a larger db.
std::string pages_of(const fs::path& db) {
    MDB_env* env = nullptr;
    if (mdb_env_create(&env) != 0) return "?";
    mdb_env_set_maxdbs(env, 32);
    std::string out = "?";
    if (mdb_env_open(env, db.string().c_str(), MDB_RDONLY | MDB_NOTLS | MDB_NOLOCK, 0644) == 0) {
        MDB_envinfo info{};
        MDB_stat st{};
        mdb_env_info(env, &info);
        mdb_env_stat(env, &st);
        std::error_code ec;
        const auto bytes = fs::file_size(db / "data.mdb", ec);
        out = fmt::format("{} pages in use, data.mdb {:.1f} MiB", info.me_last_pgno + 1,
                          static_cast<double>(bytes) / (1 << 20));
    }
    mdb_env_close(env);
    return out;
}

// Stores n entries into a fresh db at `path`, with a classifier thread as the daemon's
// (own thread, nice +10, a batch every 200 ms) when `classify`: the seconds the stores took.
double store_run(const fs::path& path, std::size_t n, std::size_t families, bool classify,
                 int nice) {
    auto store = open_fresh(path, [] { return core::system_clock_ns() + 2'000'000'000; });
    if (classify) {
        g_wall = g_cpu = 0;
        g_calls = g_classified = 0;
    }
    std::atomic<bool> stop{false};
    std::thread classifier;
    if (classify) {
        classifier = std::thread([&] {
            (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
            while (!stop) {
                const double w0 = now_s(), c0 = thread_cpu_s();
                auto c = core::classify_pending(*store);
                g_wall += now_s() - w0;
                g_cpu += thread_cpu_s() - c0;
                ++g_calls;
                g_classified += c ? *c : 0;
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
            }
        });
    }
    const double t0 = now_s();
    for (std::size_t i = 0; i < n; ++i) (void)store_entry(*store, i, families);
    const double took = now_s() - t0;
    stop = true;
    if (classifier.joinable()) classifier.join();
    return took;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t n = 2000, families = 50, runs = 1;
    int nice = 0;  // the daemon's classifier thread's (fsd/src/daemon/miss_classifier.cpp)
    fs::path base = fs::temp_directory_path() / "kcache-bench-misses";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--entries") n = std::stoul(argv[i + 1]);
        if (a == "--families") families = std::stoul(argv[i + 1]);
        if (a == "--nice") nice = std::stoi(argv[i + 1]);
        if (a == "--runs") runs = std::max<std::size_t>(1, std::stoul(argv[i + 1]));
        if (a == "--db-dir") base = argv[i + 1];
    }
    std::printf(
        "kcache-bench-misses: %zu Triton-like entries (5 files each), %zu families, "
        "durability none\n",
        n, families);

    // 1. Stores with no classifier.
    auto plain = open_fresh(base / "plain");
    double t0 = now_s();
    for (std::size_t i = 0; i < n; ++i) (void)store_entry(*plain, i, families);
    const double store_alone = now_s() - t0;

    // 2. The classifier alone, over those misses (a clock past the settling time).
    plain.reset();
    core::OpenOptions o;
    o.path = (base / "plain").string();
    o.durability = core::Durability::none;
    o.clock = [] { return core::system_clock_ns() + 60'000'000'000; };
    auto later = core::Store::open(o);
    if (!later) return 1;
    t0 = now_s();
    std::size_t classified = 0;
    for (;;) {
        auto c = core::classify_pending(**later);
        if (!c || *c == 0) break;
        classified += *c;
    }
    const double classify_time = now_s() - t0;

    // 3. Stores with a classifier thread at the daemon's cadence (every 200 ms), each
    //    entry settled at once (a clock 2 s ahead) so every pass has work; against
    //    stores with none, in alternating order, `runs` times.
    later->reset();
    std::vector<double> ratios;
    double store_with = 0;
    for (std::size_t r = 0; r < runs; ++r) {
        double alone = 0, with_time = 0;
        if (r % 2 == 0) {
            alone = store_run(base / "alone", n, families, false, nice);
            with_time = store_run(base / "with", n, families, true, nice);
        } else {
            with_time = store_run(base / "with", n, families, true, nice);
            alone = store_run(base / "alone", n, families, false, nice);
        }
        ratios.push_back(with_time / alone);
        if (r == 0) store_with = with_time / alone * store_alone;  // scaled to run 1's base
        std::printf("  run %zu: store %.3f s alone, %.3f s with a classifier: %.3fx\n", r + 1,
                    alone, with_time, with_time / alone);
        std::printf("         classifier: %zu batches, %zu misses, %.0f ms wall, %.0f ms CPU\n",
                    g_calls, g_classified, g_wall * 1e3, g_cpu * 1e3);
        std::printf("         alone: %s; with: %s\n", pages_of(base / "alone").c_str(),
                    pages_of(base / "with").c_str());
        std::fflush(stdout);
    }
    std::vector<double> sorted = ratios;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.size() % 2
                              ? sorted[sorted.size() / 2]
                              : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;
    auto with =
        open_fresh(base / "with-hits", [] { return core::system_clock_ns() + 2'000'000'000; });
    for (std::size_t i = 0; i < n; ++i) (void)store_entry(*with, i, families);
    while (true) {
        auto c = core::classify_pending(*with);
        if (!c || *c == 0) break;
    }

    // 4. Hits: record_hit on entries of a db with and without classified misses.
    auto hits = [&](core::Store& store) {
        std::vector<core::Ino> entries;
        (void)(*store.read()).for_each_entry([&](const core::EntryInfo& e) {
            entries.push_back(e.ino);
            return true;
        });
        const double start = now_s();
        for (std::size_t r = 0; r < 5; ++r) {
            (void)store.update([&](core::WriteTxn& txn) -> core::Status {
                for (core::Ino e : entries) KCACHE_TRY(txn.record_hit(e));
                return {};
            });
        }
        return (now_s() - start) / static_cast<double>(5 * entries.size());
    };
    auto plain_again = open_fresh(base / "hits-plain");
    for (std::size_t i = 0; i < n; ++i) (void)store_entry(*plain_again, i, families);
    // Alternating, the best of three each: the two dbs differ only in what the
    // classifier wrote; the hit path runs none of its code.
    double hit_plain = 1e9, hit_with = 1e9;
    for (int round = 0; round < 3; ++round) {
        hit_plain = std::min(hit_plain, hits(*plain_again));
        hit_with = std::min(hit_with, hits(*with));
    }

    std::printf("  store, no classifier          %8.1f us per entry\n",
                store_alone / static_cast<double>(n) * 1e6);
    std::printf(
        "  store, classifier every 200ms %8.1f us per entry  (with/without: median %.3fx "
        "of %zu runs, %.3f-%.3f)\n",
        store_with / static_cast<double>(n) * 1e6, median, runs, sorted.front(), sorted.back());
    std::printf(
        "  classify (background)         %8.1f us per miss (%zu misses; %.1f%% of a "
        "store's time)\n",
        classify_time / static_cast<double>(classified ? classified : 1) * 1e6, classified,
        100.0 * classify_time / static_cast<double>(classified ? classified : 1) /
            (store_alone / static_cast<double>(n)));
    std::printf(
        "  record_hit                    %8.2f us without misses kept, %8.2f us with "
        "(%.3fx)\n",
        hit_plain * 1e6, hit_with * 1e6, hit_with / hit_plain);
    fs::remove_all(base);
    return 0;
}
