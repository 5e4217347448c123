// kcache-bench-inspector: figures for the inspector's model on a large db, and the
// dbs to take them on. Figures only: nothing asserts (bench/inspector.sh adds the
// frame times of the real program under Xvfb).
//
//   fill --db DIR [--entries N]   N synthetic entries (kernel.cubin + kernel.json, a
//                                 duplicate binary every 50th, hits on 5%), written in
//                                 large transactions without syncing
//   measure --db DIR              model load time and memory, sort, filter, refresh,
//                                 duplicates scan (each waited for: the worker's cost)
//   frames --db DIR [--sync]      per-frame times of the view (headless: refresh, read
//                                 the rows a table shows) at 60 Hz while the worker
//                                 reloads, sorts, filters, scans duplicates; max, p99.
//                                 --sync waits for each inside the frame, as the
//                                 single-threaded model did (the "before")
//   demo --tree DIR --db DIR      a db for screenshots: every top-level directory of
//                                 DIR (e.g. real_kernels.sh --keep's cache/) becomes an
//                                 entry, populated over the last three days, with hits
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench_support.hpp"
#include "kcache/gui/model.hpp"

#ifndef KCACHE_BENCH_BUILD_TYPE
#define KCACHE_BENCH_BUILD_TYPE "unknown"
#endif

namespace core = kcache::core;
namespace gui = kcache::gui;
namespace fs = std::filesystem;
using namespace kcache::bench;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kDay = 86'400 * kSecond;

// Anonymous resident memory (heap), in bytes: the map of data.mdb is file-backed and
// not counted, so this is what the process itself allocated.
std::uint64_t rss_anon_bytes() {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
    }
    return 0;
}

// A clock the fill moves by hand (created and hit times spread over days).
struct FakeClock {
    std::shared_ptr<std::int64_t> now = std::make_shared<std::int64_t>(core::system_clock_ns());
    core::Clock clock() const {
        return [t = now] { return *t; };
    }
};

std::unique_ptr<core::Store> open_for_fill(const std::string& path, const FakeClock& clock) {
    core::OpenOptions options;
    options.path = path;
    options.durability = core::Durability::none;
    options.clock = clock.clock();
    return must(core::Store::open(options), "open " + path);
}

int run_fill(const std::string& db, std::uint64_t entries) {
    FakeClock clock;
    const std::int64_t end = *clock.now;
    *clock.now = end - 30 * kDay;
    auto store = open_for_fill(db, clock);
    const core::Origin origin{1000, "bench-fill"};
    const std::uint64_t batch = 20000;
    const std::int64_t step =
        30 * kDay / static_cast<std::int64_t>(std::max<std::uint64_t>(entries, 1));
    Rng rng(42);
    const auto t0 = SteadyClock::now();
    std::string previous_cubin;
    for (std::uint64_t first = 0; first < entries; first += batch) {
        auto txn = must(store->write(), "write txn");
        std::vector<core::Ino> inos;
        for (std::uint64_t n = first; n < std::min(entries, first + batch); ++n) {
            *clock.now += step;
            // Small, distinct files: the model's cost is per entry, not per byte.
            std::string cubin = fmt::format(
                "\x7f"
                "ELF cubin {:016x} sm_90",
                rng.next());
            if (n % 50 == 49) cubin = previous_cubin;  // the same binary under a new key
            previous_cubin = cubin;
            const std::string json =
                fmt::format(R"({{"name":"k{}","num_warps":{}}})", n, 1 << (n % 4));
            const FileSpec files[] = {{"kernel.cubin", cubin}, {"kernel.json", json}};
            must(put_entry(txn, entry_name(n), files, origin), "put entry");
            auto entry = must(txn.find_entry(entry_name(n)), "find entry");
            if (rng.below(20) == 0) must(txn.record_hit(entry.ino), "hit");
        }
        must(txn.commit(), "commit");
        if ((first / batch) % 10 == 0) {
            std::fprintf(stderr, "\rfill: %llu / %llu",
                         static_cast<unsigned long long>(first + batch),
                         static_cast<unsigned long long>(entries));
        }
    }
    must(store->sync(), "sync");
    const double s = seconds_since(t0);
    fmt::print("\nfill: {} entries in {:.1f} s ({:.0f} entries/s), data.mdb {}\n", entries, s,
               static_cast<double>(entries) / s, human_bytes(store->data_file_bytes()));
    return 0;
}

template <class F>
double time_ms(F&& f) {
    const auto t0 = SteadyClock::now();
    f();
    return seconds_since(t0) * 1000.0;
}

int run_measure(const std::string& db) {
    fmt::print("kcache-bench-inspector measure ({} build)\n", KCACHE_BENCH_BUILD_TYPE);
    const std::uint64_t rss0 = rss_anon_bytes();
    const auto t0 = SteadyClock::now();
    gui::Model::Options options;
    options.db_path = db;
    auto opened = gui::Model::open(options);
    if (!opened) die(opened.error(), "open model");
    const double load_s = seconds_since(t0);
    gui::Model& model = **opened;
    const std::uint64_t rss1 = rss_anon_bytes();
    const auto n = static_cast<double>(model.entry_count());
    fmt::print("entries                 {}\n", model.entry_count());
    fmt::print("first load              {:.3f} s (model's own timing {:.3f} s)\n", load_s,
               model.last_load_seconds());
    fmt::print(
        "model memory            {} = {:.1f} bytes/entry (own accounting: rows {} B, "
        "key arena, view index, events)\n",
        human_bytes(model.memory_bytes()), static_cast<double>(model.memory_bytes()) / n,
        sizeof(gui::EntryRow));
    fmt::print(
        "RSS (anonymous) delta   {} = {:.1f} bytes/entry (includes LMDB and allocator "
        "overhead)\n",
        human_bytes(rss1 - rss0), static_cast<double>(rss1 - rss0) / n);

    for (gui::Column c : {gui::Column::key, gui::Column::hits, gui::Column::bytes,
                          gui::Column::last_access, gui::Column::producer}) {
        const double ms = time_ms([&] {
            model.set_sort({c, false});
            model.wait_idle();
        });
        fmt::print("sort by {:<15} {:.1f} ms\n", gui::column_name(c), ms);
    }
    const double filter_ms = time_ms([&] {
        model.set_filter("ab");
        model.wait_idle();
    });
    fmt::print("filter \"ab\"             {:.1f} ms ({} visible)\n", filter_ms,
               model.visible_count());
    fmt::print("filter cleared          {:.1f} ms\n", time_ms([&] {
                   model.set_filter("");
                   model.wait_idle();
               }));
    std::vector<double> polls;
    for (int i = 0; i < 50; ++i) polls.push_back(time_ms([&] { (void)model.refresh(true); }));
    fmt::print("refresh, db unchanged   {:.1f} us (median of 50)\n", median(polls) * 1000);

    // One change by another writer: applied from the events log, not a reload.
    {
        core::OpenOptions writer_options;
        writer_options.path = db;
        auto writer = must(core::Store::open(writer_options), "open " + db);  // another writer
        auto txn = must(writer->write(), "write");
        must(txn.record_hit(model.visible(0).ino), "hit");
        must(txn.commit(), "commit");
    }
    const auto loads = model.full_loads();
    const double refresh_ms = time_ms([&] { (void)model.refresh(true); });
    fmt::print("refresh after one hit   {:.1f} ms ({})\n", refresh_ms,
               model.full_loads() == loads ? "incremental" : "full reload");
    fmt::print("reload                  {:.3f} s\n",
               time_ms([&] { must(model.worker().reload_now().get(), "reload"); }) / 1000);

    const double scan_ms = time_ms([&] {
        must(model.start_duplicate_scan(), "scan");
        model.wait_idle();
    });
    fmt::print("duplicates scan         {:.2f} s ({} groups)\n", scan_ms / 1000,
               model.duplicates().groups().size());
    return 0;
}

// One frame of the view without ImGui: take the worker's newest catalog, then read
// what the entries table and the status line read (40 rows at a scroll position).
void view_frame(gui::Model& model, std::size_t scroll, std::uint64_t& sink) {
    (void)model.refresh();
    const std::size_t n = model.visible_count();
    for (std::size_t i = scroll; i < std::min(n, scroll + 40); ++i) {
        const gui::EntryRow& row = model.visible(i);
        sink += row.bytes + model.key(row).size() + (model.is_selected(i) ? 1 : 0);
    }
    sink += model.selected_count() + model.stats().get(core::Counter::hits) +
            model.duplicates().scanned();
}

struct FrameFigures {
    std::size_t frames = 0;
    double median = 0, p99 = 0, max = 0;
};

FrameFigures figures(std::vector<double> ms) {
    FrameFigures f;
    f.frames = ms.size();
    if (ms.empty()) return f;
    std::sort(ms.begin(), ms.end());
    f.median = ms[ms.size() / 2];
    f.p99 = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
    f.max = ms.back();
    return f;
}

// Runs frames at 60 Hz: `start` at the first frame (inside it), until `busy` is false,
// then 10 more. With `sync`, the first frame also waits for the work to end.
template <typename Start, typename Busy>
FrameFigures run_frames(gui::Model& model, bool sync, Start start, Busy busy) {
    using namespace std::chrono;
    std::vector<double> ms;
    std::uint64_t sink = 0;
    int after = 0;
    auto next = SteadyClock::now();
    for (std::size_t frame = 0; after < 10 && frame < 100'000; ++frame) {
        const auto t0 = SteadyClock::now();
        if (frame == 0) {
            start();
            if (sync) model.wait_idle();
        }
        view_frame(model, (frame * 7) % std::max<std::size_t>(1, model.visible_count()), sink);
        ms.push_back(seconds_since(t0) * 1000.0);
        if (frame > 0 && !busy()) ++after;
        next += microseconds(16'667);
        std::this_thread::sleep_until(next);
    }
    if (sink == 42) std::puts("");  // keep the reads
    return figures(std::move(ms));
}

int run_frames_bench(const std::string& db, bool sync) {
    fmt::print("kcache-bench-inspector frames{} ({} build)\n", sync ? " --sync" : "",
               KCACHE_BENCH_BUILD_TYPE);
    gui::Model::Options options;
    options.db_path = db;
    options.poll_interval_ns = 3600 * kSecond;  // only the work started here
    auto opened = gui::Model::open(options);
    if (!opened) die(opened.error(), "open model");
    gui::Model& model = **opened;
    fmt::print("entries {}\n", model.entry_count());
    auto print = [](const char* what, const FrameFigures& f) {
        fmt::print("{:<34} frames {:>5}  median {:7.3f} ms  p99 {:8.3f} ms  max {:8.3f} ms\n", what,
                   f.frames, f.median, f.p99, f.max);
    };
    print("idle", run_frames(
                      model, sync, [] {}, [] { return false; }));
    std::future<core::Status> reload;
    print(
        "during a full reload",
        run_frames(
            model, sync, [&] { reload = model.worker().reload_now(); },
            [&] { return reload.wait_for(std::chrono::seconds(0)) != std::future_status::ready; }));
    for (gui::Column c : {gui::Column::bytes, gui::Column::key, gui::Column::last_access}) {
        const std::string what = fmt::format("during a sort by {}", gui::column_name(c));
        print(what.c_str(), run_frames(
                                model, sync,
                                [&] {
                                    model.set_sort({c, true});
                                },
                                [&] { return model.ordering(); }));
    }
    print("during a filter (\"ab\")",
          run_frames(
              model, sync, [&] { model.set_filter("ab"); }, [&] { return model.ordering(); }));
    model.set_filter("");
    model.wait_idle();
    if (!sync) {
        print("during the duplicates scan",
              run_frames(
                  model, sync, [&] { (void)model.start_duplicate_scan(); },
                  [&] { return !model.duplicates().done(); }));
    }
    return 0;
}

int run_demo(const std::string& tree, const std::string& db) {
    FakeClock clock;
    const std::int64_t end = *clock.now;
    *clock.now = end - 3 * kDay;
    auto store = open_for_fill(db, clock);
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(tree)) {
        if (e.is_directory()) dirs.push_back(e.path());
    }
    std::sort(dirs.begin(), dirs.end());
    if (dirs.empty()) {
        std::fprintf(stderr, "demo: no directories in %s\n", tree.c_str());
        return 1;
    }
    Rng rng(7);
    const core::Origin origin{31337, "python3"};
    const std::int64_t step = 3 * kDay / static_cast<std::int64_t>(dirs.size() * 4);
    std::vector<core::Ino> entries;
    // Each kernel is compiled (a miss), then loaded by later runs (hits), more and more
    // as the cache warms up; a few kernels are hot.
    auto hit_some = [&](std::size_t count) {
        for (std::size_t i = 0; i < count && !entries.empty(); ++i) {
            *clock.now += step / static_cast<std::int64_t>(count + 1);
            const auto n = static_cast<std::uint32_t>(entries.size());
            const std::size_t pick = rng.below(3) == 0 ? rng.below(n) : rng.below(std::min(n, 5u));
            must(store->update([&](core::WriteTxn& txn) { return txn.record_hit(entries[pick]); }),
                 "hit");
        }
    };
    for (const auto& dir : dirs) {
        *clock.now += step;
        must(store->update([&](core::WriteTxn& txn) -> core::Status {
            auto made = must(txn.mkdir(core::kRootIno, dir.filename().string(), 0755), "mkdir");
            entries.push_back(made.ino);
            std::vector<fs::path> files;
            for (const auto& f : fs::directory_iterator(dir)) files.push_back(f.path());
            std::sort(files.begin(), files.end());
            for (const auto& f : files) {
                auto file = must(txn.create(made.ino, f.filename().string(), 0644), "create");
                must(txn.write(file.ino, read_whole(f), origin), "write");
            }
            return {};
        }),
             "store " + dir.string());
        hit_some(entries.size() / 3);
    }
    while (*clock.now < end - 3 * step) hit_some(8);
    must(store->update([&](core::WriteTxn& txn) { return txn.set_pinned(entries[0], true); }),
         "pin");
    must(store->sync(), "sync");
    fmt::print("demo: {} entries in {}\n", entries.size(), db);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kcache-bench-inspector: figures for the inspector's model"};
    app.require_subcommand(1);
    std::string db, tree;
    std::uint64_t entries = 1'000'000;
    auto* fill = app.add_subcommand("fill", "create a db with many synthetic entries");
    fill->add_option("--db", db, "db directory (must not exist yet)")->required();
    fill->add_option("--entries", entries, "entries to create")->capture_default_str();
    auto* measure = app.add_subcommand("measure", "time the model on a db");
    measure->add_option("--db", db, "db directory")->required();
    bool sync = false;
    auto* frames = app.add_subcommand("frames", "frame times while the worker works");
    frames->add_option("--db", db, "db directory")->required();
    frames->add_flag("--sync", sync, "wait for the work inside the frame (the old model)");
    auto* demo = app.add_subcommand("demo", "a db with real kernels for screenshots");
    demo->add_option("--tree", tree, "directory of entry directories")->required();
    demo->add_option("--db", db, "db directory (must not exist yet)")->required();
    CLI11_PARSE(app, argc, argv);
    if (fill->parsed() || demo->parsed()) {
        if (fs::exists(fs::path(db) / "data.mdb")) {
            std::fprintf(stderr, "%s already holds a db\n", db.c_str());
            return 1;
        }
    }
    if (fill->parsed()) return run_fill(db, entries);
    if (measure->parsed()) return run_measure(db);
    if (frames->parsed()) return run_frames_bench(db, sync);
    return run_demo(tree, db);
}
