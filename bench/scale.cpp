// kcache-bench-scale: stores many realistic entries through the core API and prints
// store rate, Txn::stats time as the db grows, eviction rate and file size; with
// --churn, fills a size-bounded cache, evicts to half and refills, round after round,
// printing data.mdb's size (which must stop growing).
//
// Figures only: nothing asserts. A line starting with "FINDING:" marks a result that
// contradicts what the design promises.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench_support.hpp"
#include "kcache/core/units.hpp"

#ifndef KCACHE_BENCH_BUILD_TYPE
#define KCACHE_BENCH_BUILD_TYPE "unknown"
#endif

namespace core = kcache::core;
using namespace kcache::bench;

namespace {

struct Options {
    std::uint64_t entries = 100000;
    std::string db;
    std::uint64_t batch = 64;
    std::string durability = "full";
    std::uint64_t stats_calls = 1001;
    std::uint64_t churn_rounds = 0;  // 0: scale mode
    std::string bound = "128M";
    bool keep = false;
};

// The three files of one entry, distinct content per entry number.
struct EntryFiles {
    std::string cubin, json, ptx;
    explicit EntryFiles(std::uint64_t n)
        : cubin(make_cubin(n, 8192)), json(make_json(n, 1024)), ptx(make_ptx(n, 16384)) {}
    std::array<FileSpec, 3> specs() const {
        return {FileSpec{"kernel.cubin", cubin}, FileSpec{"kernel.json", json},
                FileSpec{"kernel.ptx", ptx}};
    }
    std::uint64_t bytes() const { return cubin.size() + json.size() + ptx.size(); }
};

constexpr double kMiB = 1024.0 * 1024.0;

// Stores entries [first, first + count) in one write transaction. Content is built
// before the transaction; only the transaction is timed (returned in seconds).
struct BatchResult {
    double seconds = 0;
    double gen_seconds = 0;
    std::uint64_t bytes = 0;
};
BatchResult store_batch(core::Store& store, std::uint64_t first, std::uint64_t count,
                        const core::Origin& origin) {
    BatchResult r;
    auto g0 = SteadyClock::now();
    std::vector<EntryFiles> batch;
    std::vector<std::string> names;
    batch.reserve(count);
    for (std::uint64_t n = first; n < first + count; ++n) {
        batch.emplace_back(n);
        names.push_back(entry_name(n));
        r.bytes += batch.back().bytes();
    }
    r.gen_seconds = seconds_since(g0);
    auto t0 = SteadyClock::now();
    auto txn = must(store.write(), "write txn");
    for (std::size_t i = 0; i < batch.size(); ++i) {
        const auto specs = batch[i].specs();
        must(put_entry(txn, names[i], specs, origin), "store entry " + names[i]);
    }
    must(txn.commit(), "commit");
    r.seconds = seconds_since(t0);
    return r;
}

struct StatsTiming {
    double median_us = 0, p90_us = 0, max_us = 0;
    std::size_t calls = 0;
};
// `with_txn`: time Store::read() + Txn::stats(); otherwise Txn::stats() alone in one
// snapshot. At most `calls` calls and about two seconds.
StatsTiming time_stats(const core::Store& store, std::uint64_t calls, bool with_txn) {
    std::vector<double> us;
    us.reserve(calls);
    std::optional<core::ReadTxn> snapshot;
    if (!with_txn) snapshot.emplace(must(store.read(), "read txn"));
    const auto start = SteadyClock::now();
    for (std::uint64_t i = 0; i < calls && seconds_since(start) < 2.0; ++i) {
        const auto t0 = SteadyClock::now();
        if (with_txn) {
            auto txn = must(store.read(), "read txn");
            auto s = must(txn.stats(), "stats");
            if (s.values.empty()) std::printf("(empty stats)\n");
        } else {
            auto s = must(snapshot->stats(), "stats");
            if (s.values.empty()) std::printf("(empty stats)\n");
        }
        us.push_back(seconds_since(t0) * 1e6);
    }
    StatsTiming t;
    t.calls = us.size();
    t.median_us = median(us);  // sorts
    t.p90_us = quantile_sorted(us, 0.9);
    t.max_us = us.empty() ? 0 : us.back();
    return t;
}

struct Gauges {
    std::uint64_t entries = 0, files = 0, bytes = 0, stored_bytes = 0, blobs = 0, blob_raw = 0;
};
Gauges read_gauges(const core::Store& store) {
    auto txn = must(store.read(), "read txn");
    auto s = must(txn.stats(), "stats");
    Gauges g;
    g.entries = s.get(core::Counter::entries);
    g.files = s.get(core::Counter::files);
    g.bytes = s.get(core::Counter::bytes);
    g.stored_bytes = s.get(core::Counter::stored_bytes);
    g.blobs = s.get(core::Counter::blobs);
    g.blob_raw = s.get(core::Counter::blob_raw_bytes);
    return g;
}
void print_gauges(const char* indent, const Gauges& g) {
    std::printf(
        "%sgauges: entries %llu, files %llu, bytes %s, stored_bytes %s, blobs %llu, "
        "blob_raw_bytes %s\n",
        indent, static_cast<unsigned long long>(g.entries),
        static_cast<unsigned long long>(g.files), human_bytes(g.bytes).c_str(),
        human_bytes(g.stored_bytes).c_str(), static_cast<unsigned long long>(g.blobs),
        human_bytes(g.blob_raw).c_str());
}

std::unique_ptr<core::Store> open_store(const std::string& path, core::Durability durability) {
    core::OpenOptions options;
    options.path = path;
    options.durability = durability;
    return must(core::Store::open(options), "open " + path);
}

// ------------------------------------------------------------------ scale mode

int run_scale(const Options& opt, const std::string& db_path, core::Durability durability) {
    auto store = open_store(db_path, durability);
    const core::Origin origin = core::Origin::current();
    std::printf(
        "store: %llu entries x 3 files (kernel.cubin 8 KiB, kernel.json 1 KiB, "
        "kernel.ptx 16 KiB = 25 KiB/entry), batch size %llu entries per transaction, "
        "durability %s\n\n",
        static_cast<unsigned long long>(opt.entries), static_cast<unsigned long long>(opt.batch),
        std::string(durability_name(durability)).c_str());

    std::vector<std::uint64_t> checkpoints;
    for (std::uint64_t c : {1000ull, 10000ull, 100000ull, 1000000ull}) {
        if (c < opt.entries) checkpoints.push_back(c);
    }
    checkpoints.push_back(opt.entries);

    std::printf("%10s %12s %10s %9s | %12s %10s | %16s %16s | %10s\n", "entries", "seg entries/s",
                "files/s", "MiB/s", "cum entries/s", "cum MiB/s", "stats med/p90 us",
                "read+stats med us", "data.mdb");
    double total_s = 0, gen_s = 0;
    std::uint64_t total_bytes = 0;
    std::uint64_t done = 0;
    for (std::uint64_t checkpoint : checkpoints) {
        double seg_s = 0;
        std::uint64_t seg_bytes = 0;
        const std::uint64_t seg_first = done;
        while (done < checkpoint) {
            const std::uint64_t count = std::min(opt.batch, checkpoint - done);
            const BatchResult r = store_batch(*store, done, count, origin);
            seg_s += r.seconds;
            gen_s += r.gen_seconds;
            seg_bytes += r.bytes;
            done += count;
        }
        total_s += seg_s;
        total_bytes += seg_bytes;
        const double seg_entries = static_cast<double>(done - seg_first);
        const StatsTiming st = time_stats(*store, opt.stats_calls, false);
        const StatsTiming rst = time_stats(*store, opt.stats_calls, true);
        std::printf("%10llu %12.0f %10.0f %9.1f | %12.0f %10.1f | %7.2f / %6.2f %16.2f | %10s\n",
                    static_cast<unsigned long long>(done), seg_entries / seg_s,
                    3 * seg_entries / seg_s, static_cast<double>(seg_bytes) / kMiB / seg_s,
                    static_cast<double>(done) / total_s,
                    static_cast<double>(total_bytes) / kMiB / total_s, st.median_us, st.p90_us,
                    rst.median_us, human_bytes(store->data_file_bytes()).c_str());
        std::fflush(stdout);
    }
    std::printf(
        "\nstore total: %llu entries, %llu files, %s raw in %.2f s (transactions only; "
        "content generation %.2f s excluded)\n",
        static_cast<unsigned long long>(done), static_cast<unsigned long long>(3 * done),
        human_bytes(total_bytes).c_str(), total_s, gen_s);
    std::printf("store rate: %.0f entries/s, %.0f files/s, %.1f MiB/s\n",
                static_cast<double>(done) / total_s, 3 * static_cast<double>(done) / total_s,
                static_cast<double>(total_bytes) / kMiB / total_s);
    if (durability != core::Durability::full) {
        auto t0 = SteadyClock::now();
        must(store->sync(), "sync");
        std::printf("Store::sync after the run: %.3f s\n", seconds_since(t0));
    }

    // Sizes: the file against what was written and against the gauges.
    const Gauges g = read_gauges(*store);
    const std::uint64_t file_bytes = store->data_file_bytes();
    std::printf("\nsize:\n");
    print_gauges("  ", g);
    std::printf("  raw bytes written        %s\n", human_bytes(total_bytes).c_str());
    std::printf("  stored_bytes gauge       %s  (raw/stored = %.2fx)\n",
                human_bytes(g.stored_bytes).c_str(),
                g.stored_bytes
                    ? static_cast<double>(total_bytes) / static_cast<double>(g.stored_bytes)
                    : 0.0);
    std::printf(
        "  data.mdb                 %s  (data.mdb/raw = %.2f, data.mdb/stored_bytes = %.2f)\n",
        human_bytes(file_bytes).c_str(),
        static_cast<double>(file_bytes) / static_cast<double>(total_bytes),
        g.stored_bytes ? static_cast<double>(file_bytes) / static_cast<double>(g.stored_bytes)
                       : 0.0);
    if (g.bytes != total_bytes) {
        std::printf("FINDING: bytes gauge %llu != raw bytes written %llu\n",
                    static_cast<unsigned long long>(g.bytes),
                    static_cast<unsigned long long>(total_bytes));
    }
    if (g.entries != done || g.files != 3 * done) {
        std::printf("FINDING: gauges entries %llu / files %llu, expected %llu / %llu\n",
                    static_cast<unsigned long long>(g.entries),
                    static_cast<unsigned long long>(g.files), static_cast<unsigned long long>(done),
                    static_cast<unsigned long long>(3 * done));
    }

    // Eviction down to half the stored bytes.
    core::EvictRequest request;
    request.max_bytes = g.stored_bytes / 2;
    std::printf("\nevict: Store::evict(max_bytes = stored_bytes/2 = %s)\n",
                human_bytes(*request.max_bytes).c_str());
    auto t0 = SteadyClock::now();
    const core::EvictReport rep = must(store->evict(request), "evict");
    const double evict_s = seconds_since(t0);
    std::printf(
        "  evicted %llu entries (%s logical, %s stored freed) in %.3f s: %.0f entries/s, "
        "%.1f MiB/s logical; satisfied=%s, skipped_in_flight=%llu\n",
        static_cast<unsigned long long>(rep.entries), human_bytes(rep.bytes).c_str(),
        human_bytes(rep.stored_bytes_freed).c_str(), evict_s,
        static_cast<double>(rep.entries) / evict_s, static_cast<double>(rep.bytes) / kMiB / evict_s,
        rep.satisfied ? "yes" : "no", static_cast<unsigned long long>(rep.skipped_in_flight));
    const Gauges after = read_gauges(*store);
    print_gauges("  after ", after);
    std::printf(
        "  data.mdb after eviction  %s (LMDB keeps freed pages for reuse; it does not shrink)\n",
        human_bytes(store->data_file_bytes()).c_str());
    if (after.stored_bytes > *request.max_bytes) {
        std::printf("FINDING: stored_bytes %llu still above the requested %llu after evict\n",
                    static_cast<unsigned long long>(after.stored_bytes),
                    static_cast<unsigned long long>(*request.max_bytes));
    }
    const StatsTiming st = time_stats(*store, opt.stats_calls, false);
    std::printf("  Txn::stats after eviction (%llu entries): median %.2f us\n",
                static_cast<unsigned long long>(after.entries), st.median_us);
    return 0;
}

// ------------------------------------------------------------------ churn mode

int run_churn(const Options& opt, const std::string& db_path, core::Durability durability) {
    auto bound_r = core::parse_size(opt.bound);
    if (!bound_r) {
        std::fprintf(stderr, "--bound: %s\n", bound_r.error().message.c_str());
        return 2;
    }
    const std::uint64_t bound = *bound_r;
    auto store = open_store(db_path, durability);
    const core::Origin origin = core::Origin::current();
    must(store->update([&](core::WriteTxn& txn) -> core::Status {
        core::Config config = txn.config();
        config.max_bytes = bound;
        config.low_mark_percent = 50;
        return txn.set_config(config);
    }),
         "set_config");
    std::printf(
        "churn: %llu rounds, bound %s on stored_bytes (Config::max_bytes, low mark 50%%), "
        "entries of 3 files (25 KiB raw), batch size %llu, durability %s\n"
        "each round: fill until stored_bytes >= bound, then Store::enforce_limits() "
        "(down to the 50%% low mark)\n\n",
        static_cast<unsigned long long>(opt.churn_rounds), human_bytes(bound).c_str(),
        static_cast<unsigned long long>(opt.batch),
        std::string(durability_name(durability)).c_str());
    std::printf("%5s %9s %12s %9s %12s %9s %11s %12s %12s %12s\n", "round", "added", "added/s",
                "evicted", "evicted/s", "entries", "stored", "mdb@full", "mdb@evicted", "growth");

    std::uint64_t next = 0;
    std::vector<std::uint64_t> sizes;  // data.mdb at the end of each round
    for (std::uint64_t round = 1; round <= opt.churn_rounds; ++round) {
        std::uint64_t added = 0;
        double fill_s = 0;
        while (true) {
            const Gauges g = read_gauges(*store);
            if (g.stored_bytes >= bound) break;
            const BatchResult r = store_batch(*store, next, opt.batch, origin);
            next += opt.batch;
            added += opt.batch;
            fill_s += r.seconds;
        }
        const std::uint64_t at_full = store->data_file_bytes();
        auto t0 = SteadyClock::now();
        core::EvictReport rep = must(store->enforce_limits(), "enforce_limits");
        double evict_s = seconds_since(t0);
        if (rep.entries == 0) {
            std::printf(
                "FINDING: enforce_limits() evicted nothing with stored_bytes >= bound; "
                "falling back to Store::evict(max_bytes = bound/2)\n");
            core::EvictRequest request;
            request.max_bytes = bound / 2;
            t0 = SteadyClock::now();
            rep = must(store->evict(request), "evict");
            evict_s = seconds_since(t0);
        }
        const Gauges g = read_gauges(*store);
        const std::uint64_t at_evicted = store->data_file_bytes();
        const std::string growth =
            sizes.empty()
                ? std::string("-")
                : fmt::format(
                      "{:+.1f} MiB",
                      (static_cast<double>(at_evicted) - static_cast<double>(sizes.back())) / kMiB);
        sizes.push_back(at_evicted);  // end of the round (eviction itself allocates pages)
        std::printf("%5llu %9llu %12.0f %9llu %12.0f %9llu %11s %12s %12s %12s\n",
                    static_cast<unsigned long long>(round), static_cast<unsigned long long>(added),
                    fill_s > 0 ? static_cast<double>(added) / fill_s : 0.0,
                    static_cast<unsigned long long>(rep.entries),
                    evict_s > 0 ? static_cast<double>(rep.entries) / evict_s : 0.0,
                    static_cast<unsigned long long>(g.entries), human_bytes(g.stored_bytes).c_str(),
                    human_bytes(at_full).c_str(), human_bytes(at_evicted).c_str(), growth.c_str());
        std::fflush(stdout);
    }

    // Growth after the first rounds: the size at the end of the last round against
    // round 3's (or the first one's with fewer rounds), and the mean growth of the
    // last three rounds. Flat: the last rounds grow by at most 0.1% of the file each.
    if (sizes.size() >= 2) {
        const std::size_t n = sizes.size();
        const std::size_t ref = std::min<std::size_t>(2, n - 2);
        const double first = static_cast<double>(sizes[ref]);
        const double last = static_cast<double>(sizes.back());
        const std::size_t tail_rounds = std::min<std::size_t>(3, n - 1);
        const double tail = (last - static_cast<double>(sizes[n - 1 - tail_rounds])) /
                            static_cast<double>(tail_rounds);
        const double early = static_cast<double>(sizes[1]) - static_cast<double>(sizes[0]);
        std::printf(
            "\ndata.mdb: %s after round %zu, %s after round %zu (%+.1f%%); growth per round: "
            "%+.2f MiB in round 2, %+.2f MiB mean over the last %zu rounds; bound %s, "
            "data.mdb/bound = %.2f\n",
            human_bytes(sizes[ref]).c_str(), ref + 1, human_bytes(sizes.back()).c_str(), n,
            100.0 * (last - first) / first, early / kMiB, tail / kMiB, tail_rounds,
            human_bytes(bound).c_str(), last / static_cast<double>(bound));
        if (tail <= 0.001 * last) {
            std::printf("data.mdb stopped growing after the first rounds (bounded under churn)\n");
        } else {
            std::printf(
                "FINDING: data.mdb still grows at round %zu under churn (fill/evict/refill): "
                "%+.2f MiB/round (%.2f%% of the file) over the last %zu rounds%s\n",
                n, tail / kMiB, 100.0 * tail / last, tail_rounds,
                tail < early / 4 ? ", slowing down" : "");
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    CLI::App app{"kcache-bench-scale: store rate, stats time, eviction and file size at scale"};
    app.add_option("--entries", opt.entries, "entries to store (3 files each)")
        ->capture_default_str();
    app.add_option("--db", opt.db,
                   "db directory (must not hold a db yet; kept afterwards); "
                   "default: a temp dir, removed");
    app.add_option("--batch", opt.batch, "entries per write transaction")->capture_default_str();
    app.add_option("--durability", opt.durability, "full | no_meta_sync | none")
        ->capture_default_str();
    app.add_option("--stats-calls", opt.stats_calls, "Txn::stats calls per measurement")
        ->capture_default_str();
    app.add_flag("--churn{10}", opt.churn_rounds,
                 "churn mode, --churn or --churn=ROUNDS (default 10): fill to --bound, evict to "
                 "half, refill, ROUNDS times");
    app.add_option("--bound", opt.bound, "churn: size bound on stored bytes (e.g. 128M, 1G)")
        ->capture_default_str();
    app.add_flag("--keep", opt.keep, "keep the temp db");
    CLI11_PARSE(app, argc, argv);
    if (opt.batch == 0 || opt.entries == 0) {
        std::fprintf(stderr, "--entries and --batch must be > 0\n");
        return 2;
    }
    const core::Durability durability = parse_durability(opt.durability);

    std::optional<TempDir> temp;
    std::string db_path = opt.db;
    if (db_path.empty()) {
        temp.emplace("kcache-bench-scale");
        db_path = (temp->path() / "db").string();
    } else if (std::filesystem::exists(std::filesystem::path(db_path) / "data.mdb")) {
        std::fprintf(stderr, "--db %s already holds a db; give a new directory\n", db_path.c_str());
        return 2;
    }
    std::printf("kcache-bench-scale (build %s), db %s\n", KCACHE_BENCH_BUILD_TYPE, db_path.c_str());
    const auto t0 = SteadyClock::now();
    const int rc = opt.churn_rounds > 0 ? run_churn(opt, db_path, durability)
                                        : run_scale(opt, db_path, durability);
    std::printf("\nwall time %.1f s\n", seconds_since(t0));
    if (temp && opt.keep) {
        std::printf("kept %s\n", db_path.c_str());
        temp->keep();
    }
    return rc;
}
