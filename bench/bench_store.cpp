// In-process benchmarks of the core store (Google Benchmark), each next to a
// plain-file baseline measured in the same run on the same disk:
//
//   put/...    one entry (mkdir + create + write of one file) per write transaction
//   get/...    Txn::read of a random existing file (bytes/s, zero-copy share)
//   evict/...  Store::evict down to half the stored bytes (entries/s)
//   stats/...  Txn::stats on a db of 1k, 10k, 100k entries (must not grow)
//
// After the Google Benchmark table, a ratio table compares each kcache case with
// its baseline. All times are wall-clock (UseRealTime): the work is I/O.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "bench_support.hpp"
#include "kcache/core/integrity.hpp"
#include "store_ratios.hpp"

#ifndef KCACHE_BENCH_BUILD_TYPE
#define KCACHE_BENCH_BUILD_TYPE "unknown"
#endif

namespace core = kcache::core;
using namespace kcache::bench;

namespace {

// Everything the benchmarks share; lives in main so stores close before the temp
// directory is removed.
struct Context {
    TempDir dir{"kcache-bench-store"};
    core::Origin origin = core::Origin::current();
    std::map<std::string, std::unique_ptr<core::Store>> stores;
    std::map<std::string, std::uint64_t> sequences;  // next entry number per db/dir
};
Context* g_ctx = nullptr;

core::Store& store_named(const std::string& name, core::Durability durability) {
    auto& slot = g_ctx->stores[name];
    if (!slot) {
        core::OpenOptions options;
        options.path = (g_ctx->dir / name).string();
        options.durability = durability;
        slot = must(core::Store::open(options), "open " + options.path);
    }
    return *slot;
}

// One file kind per size, as a compiler writes them: 1 KB signature JSON, 8 KB
// binary, 16 KB IR text.
std::string make_content(std::size_t size, std::uint64_t seed) {
    if (size <= 1024) return make_json(seed, size);
    if (size <= 8192) return make_cubin(seed, size);
    return make_ptx(seed, size);
}
std::string_view file_name_for(std::size_t size) {
    if (size <= 1024) return "kernel.json";
    if (size <= 8192) return "kernel.cubin";
    return "kernel.ptx";
}

// 64 distinct contents per size; each use stamps a sequence number into a copy so
// every stored file is distinct (no dedup short-cut) at the cost of one memcpy,
// paid by kcache and baseline alike. `random`: incompressible bytes instead of the
// realistic kind (the store keeps those raw, so reads are zero-copy).
std::string make_random(std::uint64_t seed, std::size_t size) {
    Rng rng(seed);
    std::string out(size, '\0');
    for (std::size_t i = 0; i < size; i += 8) {
        const std::uint64_t v = rng.next();
        std::memcpy(out.data() + i, &v, std::min<std::size_t>(8, size - i));
    }
    return out;
}
const std::vector<std::string>& pool_for(std::size_t size, bool random = false) {
    static std::map<std::pair<std::size_t, bool>, std::vector<std::string>> pools;
    auto& pool = pools[{size, random}];
    if (pool.empty()) {
        for (std::uint64_t i = 0; i < 64; ++i) {
            pool.push_back(random ? make_random(1000 + i, size) : make_content(size, 1000 + i));
        }
    }
    return pool;
}
void stamp(std::string& buf, std::uint64_t n) {
    const std::size_t at = buf.size() >= 80 ? 64 : 0;
    for (std::size_t k = 0; k < 16 && at + k < buf.size(); ++k) {
        buf[at + k] = "0123456789abcdef"[(n >> (4 * k)) & 15];
    }
}
void fill_from_pool(std::string& buf, std::size_t size, std::uint64_t n, bool random = false) {
    const auto& pool = pool_for(size, random);
    buf.assign(pool[n % pool.size()]);
    stamp(buf, n);
}

bool write_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
}

// Reads one byte per cache line (and the last): the consumer touches what it got.
std::uint64_t touch(std::string_view bytes) {
    std::uint64_t sum = bytes.size();
    for (std::size_t i = 0; i < bytes.size(); i += 64) sum += static_cast<unsigned char>(bytes[i]);
    if (!bytes.empty()) sum += static_cast<unsigned char>(bytes.back());
    return sum;
}

std::string errno_text(std::string_view what) {
    return fmt::format("{}: {}", what, std::strerror(errno));
}

// ---------------------------------------------------------------- put

void bm_put_kcache(benchmark::State& state, std::size_t size, core::Durability durability) {
    const std::string name = fmt::format("put-{}-{}", size, durability_name(durability));
    core::Store& store = store_named(name, durability);
    std::uint64_t& seq = g_ctx->sequences[name];
    const FileSpec file_template{file_name_for(size), {}};
    std::string buf;
    for (auto _ : state) {
        const std::uint64_t n = seq++;
        fill_from_pool(buf, size, n);
        auto txn = store.write();
        if (!txn) {
            state.SkipWithError(txn.error().message.c_str());
            break;
        }
        const FileSpec file{file_template.name, buf};
        if (auto s = put_entry(*txn, entry_name(n), {&file, 1}, g_ctx->origin); !s) {
            state.SkipWithError(s.error().message.c_str());
            break;
        }
        if (auto s = txn->commit(); !s) {
            state.SkipWithError(s.error().message.c_str());
            break;
        }
    }
    state.SetItemsProcessed(state.iterations());
    state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(size));
    state.counters["data_mdb_MiB"] =
        static_cast<double>(store.data_file_bytes()) / (1024.0 * 1024.0);
}

// The same files as plain files: mkdir + open(O_CREAT|O_TRUNC) + write (+ fsync of
// the file when durable) + close.
void bm_put_plain(benchmark::State& state, std::size_t size, bool durable) {
    const std::string name = fmt::format("plain-put-{}-{}", size, durable ? "full" : "none");
    const std::filesystem::path dir = g_ctx->dir / name;
    std::filesystem::create_directories(dir);
    std::uint64_t& seq = g_ctx->sequences[name];
    const std::string_view file_name = file_name_for(size);
    std::string buf;
    for (auto _ : state) {
        const std::uint64_t n = seq++;
        fill_from_pool(buf, size, n);
        const std::string entry = (dir / entry_name(n)).string();
        if (::mkdir(entry.c_str(), 0755) != 0) {
            state.SkipWithError(errno_text("mkdir").c_str());
            break;
        }
        const std::string path = fmt::format("{}/{}", entry, file_name);
        const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || !write_all(fd, buf) || (durable && ::fsync(fd) != 0)) {
            state.SkipWithError(errno_text("write " + path).c_str());
            if (fd >= 0) ::close(fd);
            break;
        }
        ::close(fd);
    }
    state.SetItemsProcessed(state.iterations());
    state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(size));
}

// ---------------------------------------------------------------- get

constexpr std::size_t kGetEntries = 4096;

struct GetFixture {
    core::Store* store = nullptr;
    std::vector<core::Ino> inos;
    std::vector<std::string> paths;  // the same files as plain files
};

GetFixture& get_fixture(std::size_t size, bool random) {
    static std::map<std::pair<std::size_t, bool>, GetFixture> fixtures;
    GetFixture& fx = fixtures[{size, random}];
    if (fx.store) return fx;
    const std::string name = fmt::format("get-{}{}", size, random ? "-random" : "");
    fx.store = &store_named(name, core::Durability::none);
    const std::filesystem::path plain = g_ctx->dir / ("plain-" + name);
    std::filesystem::create_directories(plain);
    const std::string_view file_name = file_name_for(size);
    std::string buf;
    for (std::uint64_t first = 0; first < kGetEntries; first += 64) {
        auto txn = must(fx.store->write(), "get fixture: write txn");
        for (std::uint64_t n = first; n < std::min<std::uint64_t>(first + 64, kGetEntries); ++n) {
            fill_from_pool(buf, size, n, random);
            const FileSpec file{file_name, buf};
            must(put_entry(txn, entry_name(n), {&file, 1}, g_ctx->origin, &fx.inos),
                 "get fixture: put");
            const std::filesystem::path entry = plain / entry_name(n);
            std::filesystem::create_directories(entry);
            const std::string path = (entry / file_name).string();
            const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
            if (fd < 0 || !write_all(fd, buf)) {
                std::perror(path.c_str());
                std::exit(1);
            }
            ::close(fd);
            fx.paths.push_back(path);
        }
        must(txn.commit(), "get fixture: commit");
    }
    must(fx.store->sync(), "get fixture: sync");
    return fx;
}

// `txn_per_read`: a read transaction per read, as a daemon serving independent
// requests does; otherwise all reads in one snapshot (the pure lookup cost).
void bm_get_kcache(benchmark::State& state, std::size_t size, bool random, bool txn_per_read) {
    GetFixture& fx = get_fixture(size, random);
    Rng rng(42);
    std::uint64_t sink = 0;
    std::uint64_t zero_copy = 0;
    std::optional<core::ReadTxn> snapshot;
    if (!txn_per_read) snapshot.emplace(must(fx.store->read(), "read txn"));
    for (auto _ : state) {
        const core::Ino ino = fx.inos[rng.below(static_cast<std::uint32_t>(fx.inos.size()))];
        std::optional<core::ReadTxn> own;
        if (txn_per_read) {
            auto txn = fx.store->read();
            if (!txn) {
                state.SkipWithError(txn.error().message.c_str());
                break;
            }
            own.emplace(std::move(*txn));
        }
        const core::ReadTxn& txn = txn_per_read ? *own : *snapshot;
        auto content = txn.read(ino);
        if (!content) {
            state.SkipWithError(content.error().message.c_str());
            break;
        }
        sink += touch(content->bytes());
        zero_copy += content->zero_copy() ? 1 : 0;
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(state.iterations());
    state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(size));
    state.counters["zero_copy"] = state.iterations() ? static_cast<double>(zero_copy) /
                                                           static_cast<double>(state.iterations())
                                                     : 0.0;
}

// bm_get_kcache with a read transaction per read and the content check off
// (kcache/core/integrity.hpp): the baseline of what the digest check costs a hit.
void bm_get_kcache_unchecked(benchmark::State& state, std::size_t size, bool random) {
    core::set_content_checks(false);
    bm_get_kcache(state, size, random, true);
    core::set_content_checks(true);
}

// open + fstat + read whole file + close, into a reused buffer.
void bm_get_plain(benchmark::State& state, std::size_t size, bool random) {
    GetFixture& fx = get_fixture(size, random);
    Rng rng(42);
    std::uint64_t sink = 0;
    std::string buf;
    for (auto _ : state) {
        const std::string& path = fx.paths[rng.below(static_cast<std::uint32_t>(fx.paths.size()))];
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        struct stat st {};
        if (fd < 0 || ::fstat(fd, &st) != 0) {
            state.SkipWithError(errno_text(path).c_str());
            break;
        }
        buf.resize(static_cast<std::size_t>(st.st_size));
        std::size_t got = 0;
        while (got < buf.size()) {
            const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
            if (n <= 0) break;
            got += static_cast<std::size_t>(n);
        }
        ::close(fd);
        sink += touch(std::string_view(buf.data(), got));
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(state.iterations());
    state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(size));
}

// ---------------------------------------------------------------- evict

constexpr std::uint64_t kEvictEntries = 2000;  // entries before each eviction

// A cache entry as a compiler writes it: cubin 8 KB, json 1 KB, ptx 16 KB.
struct EntryFiles {
    std::string cubin, json, ptx;
    void make(std::uint64_t n) {
        fill_from_pool(cubin, 8192, n);
        fill_from_pool(json, 1024, n);
        fill_from_pool(ptx, 16384, n);
    }
    std::array<FileSpec, 3> specs() const {
        return {FileSpec{"kernel.cubin", cubin}, FileSpec{"kernel.json", json},
                FileSpec{"kernel.ptx", ptx}};
    }
};

// Adds entries (64 per transaction) until the db holds `target` entries.
void refill_store(core::Store& store, std::uint64_t& seq, std::uint64_t target) {
    EntryFiles files;
    while (true) {
        const std::uint64_t have = gauge(store, core::Counter::entries);
        if (have >= target) return;
        auto txn = must(store.write(), "refill: write txn");
        for (std::uint64_t i = 0; i < std::min<std::uint64_t>(64, target - have); ++i) {
            const std::uint64_t n = seq++;
            files.make(n);
            const auto specs = files.specs();
            must(put_entry(txn, entry_name(n), specs, g_ctx->origin), "refill: put");
        }
        must(txn.commit(), "refill: commit");
    }
}

void bm_evict_kcache(benchmark::State& state, core::Durability durability) {
    const std::string name = fmt::format("evict-{}", durability_name(durability));
    core::Store& store = store_named(name, durability);
    std::uint64_t& seq = g_ctx->sequences[name];
    std::uint64_t evicted = 0;
    std::uint64_t bytes = 0;
    for (auto _ : state) {
        state.PauseTiming();
        refill_store(store, seq, kEvictEntries);
        core::EvictRequest request;
        request.max_bytes = gauge(store, core::Counter::stored_bytes) / 2;
        state.ResumeTiming();
        auto report = store.evict(request);
        if (!report) {
            state.SkipWithError(report.error().message.c_str());
            break;
        }
        evicted += report->entries;
        bytes += report->bytes;
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(evicted));
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
    state.counters["evicted_per_call"] =
        state.iterations() ? static_cast<double>(evicted) / static_cast<double>(state.iterations())
                           : 0.0;
    state.counters["data_mdb_MiB"] =
        static_cast<double>(store.data_file_bytes()) / (1024.0 * 1024.0);
}

// Plain-file cache eviction: remove the oldest half of the entry directories
// (3 unlinks + rmdir each), no fsync.
void bm_evict_plain(benchmark::State& state) {
    const std::filesystem::path dir = g_ctx->dir / "plain-evict";
    std::filesystem::create_directories(dir);
    std::uint64_t next = 0;
    std::uint64_t oldest = 0;
    std::uint64_t evicted = 0;
    EntryFiles files;
    for (auto _ : state) {
        state.PauseTiming();
        for (; next - oldest < kEvictEntries; ++next) {
            files.make(next);
            const std::filesystem::path entry = dir / entry_name(next);
            std::filesystem::create_directories(entry);
            for (const FileSpec& f : files.specs()) {
                const std::string path = (entry / f.name).string();
                const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
                if (fd < 0 || !write_all(fd, f.content)) {
                    std::perror(path.c_str());
                    std::exit(1);
                }
                ::close(fd);
            }
        }
        state.ResumeTiming();
        const std::uint64_t stop = oldest + kEvictEntries / 2;
        for (; oldest < stop; ++oldest) {
            const std::string entry = (dir / entry_name(oldest)).string();
            for (std::string_view f : {"kernel.cubin", "kernel.json", "kernel.ptx"}) {
                ::unlink(fmt::format("{}/{}", entry, f).c_str());
            }
            ::rmdir(entry.c_str());
            ++evicted;
        }
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(evicted));
}

// ---------------------------------------------------------------- stats

// One growing db: each stats case first adds entries (one 1 KB file each) up to its
// size, outside the timed loop.
core::Store& stats_store(std::uint64_t entries) {
    core::Store& store = store_named("stats", core::Durability::none);
    std::uint64_t& seq = g_ctx->sequences["stats"];
    std::string buf;
    while (seq < entries) {
        auto txn = must(store.write(), "stats fill: write txn");
        for (std::uint64_t i = 0; i < 256 && seq < entries; ++i) {
            const std::uint64_t n = seq++;
            fill_from_pool(buf, 1024, n);
            const FileSpec file{"kernel.json", buf};
            must(put_entry(txn, entry_name(n), {&file, 1}, g_ctx->origin), "stats fill: put");
        }
        must(txn.commit(), "stats fill: commit");
    }
    return store;
}

// Txn::stats inside one snapshot.
void bm_stats(benchmark::State& state, std::uint64_t entries) {
    core::Store& store = stats_store(entries);
    auto txn = must(store.read(), "read txn");
    for (auto _ : state) {
        auto stats = txn.stats();
        if (!stats) {
            state.SkipWithError(stats.error().message.c_str());
            break;
        }
        benchmark::DoNotOptimize(stats->values.size());
    }
    state.counters["entries"] =
        static_cast<double>(must(txn.counter(core::Counter::entries), "entries"));
}

// Store::read + Txn::stats: what a CLI/GUI refresh costs.
void bm_read_stats(benchmark::State& state, std::uint64_t entries) {
    core::Store& store = stats_store(entries);
    for (auto _ : state) {
        auto txn = store.read();
        if (!txn) {
            state.SkipWithError(txn.error().message.c_str());
            break;
        }
        auto stats = txn->stats();
        if (!stats) {
            state.SkipWithError(stats.error().message.c_str());
            break;
        }
        benchmark::DoNotOptimize(stats->values.size());
    }
}

void register_all() {
    using benchmark::RegisterBenchmark;
    for (std::size_t size : {8192, 1024, 16384}) {
        for (core::Durability d : {core::Durability::none, core::Durability::full}) {
            const std::string suffix = fmt::format("{}/{}", size_label(size), durability_name(d));
            const bool durable = d == core::Durability::full;
            auto* k = RegisterBenchmark(("put/kcache/" + suffix).c_str(), bm_put_kcache, size, d);
            auto* p =
                RegisterBenchmark(("put/plain/" + suffix).c_str(), bm_put_plain, size, durable);
            for (auto* b : {k, p}) {
                b->UseRealTime()->Unit(benchmark::kMicrosecond);
                // Bound the db size and the fsync-bound cases' run time.
                if (durable)
                    b->MinTime(1.0);
                else
                    b->MinTime(0.5);
            }
        }
    }
    // Realistic (compressible) files, and incompressible ones of the same size: the
    // store keeps those raw and serves them as views into the map (zero-copy).
    for (bool random : {false, true}) {
        for (std::size_t size : {8192, 1024, 16384}) {
            const std::string label = size_label(size) + (random ? "-random" : "");
            RegisterBenchmark(("get/kcache-txn-per-read/" + label).c_str(), bm_get_kcache, size,
                              random, true)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
            RegisterBenchmark(("get/kcache-unchecked/" + label).c_str(), bm_get_kcache_unchecked,
                              size, random)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
            RegisterBenchmark(("get/kcache-one-snapshot/" + label).c_str(), bm_get_kcache, size,
                              random, false)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
            RegisterBenchmark(("get/plain/" + label).c_str(), bm_get_plain, size, random)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
        }
    }
    RegisterBenchmark("evict/kcache/none", bm_evict_kcache, core::Durability::none)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(5);
    RegisterBenchmark("evict/plain/none", bm_evict_plain)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(5);
    RegisterBenchmark("evict/kcache/full", bm_evict_kcache, core::Durability::full)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(5);
    for (std::uint64_t n : {1000, 10000, 100000}) {
        RegisterBenchmark(fmt::format("stats/{}", n).c_str(), bm_stats, n)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
        RegisterBenchmark(fmt::format("read+stats/{}", n).c_str(), bm_read_stats, n)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
    // Colour as Google Benchmark's own reporter would choose it (a terminal, unless
    // --benchmark_color=false/no/0).
    bool color = ::isatty(STDOUT_FILENO) != 0;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--benchmark_color=false" || arg == "--benchmark_color=no" ||
            arg == "--benchmark_color=0") {
            color = false;
        } else if (arg == "--benchmark_color=true" || arg == "--benchmark_color=yes" ||
                   arg == "--benchmark_color=1") {
            color = true;
        }
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    Context context;
    g_ctx = &context;
    benchmark::AddCustomContext("kcache_build_type", KCACHE_BENCH_BUILD_TYPE);
    benchmark::AddCustomContext("kcache_tmp", context.dir.path().string());
    register_all();
    RatioReporter reporter(color);
    benchmark::RunSpecifiedBenchmarks(&reporter);
    print_ratios(reporter);
    benchmark::Shutdown();
    g_ctx = nullptr;
    return 0;
}
