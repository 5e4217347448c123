// The mount outlives its daemon (issue 20): kcache-fsd's keeper restarts a serving
// daemon that dies, and the new one takes the mount over (fsd/src/survival/keeper.hpp,
// takeover.hpp, state.hpp).
//
// - kill -9 of the serving daemon 20 times, 1-3 s apart, while 16 processes read hits,
//   4 store new entries (temp file + rename, as Triton does) and 2 run real Triton
//   compiles (triton_load.py, the compat venv's Triton): readers get no error (over
//   io_uring none but ECANCELED: kill_cancels_calls) and byte-exact content; each store
//   succeeds (its entry byte-exact afterwards), as does each compile: a writer's bytes
//   outlive the daemon (fsd/src/survival/spill.hpp), so no call fails with EIO (over io_uring a
//   call in flight may end ECANCELED, and its store or compile with it: the entry is
//   then absent or complete); a fresh Triton process loads the first round from the
//   mount without compiling; `kcache verify` is clean; the statistics agree with the entries and
//   count no hit twice.
// - the same load across 5 `kcache-fsd --upgrade`s, each to another binary installed
//   over the keeper's path: no error of any kind, and hits exactly the pairs that read.
// - open files survive a takeover: a reader reads on; a writer writes on, whether its
//   bytes were all published or not (those not published outlive the daemon in a
//   spill file, fsd/src/survival/spill.hpp).
// - keeper and daemon both killed: kcache-fsd on the dead mountpoint recovers it.
//
// Figures: KCACHE_TAKEOVER_KILLS (default 20) kills, 1-3 s apart (seeded: the seed is
// printed); each load test prints its reads, stores, compiles and wall time.
//
// Nothing here can hang (mount_fixture.hpp): every child is killed and reaped on every
// path (Child's destructor, also when a REQUIRE throws), every wait is bounded.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kcache/core/holds.hpp"
#include "kcache/core/store.hpp"
#include "mount_fixture.hpp"
#include "processes.hpp"
#include "skip.hpp"

using namespace kcache::test;

namespace {

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    return std::strtoull(v, nullptr, 0);
}

// The serving daemon of a keeper (its one child); -1 while there is none.
pid_t serving_daemon(pid_t keeper) {
    const auto children = children_of(keeper, /*include_zombies=*/false);
    return children.size() == 1 ? children.front() : -1;
}

// Kills the serving daemon and waits until the keeper runs another; its pid.
pid_t kill_serving_daemon(pid_t keeper) {
    const pid_t old = serving_daemon(keeper);
    REQUIRE(old > 0);
    REQUIRE(::kill(old, SIGKILL) == 0);
    pid_t now = -1;
    REQUIRE(wait_until(
        [&] {
            now = serving_daemon(keeper);
            return now > 0 && now != old;
        },
        10));
    return now;
}

// A mount and the keeper of its serving daemon: the setup of the tests that replace that
// daemon (kill_serving_daemon, --upgrade) under files held open.
struct KeptMount {
    MountedCache cache;
    const pid_t keeper = cache.daemon_pid();
};

std::string hit_path(const MountedCache& cache, int i) {
    return cache.p("h" + std::to_string(i) + "/kernel.bin");
}
std::string hit_content(int i) {
    return random_bytes(4096 + static_cast<std::size_t>(i) * 3001, 1000 + i);
}
std::string store_dir(const MountedCache& cache, int writer, int n) {
    // A top-level entry each, as Triton's <hash>/ (a directory made inside an entry
    // another process fills may wait for it: single flight).
    return cache.p("w" + std::to_string(writer) + "e" + std::to_string(n));
}
std::string store_content(int writer, int n) {
    return random_bytes(8192 + static_cast<std::size_t>((writer * 7919 + n * 104729) % 120000),
                        (static_cast<std::uint64_t>(writer) << 32) | static_cast<unsigned>(n));
}

// The load (issue 20, Tests): 16 processes read hits, 4 store new entries (temp
// file + rename, as Triton does) and 2 run real Triton compiles through the mount.
constexpr int kHits = 24;
constexpr int kReaders = 16;
constexpr int kWriters = 4;
constexpr int kTritonWorkers = 2;
constexpr int kMaxStores = 4000;

// `canceled`: the store failed with ECANCELED (allowed over io_uring across a kill:
// Load::cancels_allowed), and like `eio` its entry is absent or complete.
enum Outcome : std::uint8_t { none = 0, stored = 1, eio = 2, canceled = 3 };

// Shared with the load's processes (MAP_SHARED).
struct Load {
    std::atomic<bool> stop{false};
    // A call that fails with ECANCELED is counted in `canceled`, not as an error (a kill
    // -9 over io_uring: kill_cancels_calls).
    std::atomic<bool> cancels_allowed{false};
    std::atomic<std::uint64_t> canceled{0};
    std::atomic<std::uint64_t> reads{0};
    std::atomic<std::uint64_t> read_errors{0};
    std::atomic<std::uint64_t> mismatches{0};
    std::atomic<std::uint64_t> longest_read_ns{0};
    std::atomic<std::uint64_t> store_errors{0};  // other than EIO
    std::atomic<int> first_errno{0};
    std::atomic<int> first_error_op{0};       // 1 read, 2 mkdir, 3 create/write/close, 4 rename
    std::atomic<int> events{0};               // done so far
    std::atomic<int> first_error_events{-1};  // events done when the first error came
    std::atomic<bool> pair_read[kReaders][kHits];  // (entry, process) pairs that read
    std::atomic<int> stores[kWriters];
    Outcome outcomes[kWriters][kMaxStores];
};

// The Load in memory shared with the children, unmapped last (declared before them).
class SharedLoad {
  public:
    SharedLoad() {
        m_mem = ::mmap(nullptr, sizeof(Load), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);
        if (m_mem == MAP_FAILED) throw std::runtime_error("mmap of the shared load failed");
        m_load = new (m_mem) Load();
    }
    ~SharedLoad() {
        m_load->~Load();
        ::munmap(m_mem, sizeof(Load));
    }
    SharedLoad(const SharedLoad&) = delete;
    SharedLoad& operator=(const SharedLoad&) = delete;
    Load& operator*() { return *m_load; }

  private:
    void* m_mem = nullptr;
    Load* m_load = nullptr;
};

void note_error(Load& load, int op, int err) {
    int expected = 0;
    if (load.first_errno.compare_exchange_strong(expected, err)) {
        load.first_error_op = op;
        load.first_error_events = load.events.load();
    }
}

int reader(Load& load, const MountedCache& cache, int r, std::uint64_t seed) {
    std::mt19937 rng(static_cast<unsigned>(seed + static_cast<unsigned>(r)));
    while (!load.stop.load()) {
        const int i = static_cast<int>(rng() % kHits);
        const auto start = std::chrono::steady_clock::now();
        const auto got = read_all(hit_path(cache, i));
        const auto ns =
            static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::steady_clock::now() - start)
                                           .count());
        for (auto longest = load.longest_read_ns.load();
             ns > longest && !load.longest_read_ns.compare_exchange_weak(longest, ns);) {
        }
        if (!got) {
            if (errno == ECANCELED && load.cancels_allowed) {
                ++load.canceled;
                load.pair_read[r][i] = true;  // its open may have counted the hit
                continue;
            }
            ++load.read_errors;
            note_error(load, 1, errno);
            continue;
        }
        if (*got != hit_content(i)) ++load.mismatches;
        load.pair_read[r][i] = true;
        ++load.reads;
    }
    return 0;
}

// Stores entries as Triton does: mkdir -p, a temp file, rename into place. A call that
// fails with EIO (or an allowed ECANCELED) ends that store (the entry may be absent or
// complete); any other failure is counted.
int writer(Load& load, const MountedCache& cache, int w) {
    for (int n = 0; n < kMaxStores && !load.stop.load(); ++n) {
        const std::string dir = store_dir(cache, w, n);
        const std::string content = store_content(w, n);
        auto fail = [&](int op, int err) {
            if (err == EIO) {
                load.outcomes[w][n] = eio;
            } else if (err == ECANCELED && load.cancels_allowed) {
                load.outcomes[w][n] = canceled;
                ++load.canceled;
            } else {
                ++load.store_errors;
                note_error(load, op, err);
            }
        };
        load.stores[w] = n + 1;
        if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
            fail(2, errno);
            continue;
        }
        const std::string tmp = dir + "/.tmp.kernel.bin." + std::to_string(getpid());
        if (const int err = write_all(tmp, content); err != 0) {
            fail(3, err);
            continue;
        }
        if (::rename(tmp.c_str(), (dir + "/kernel.bin").c_str()) != 0) {
            fail(4, errno);
            continue;
        }
        load.outcomes[w][n] = stored;
    }
    return 0;
}

// Whether a kill -9 may fail calls with ECANCELED: over io_uring the successor answers
// what the dead daemon's ring entries hold (fsd/src/transport/uring_area.hpp), but this kernel
// (6.18) ends with ECANCELED a request it was handing to a ring thread that is dying
// and had not copied to it yet; it neither resends such a request nor shows it to a
// successor (docs/operations.md). An upgrade avoids that (its threads end with no entry
// waiting); a kill cannot. Over /dev/fuse a kill is a pause only.
bool kill_cancels_calls() {
    return io_uring_run();
}

// The rest of what `fd` reads, as read_fd (nullopt on an error, errno set), except that
// where `cancels` (kill_cancels_calls, after a kill) a read that failed with ECANCELED
// is tried again, a few times at most: a failed read moves no offset. How many were is
// printed.
std::optional<std::string> read_rest(int fd, bool cancels) {
    std::string out;
    int canceled = 0;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n > 0) {
            out.append(buf, static_cast<std::size_t>(n));
        } else if (n == 0) {
            break;
        } else if (errno == EINTR || (errno == ECANCELED && cancels && ++canceled <= 5)) {
            continue;
        } else {
            return std::nullopt;
        }
    }
    if (canceled > 0)
        std::printf("takeover: %d reads after the kill failed with ECANCELED\n", canceled);
    return out;
}

ProcOptions python_options(double timeout_s) {
    ProcOptions options;
    options.timeout_s = timeout_s;
    options.env["PYTHONDONTWRITEBYTECODE"] = "1";  // nothing written into the source tree
    options.unset_env = {"PYTHONPATH", "PYTHONHOME", "TRITON_CACHE_DIR"};
    return options;
}

// The load's Triton compiles need the compat venv's Triton (scripts/setup.sh).
void require_triton() {
    if (::access(KCACHE_COMPAT_PYTHON, X_OK) != 0)
        skip(std::string("the compat venv's Python is absent (") + KCACHE_COMPAT_PYTHON +
             "; scripts/setup.sh makes it): the load's Triton compiles cannot run");
    const ProcResult r =
        run_process({KCACHE_COMPAT_PYTHON, "-c", "import triton"}, python_options(120));
    if (r.exit_code != 0)
        skip("the compat venv has no Triton (scripts/setup.sh installs it): " + r.describe());
}

// The counters that only grow (docs/stats.md): none may go down across an event.
constexpr const char* kGrowing[] = {"hits",  "misses",     "stores",       "negative_lookups",
                                    "opens", "bytes_read", "bytes_written"};

void check_growing(const nlohmann::json& before, const nlohmann::json& after, int event) {
    for (const char* name : kGrowing) {
        INFO("event " << event << ": " << name << " " << stat_value(before, name) << " -> "
                      << stat_value(after, name));
        CHECK(stat_value(after, name) >= stat_value(before, name));
    }
}

// The statistics once the daemon has flushed what it counted (every 200 ms): two reads
// 0.6 s apart that agree.
nlohmann::json settled_stats(const fs::path& db) {
    nlohmann::json last = cache_stats(db);
    for (int tries = 0; tries < 30; ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        nlohmann::json now = cache_stats(db);
        bool same = true;
        for (const char* name : kGrowing) same = same && now.at(name) == last.at(name);
        if (same) return now;
        last = std::move(now);
    }
    FAIL("the statistics did not settle within 18 s");
    return last;
}

struct LoadFigures {
    std::uint64_t reads = 0, pairs = 0;
    double longest_read_s = 0, wall_s = 0;
    std::size_t stores = 0, store_eio = 0, compiles = 0, compile_eio = 0;
    std::uint64_t canceled = 0;  // calls that failed with an allowed ECANCELED
};

// What run_load runs: readers, writers and real Triton compiles, or the readers alone.
enum class Traffic { full, reads };

// Runs the load while `event(k)` happens `events` times, 1-3 s apart, then checks
// every read, store and compile and the statistics. `exact_hits`: no event lost a
// counted hit (an upgrade flushes; a kill may lose those not flushed yet), so hits
// equal the (entry, process) pairs that read, else they are at most those; no store
// or compile may then fail with EIO either. `cancels`: a call may fail with ECANCELED
// (kill_cancels_calls), counted apart; no other error is allowed.
LoadFigures run_load(MountedCache& cache, int events, const std::function<void(int)>& event,
                     std::uint64_t seed, bool exact_hits, Traffic traffic = Traffic::full,
                     bool cancels = false) {
    const bool full = traffic == Traffic::full;
    const auto started = std::chrono::steady_clock::now();
    const pid_t keeper = cache.daemon_pid();
    REQUIRE(keeper > 0);
    REQUIRE(serving_daemon(keeper) > 0);
    // The hit entries, populated by a process that is gone: the readers are not of its
    // compile (hits.hpp), so each of their first opens is a hit.
    REQUIRE(run_child([&] {
                for (int i = 0; i < kHits; ++i) {
                    if (::mkdir(cache.p("h" + std::to_string(i)).c_str(), 0755) != 0) return 1;
                    if (write_all(hit_path(cache, i), hit_content(i)) != 0) return 2;
                }
                return 0;
            }).exit_code == 0);

    SharedLoad shared;  // outlives the children below, which are killed on every path
    Load& load = *shared;
    load.cancels_allowed = cancels;
    const fs::path stop_file = cache.root() / "stop-triton";
    std::vector<std::unique_ptr<Child>> children;
    for (int r = 0; r < kReaders; ++r)
        children.push_back(
            std::make_unique<Child>([&, r] { return reader(load, cache, r, seed); }));
    for (int w = 0; full && w < kWriters; ++w)
        children.push_back(std::make_unique<Child>([&, w] { return writer(load, cache, w); }));
    std::vector<fs::path> triton_results;
    for (int t = 0; full && t < kTritonWorkers; ++t) {
        triton_results.push_back(cache.root() / ("triton" + std::to_string(t) + ".json"));
        children.push_back(std::make_unique<Child>([&, t, out = triton_results.back()] {
            const ProcResult r =
                run_process({KCACHE_COMPAT_PYTHON, KCACHE_TRITON_LOAD, "--mount",
                             cache.mnt().string(), "--name", "t" + std::to_string(t), "--stop",
                             stop_file.string(), "--out", out.string()},
                            python_options(600));
            if (r.exit_code != 0)
                std::fprintf(stderr, "triton_load.py: %s\n", r.describe().c_str());
            return r.exit_code;
        }));
    }

    std::mt19937_64 rng(seed);
    nlohmann::json stats = cache_stats(cache.db());
    for (int k = 0; k < events; ++k) {
        const std::uint64_t reads_before = load.reads.load();
        std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 2000));
        INFO("event " << k + 1 << "; daemon log:\n" << cache.daemon_stderr());
        // The mount served since the last event (at most 10 s after it).
        REQUIRE(wait_until([&] { return load.reads.load() > reads_before; }, 10));
        event(k);
        ++load.events;
        nlohmann::json now = cache_stats(cache.db());
        check_growing(stats, now, k + 1);
        stats = std::move(now);
    }
    REQUIRE(wait_until([&] { return load.reads.load() > 0; }, 10));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    load.stop = true;
    { std::ofstream(stop_file) << "stop\n"; }
    for (auto& c : children) CHECK(c->join(120).exit_code == 0);
    children.clear();

    LoadFigures figures;
    INFO("daemon log:\n" << cache.daemon_stderr());
    INFO("reads " << load.reads.load() << ", first error (op " << load.first_error_op.load()
                  << ", after " << load.first_error_events.load()
                  << " events): " << std::strerror(load.first_errno.load()));
    CHECK(load.read_errors.load() == 0);
    CHECK(load.mismatches.load() == 0);
    CHECK(load.store_errors.load() == 0);
    figures.reads = load.reads.load();
    figures.canceled += load.canceled.load();
    figures.longest_read_s = static_cast<double>(load.longest_read_ns.load()) / 1e9;
    for (int r = 0; r < kReaders; ++r)
        for (int i = 0; i < kHits; ++i) figures.pairs += load.pair_read[r][i].load();

    // Real Triton: every compile succeeded or failed with EIO.
    std::vector<std::string> first_round_ok;
    std::string first_round_dir;
    for (const auto& path : triton_results) {
        std::ifstream in(path);
        INFO("Triton's results " << path);
        REQUIRE(in.good());
        const auto results = nlohmann::json::parse(in, nullptr, false);
        REQUIRE_FALSE(results.is_discarded());
        for (const auto& round : results.at("rounds")) {
            for (const auto& kernel : round.at("kernels")) {
                const std::string outcome = kernel.at("outcome");
                INFO("Triton kernel " << kernel.dump() << " in " << round.at("dir"));
                CHECK((outcome == "ok" || outcome == "eio" || (cancels && outcome == "canceled")));
                ++figures.compiles;
                figures.compile_eio += outcome == "eio";
                figures.canceled += outcome == "canceled";
            }
        }
        if (path == triton_results.front() && !results.at("rounds").empty()) {
            const auto& first = results.at("rounds").front();
            first_round_dir = first.at("dir");
            for (const auto& kernel : first.at("kernels"))
                if (kernel.at("outcome") == "ok") first_round_ok.push_back(kernel.at("label"));
        }
    }
    if (full) CHECK(figures.compiles > 0);
    CHECK(figures.compile_eio == 0);  // no compile fails with EIO (spill.hpp)

    // The statistics agree with the entries, and each (entry, process) pair that read
    // counted one hit at most: none again after a new daemon took over.
    const nlohmann::json settled = settled_stats(cache.db());
    check_growing(stats, settled, events);
    const ProcResult ls = run_kcache(cache.db(), {"ls", "--json"});
    REQUIRE(ls.exit_code == 0);
    const auto entries = nlohmann::json::parse(ls.out);
    std::uint64_t bytes = 0, populated = 0, entry_hits = 0;
    for (const auto& e : entries) {
        bytes += e.at("bytes").get<std::uint64_t>();
        populated += e.at("populated").get<bool>();
        entry_hits += e.at("hits").get<std::uint64_t>();
    }
    {
        INFO("stats " << settled.dump() << "\n(entry, process) pairs that read: " << figures.pairs);
        CHECK(stat_value(settled, "entries") == entries.size());
        CHECK(stat_value(settled, "bytes") == bytes);
        CHECK(stat_value(settled, "misses") == populated);
        CHECK(stat_value(settled, "hits") == entry_hits);
        CHECK(stat_value(settled, "hits") <= figures.pairs);
        if (exact_hits) CHECK(stat_value(settled, "hits") == figures.pairs);
    }
    // A new process reading the hit entries counts each once, whichever daemon serves.
    REQUIRE(run_child([&] {
                for (int i = 0; i < kHits; ++i)
                    if (read_all(hit_path(cache, i)) != std::optional(hit_content(i))) return 1;
                return 0;
            }).exit_code == 0);
    // Waited for first: settled_stats alone once returned before the daemon had flushed
    // any of the 24 (1 of 11 runs over /dev/fuse and 1 of 12 over io_uring, with a kill
    // test running beside: load average above 20 on 2 cores).
    const std::uint64_t expected_hits = stat_value(settled, "hits") + kHits;
    wait_until([&] { return stat_value(cache_stats(cache.db()), "hits") >= expected_hits; }, 30);
    const nlohmann::json after_new = settled_stats(cache.db());
    CHECK(stat_value(after_new, "hits") == expected_hits);

    // A fresh Triton process loads the first round from the mount: no compile stage.
    if (full) {
        INFO("first round " << first_round_dir);
        REQUIRE_FALSE(first_round_ok.empty());
        std::string labels;
        for (const auto& l : first_round_ok) labels += (labels.empty() ? "" : ",") + l;
        ProcOptions options = python_options(300);
        options.env["TRITON_CACHE_DIR"] = first_round_dir;
        options.unset_env = {"PYTHONPATH", "PYTHONHOME"};
        const fs::path out = cache.root() / "triton-fresh.json";
        const ProcResult r = run_process(
            {KCACHE_COMPAT_PYTHON, KCACHE_TRITON_WORKER, "--out", out.string(), "--only", labels},
            options);
        INFO("triton_worker.py: " << r.describe());
        REQUIRE(r.exit_code == 0);
        std::ifstream in(out);
        const auto fresh = nlohmann::json::parse(in, nullptr, false);
        REQUIRE_FALSE(fresh.is_discarded());
        CHECK(fresh.at("kernels").size() == first_round_ok.size());
        for (const auto& kernel : fresh.at("kernels")) {
            INFO("loaded " << kernel.dump());
            CHECK(kernel.at("stages").empty());
        }
    }

    // Every store: done (byte-exact) or EIO (absent or complete).
    for (int w = 0; w < kWriters; ++w) {
        for (int n = 0; n < load.stores[w].load(); ++n) {
            const std::string path = store_dir(cache, w, n) + "/kernel.bin";
            const auto got = read_all(path);
            INFO("store " << w << "/" << n << " outcome " << int(load.outcomes[w][n]));
            figures.store_eio += load.outcomes[w][n] == eio || load.outcomes[w][n] == canceled;
            if (load.outcomes[w][n] == stored) {
                ++figures.stores;
                CHECK(got == std::optional<std::string>(store_content(w, n)));
            } else if (got) {  // EIO, or cut short by the end: absent or complete
                CHECK(*got == store_content(w, n));
            }
        }
    }
    if (full) CHECK(figures.stores > 0);
    if (exact_hits) CHECK(figures.store_eio == 0);
    // No writer loses its bytes to a kill (spill.hpp): EIO is no outcome of a store.
    std::size_t eio_stores = 0;
    for (int w = 0; w < kWriters; ++w)
        for (int n = 0; n < load.stores[w].load(); ++n) eio_stores += load.outcomes[w][n] == eio;
    CHECK(eio_stores == 0);
    CHECK(serving_daemon(keeper) > 0);  // the same keeper serves on
    const ProcResult v = run_kcache(cache.db(), {"verify"});
    INFO("kcache verify: " << v.describe());
    CHECK(v.exit_code == 0);
    figures.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf(
        "takeover: %d events; %llu reads, %llu failed, longest %.3f s; %zu stores, %zu failed "
        "with EIO or ECANCELED; %zu Triton compiles, %zu failed with EIO; %llu calls failed with "
        "ECANCELED; %llu (entry, process) pairs read; %.1f s\n",
        events, static_cast<unsigned long long>(figures.reads),
        static_cast<unsigned long long>(load.read_errors.load()), figures.longest_read_s,
        figures.stores, figures.store_eio, figures.compiles, figures.compile_eio,
        static_cast<unsigned long long>(figures.canceled),
        static_cast<unsigned long long>(figures.pairs), figures.wall_s);
    return figures;
}

// Installs `binary` at `path` as a package upgrade does (a new file renamed over the
// old one); returns the new file's inode.
ino_t install_over(const fs::path& binary, const fs::path& path) {
    const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".new");
    fs::copy_file(binary, tmp, fs::copy_options::overwrite_existing);
    fs::permissions(tmp, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    fs::rename(tmp, path);
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return st.st_ino;
}

// The inode of the binary process `pid` runs, 0 if it is gone.
ino_t exe_inode(pid_t pid) {
    struct stat st {};
    if (::stat(("/proc/" + std::to_string(pid) + "/exe").c_str(), &st) != 0) return 0;
    return st.st_ino;
}

}  // namespace

TEST_CASE("takeover: kill -9 of the serving daemon under load costs a pause, never a failed read",
          "[reliability][takeover]") {
    require_triton();
    const auto kills = static_cast<int>(env_u64("KCACHE_TAKEOVER_KILLS", 20));
    const auto seed = env_u64("KCACHE_TAKEOVER_SEED", 0x7a6e0ffull);
    std::printf("takeover: %d kills, seed %#llx (KCACHE_TAKEOVER_KILLS, KCACHE_TAKEOVER_SEED)\n",
                kills, static_cast<unsigned long long>(seed));
    MountedCache cache(DaemonOptions{.watchdog_s = 240.0 + kills * 6});
    const pid_t keeper = cache.daemon_pid();
    run_load(
        cache, kills, [&](int) { kill_serving_daemon(keeper); }, seed, false, Traffic::full,
        kill_cancels_calls());
}

// A broken kcache-fsd on disk (a half-built binary, a request that kills every daemon
// it is resent to) is a crash loop: the keeper starts a few at once, then waits longer
// each time, and ends the mount after keeper::kCrashLoopDeaths (10) short-lived daemons
// in a row (it used to restart them ~140 times a second, forever).
TEST_CASE("takeover: a daemon that dies as soon as it is ready ends the mount after a few tries",
          "[reliability][takeover]") {
    TempDir bin;
    const fs::path installed = bin / "kcache-fsd";
    install_over(KCACHE_FSD_PATH, installed);
    MountedCache cache(DaemonOptions{.watchdog_s = 120, .binary = installed});
    // The "binary" installed next says ready to the keeper ($KCACHE_FSD_SERVE names the
    // start-up socket third) and exits at once, counting its starts.
    const fs::path starts = bin / "starts";
    const fs::path script = bin / ".broken";
    {
        std::ofstream out(script);
        out << "#!/bin/bash\n"
            << "echo started >> '" << starts.string() << "'\n"
            << "ready=$(echo \"$KCACHE_FSD_SERVE\" | cut -d, -f3)\n"
            << "eval \"printf ready >&$ready\"\n"
            << "exit 3\n";
    }
    fs::permissions(script, fs::perms::owner_all);
    fs::rename(script, installed);
    const pid_t keeper = cache.daemon_pid();
    const pid_t first = serving_daemon(keeper);
    REQUIRE(first > 0);
    // The first daemon lives past keeper::kShortLife (0.5 s): its death is no crash loop.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    REQUIRE(::kill(first, SIGKILL) == 0);
    // The keeper gives up and unmounts (exit 1) within the backoff's sum (about 11 s).
    const int code = cache.signal_daemon(0, 60);
    const std::string log = cache.daemon_stderr();
    INFO("keeper's log:\n" << log);
    CHECK(code == 1);
    CHECK_FALSE(cache.mounted());
    const auto started = read_file(starts);
    const auto count = static_cast<int>(std::count(started.begin(), started.end(), '\n'));
    CHECK(count == 10);  // keeper::kCrashLoopDeaths (fsd/src/survival/keeper.hpp)
    CHECK(log.find("a crash loop") != std::string::npos);
    CHECK(log.find("starting another in 100 ms") != std::string::npos);
}

// 5 upgrades under run_load's traffic, each to a binary built separately: no client
// sees an error. Over io_uring each upgrade drains its rings (UringTransport::hand_over).
void upgrades_under_load(Traffic traffic) {
    // The keeper runs from a path of ours; each upgrade installs the other of two
    // different builds over it (kcache-fsd-next has a marker object linked in).
    const std::string marker = "kcache-fsd-next: a second build of kcache-fsd";
    REQUIRE(read_file(KCACHE_FSD_NEXT_PATH).find(marker) != std::string::npos);
    REQUIRE(read_file(KCACHE_FSD_PATH).find(marker) == std::string::npos);
    TempDir bin;
    const fs::path installed = bin / "kcache-fsd";
    install_over(KCACHE_FSD_PATH, installed);
    MountedCache cache(DaemonOptions{.watchdog_s = 300, .binary = installed});
    const pid_t keeper = cache.daemon_pid();
    double longest_end_s = 0;  // from an upgrade's exit to its old daemon's end
    const auto figures = run_load(
        cache, 5,
        [&](int k) {
            const pid_t before = serving_daemon(keeper);
            const ino_t ino =
                install_over(k % 2 == 0 ? KCACHE_FSD_NEXT_PATH : KCACHE_FSD_PATH, installed);
            const ProcResult r = run_process({KCACHE_FSD_PATH, "--upgrade", cache.mnt().string()});
            INFO("kcache-fsd --upgrade: " << r.describe());
            REQUIRE(r.exit_code == 0);
            const auto upgraded_at = std::chrono::steady_clock::now();
            // The successor runs the binary just installed; the old daemon may still be
            // finishing (it stopped reading first, then syncs the db and joins its threads).
            pid_t after = -1;
            const bool replaced = wait_until(
                [&] {
                    for (const pid_t d : children_of(keeper, /*include_zombies=*/false)) {
                        if (d != before && exe_inode(d) == ino) after = d;
                    }
                    return after > 0;
                },
                10);
            const bool old_ended =
                replaced && wait_until([&] { return serving_daemon(keeper) == after; }, 60);
            longest_end_s = std::max(
                longest_end_s,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - upgraded_at)
                    .count());
            if (!replaced || !old_ended) {
                std::string daemons;
                for (const pid_t d : children_of(keeper))
                    daemons += "daemon " + std::to_string(d) + ":\n" + describe_threads(d);
                INFO("upgrade " << k + 1 << " to inode " << ino << "; the keeper's children:\n"
                                << daemons << "daemon log now:\n"
                                << cache.daemon_stderr());
                CHECK(replaced);
                CHECK(old_ended);
            }
        },
        0x5eedull, true, traffic);
    if (traffic == Traffic::full) CHECK(figures.compiles > 0);
    std::printf("takeover: an old daemon ended at most %.2f s after its upgrade returned\n",
                longest_end_s);
    const std::string log = cache.daemon_stderr();
    CHECK(log.find("handed the mount over") != std::string::npos);
    if (io_uring_run()) {
        // Every upgrade filled its rings' idle entries before their threads ended, so
        // the kernel handed no request to an ending thread.
        INFO("daemon log:\n" << log);
        CHECK(count_occurrences(log, "the rings keep every request that came for the successor") ==
              5);
        CHECK(log.find("ring entries still wait in the kernel") == std::string::npos);
    }
}

TEST_CASE("takeover: kcache-fsd --upgrade under load: no client sees an error",
          "[reliability][takeover][upgrade]") {
    // Over io_uring this load (mkdirs, renames, Triton) once stalled the mount about once
    // in 15 runs, upgrade or not: a LOOKUP whose caller held a directory lock waited in
    // the kernel's queue for a commit that never came (Ring::register_entry says why).
    require_triton();
    upgrades_under_load(Traffic::full);
}

TEST_CASE("takeover: kcache-fsd --upgrade under a read load: no read fails",
          "[reliability][takeover][upgrade]") {
    // Over io_uring the upgrade drains its rings (the log lines checked above; without
    // the drain this test stalled in 3 of 3 runs).
    upgrades_under_load(Traffic::reads);
}

TEST_CASE_METHOD(KeptMount, "takeover: open files survive a new daemon",
                 "[reliability][takeover]") {
    const std::string a = random_bytes(300000, 1), c = random_bytes(5000, 3);
    REQUIRE(write_all(cache.p("a.bin"), a) == 0);
    REQUIRE(write_all(cache.p("c.bin"), c) == 0);

    Fd reader(::open(cache.p("a.bin").c_str(), O_RDONLY));
    REQUIRE_SYS(reader.get());
    std::string head(1000, '\0');
    REQUIRE(::read(reader.get(), head.data(), head.size()) == 1000);
    // A writer with bytes nobody published, and one whose bytes are all published.
    Fd unfinished(::open(cache.p("b.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    REQUIRE_SYS(unfinished.get());
    REQUIRE(write_fd(unfinished.get(), "unpublished") == 0);
    Fd clean(::open(cache.p("c.bin").c_str(), O_WRONLY | O_APPEND));
    REQUIRE_SYS(clean.get());
    REQUIRE(write_fd(clean.get(), "more") == 0);
    REQUIRE_SYS(::fsync(clean.get()));

    kill_serving_daemon(keeper);
    INFO("daemon log:\n" << cache.daemon_stderr());

    // The reader reads on, byte-exact (through the new daemon or the kernel's pages).
    const auto rest = read_rest(reader.get(), kill_cancels_calls());
    INFO("the reader's read: " << std::strerror(errno));
    REQUIRE(rest.has_value());
    CHECK(head + *rest == a);
    // The writer with unpublished bytes writes on: they outlived the daemon in its
    // spill file (fsd/src/survival/spill.hpp), and its close publishes them with the new ones.
    REQUIRE(write_fd(unfinished.get(), "+more") == 0);
    REQUIRE_SYS(::fsync(unfinished.get()));
    REQUIRE(write_fd(unfinished.get(), "+end") == 0);
    REQUIRE_SYS(unfinished.close());
    CHECK(read_all(cache.p("b.bin")) == std::optional<std::string>("unpublished+more+end"));
    CHECK(cache.daemon_stderr().find("taken over from its spill file") != std::string::npos);

    // The clean writer writes on.
    REQUIRE(write_fd(clean.get(), "tail") == 0);
    REQUIRE_SYS(clean.close());
    CHECK(read_all(cache.p("c.bin")) == std::optional<std::string>(c + "moretail"));
    // Each spill file went with its version (at the RELEASE, after close returned).
    CHECK(wait_until([&] { return fs::is_empty(cache.db() / "spill"); }, 5));
}

TEST_CASE_METHOD(
    KeptMount,
    "takeover: writers sharing a file write on across kills, one with no spill file gets EIO",
    "[reliability][takeover]") {
    const std::string base = random_bytes(200000, 7);
    REQUIRE(write_all(cache.p("shared.bin"), base) == 0);
    // Two descriptors of one file (one version, versions.hpp), each with bytes unpublished.
    Fd one(::open(cache.p("shared.bin").c_str(), O_RDWR));
    Fd two(::open(cache.p("shared.bin").c_str(), O_RDWR));
    REQUIRE_SYS(one.get());
    REQUIRE_SYS(two.get());
    // And a writer of another file that writes only after the first kill: rebuilt with
    // a version of this daemon's, whose spill file the next successor must find.
    REQUIRE(write_all(cache.p("idle.bin"), "idle writer") == 0);
    Fd idle(::open(cache.p("idle.bin").c_str(), O_RDWR));
    REQUIRE_SYS(idle.get());
    REQUIRE(::pwrite(one.get(), "11111", 5, 10) == 5);
    REQUIRE(::pwrite(two.get(), "22222", 5, 199998) == 5);  // past the end: it grows
    kill_serving_daemon(keeper);
    REQUIRE(::pwrite(two.get(), "33333", 5, 100000) == 5);
    REQUIRE(::pwrite(idle.get(), "IDLE", 4, 0) == 4);
    kill_serving_daemon(keeper);  // again, with the version rebuilt from its spill file
    REQUIRE(::pwrite(one.get(), "44444", 5, 0) == 5);
    {
        const int closed_one = one.close(), err_one = errno;
        const int closed_two = two.close(), err_two = errno;
        const int closed_idle = idle.close(), err_idle = errno;
        INFO("daemon log:\n" << cache.daemon_stderr());
        INFO("close: " << std::strerror(err_one) << ", " << std::strerror(err_two) << ", "
                       << std::strerror(err_idle));
        REQUIRE(closed_one == 0);
        REQUIRE(closed_two == 0);
        REQUIRE(closed_idle == 0);
    }
    CHECK(read_all(cache.p("idle.bin")) == std::optional<std::string>("IDLE writer"));
    std::string expected = base;
    expected.replace(10, 5, "11111");
    expected.resize(200003);
    expected.replace(199998, 5, "22222");
    expected.replace(100000, 5, "33333");
    expected.replace(0, 5, "44444");
    INFO("daemon log:\n" << cache.daemon_stderr());
    CHECK(read_all(cache.p("shared.bin")) == std::optional<std::string>(expected));

    // Where no spill file can be made (its directory is a file here; a full disk in
    // life), the writer is told at no write, and a kill then costs it its bytes (EIO).
    CHECK(wait_until([&] { return fs::is_empty(cache.db() / "spill"); }, 5));
    fs::remove(cache.db() / "spill");
    write_file(cache.db() / "spill", "in the way");
    Fd blocked(::open(cache.p("blocked.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    REQUIRE_SYS(blocked.get());
    REQUIRE(write_fd(blocked.get(), "kept in memory only") == 0);
    kill_serving_daemon(keeper);
    REQUIRE_FAILS_WITH(::write(blocked.get(), "x", 1), EIO);
    REQUIRE_FAILS_WITH(blocked.close(), EIO);
    CHECK(cache.daemon_stderr().find("no longer kept for a successor") != std::string::npos);

    // A spill directory removed while the mount serves is made again at a writer's first
    // change: the daemon makes it once, and again when a file cannot be made in it.
    fs::remove(cache.db() / "spill");  // the file in the way
    REQUIRE(write_all(cache.p("first.bin"), "this daemon makes the directory") == 0);
    REQUIRE(wait_until(
        [&] {
            return fs::is_directory(cache.db() / "spill") && fs::is_empty(cache.db() / "spill");
        },
        5));
    fs::remove(cache.db() / "spill");
    Fd again(::open(cache.p("again.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    REQUIRE_SYS(again.get());
    REQUIRE(write_fd(again.get(), "kept on disk") == 0);
    kill_serving_daemon(keeper);
    {
        const int closed = again.close(), err = errno;
        INFO("daemon log:\n" << cache.daemon_stderr() << "close: " << std::strerror(err));
        REQUIRE(closed == 0);
    }
    CHECK(read_all(cache.p("again.bin")) == std::optional<std::string>("kept on disk"));
}

TEST_CASE("takeover: the daemon's request buffers are resident before a request lands in them",
          "[reliability][takeover]") {
    // The kernel ends a request it cannot copy whole into the reading daemon's buffer
    // with EIO, and a daemon being killed cannot take a page fault: a big WRITE copied
    // onto untouched pages of the buffer at a kill failed, and a buffered write() split
    // in several WRITEs returned short (fsstress lost such tails 1 run in 12). The
    // buffers are touched and locked before each thread's first read (takeover.cpp,
    // make_resident): the daemon has at least one whole buffer (about 1 MiB) locked.
    if (::geteuid() != 0) skip("mlock beyond RLIMIT_MEMLOCK needs root");
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    skip("the sanitizers' runtimes make mlock a no-op (scripts/tsan.sh builds the daemon so)");
#endif
    MountedCache cache;
    REQUIRE(write_all(cache.p("big.bin"), random_bytes(4 << 20, 5)) == 0);
    const pid_t daemon = serving_daemon(cache.daemon_pid());
    REQUIRE(daemon > 0);
    const auto status = read_all("/proc/" + std::to_string(daemon) + "/status");
    REQUIRE(status);
    const auto at = status->find("VmLck:");
    REQUIRE(at != std::string::npos);
    const long locked_kib = std::strtol(status->c_str() + at + 6, nullptr, 10);
    INFO(status->substr(at, 40));
    CHECK(locked_kib >= 1024);
}

TEST_CASE_METHOD(KeptMount,
                 "takeover: a reader opened while a writer writes reads on across a kill",
                 "[reliability][takeover]") {
    const std::string base = random_bytes(100000, 11);
    REQUIRE(write_all(cache.p("followed.bin"), base) == 0);
    Fd writer(::open(cache.p("followed.bin").c_str(), O_RDWR));
    REQUIRE_SYS(writer.get());
    REQUIRE(::pwrite(writer.get(), "WRITTEN", 7, 50000) == 7);
    // Opened while the writer is at work: it reads the writer's version (a follower).
    Fd reader(::open(cache.p("followed.bin").c_str(), O_RDONLY));
    REQUIRE_SYS(reader.get());
    kill_serving_daemon(keeper);
    std::string expected = base;
    expected.replace(50000, 7, "WRITTEN");
    std::string got(expected.size(), '\0');
    const ssize_t n = ::pread(reader.get(), got.data(), got.size(), 0);
    INFO("daemon log:\n" << cache.daemon_stderr());
    REQUIRE(n == static_cast<ssize_t>(expected.size()));  // was 0: an empty version
    const auto differs = std::mismatch(got.begin(), got.end(), expected.begin());
    INFO("the first byte that differs: " << (differs.first - got.begin()));
    CHECK(got == expected);
    REQUIRE(writer.close() == 0);
    REQUIRE(reader.close() == 0);
    CHECK(read_all(cache.p("followed.bin")) == std::optional<std::string>(expected));
}

TEST_CASE("takeover: a fresh mount removes the spill files a dead mount left",
          "[reliability][takeover]") {
    MountedCache cache;
    cache.unmount();
    fs::create_directories(cache.db() / "spill");
    write_file(cache.db() / "spill" / "7.42", "a dead mount's writer");
    write_file(cache.db() / "spill" / "7.43.new", "cut short");
    cache.mount();
    CHECK(fs::is_empty(cache.db() / "spill"));
}

// ---- unlinked-but-open files across a takeover (core/holds.hpp) ---------------------

// The holds on blobs in `db` (core/holds.hpp), counted, read through core.
std::uint64_t held_blobs(const fs::path& db) {
    kcache::core::OpenOptions options;
    options.path = db.string();
    options.create = false;
    options.read_only = true;
    auto store = kcache::core::Store::open(options);
    REQUIRE(store);
    auto txn = (*store)->read();
    REQUIRE(txn);
    std::uint64_t n = 0;
    REQUIRE(kcache::core::for_each_hold(*txn, [&](const kcache::core::Digest&, std::uint64_t c) {
        n += c;
        return true;
    }));
    return n;
}

std::uint64_t blobs_in(const fs::path& db) {
    return stat_value(cache_stats(db), "blobs");
}

void check_verify_clean(const fs::path& db) {
    const ProcResult r = run_kcache(db, {"verify"});
    INFO("kcache verify: " << r.describe());
    CHECK(r.exit_code == 0);
}

// How the version a reader has open leaves the db: its file unlinked, renamed over, or
// rewritten in place (O_TRUNC) by another process.
enum class Removal { unlink, rename_over, rewrite };
enum class Event { kill, upgrade };

// A reader has a file open; another process removes it (unlink, or a rename over it)
// or rewrites it (O_TRUNC); the serving daemon is replaced (kill -9, or --upgrade). The reader
// reads the file's content to its end, byte-exact, and closes; then its blob is gone from the db.
void removed_while_open(MountedCache& cache, pid_t keeper, Removal removal, Event event) {
    // Big enough that the kernel's readahead cannot have read it all before the event:
    // the new daemon must serve the rest.
    const std::string content = random_bytes(3 << 20, 20);
    const std::uint64_t blobs_before = blobs_in(cache.db());
    fs::create_directories(cache.path("k"));
    REQUIRE(write_all(cache.p("k/held.bin"), content) == 0);

    Fd reader(::open(cache.p("k/held.bin").c_str(), O_RDONLY));
    REQUIRE_SYS(reader.get());
    std::string head(1000, '\0');
    REQUIRE(::read(reader.get(), head.data(), head.size()) == 1000);

    // Another process removes the file.
    const std::string replacement = "another version";
    if (removal == Removal::unlink) {
        const ProcResult r = run_process({"rm", cache.p("k/held.bin")});
        REQUIRE(r.exit_code == 0);
    } else if (removal == Removal::rename_over) {
        REQUIRE(write_all(cache.p("k/new.tmp"), replacement) == 0);
        const ProcResult r = run_process({"mv", cache.p("k/new.tmp"), cache.p("k/held.bin")});
        REQUIRE(r.exit_code == 0);
    } else {
        const ProcResult r = run_process(
            {"sh", "-c", "printf %s \"$1\" > \"$2\"", "sh", replacement, cache.p("k/held.bin")});
        REQUIRE(r.exit_code == 0);
    }
    CHECK(held_blobs(cache.db()) >= 1);  // taken with the removal or the publish

    if (event == Event::kill) {
        kill_serving_daemon(keeper);
    } else {
        const pid_t before = serving_daemon(keeper);
        const ProcResult r = run_process({KCACHE_FSD_PATH, "--upgrade", cache.mnt().string()});
        INFO("kcache-fsd --upgrade: " << r.describe());
        REQUIRE(r.exit_code == 0);
        REQUIRE(wait_until(
            [&] {
                const pid_t now = serving_daemon(keeper);
                return now > 0 && now != before;
            },
            10));
    }
    INFO("daemon log:\n" << cache.daemon_stderr());

    const auto rest = read_rest(reader.get(), event == Event::kill && kill_cancels_calls());
    INFO("the reader's read: " << std::strerror(errno));
    REQUIRE(rest.has_value());
    CHECK(rest->size() == content.size() - head.size());
    CHECK((head + *rest == content));
    check_verify_clean(cache.db());  // with the hold present
    REQUIRE_SYS(reader.close());

    // The close released the hold: the blob is gone (RELEASE is asynchronous).
    const std::uint64_t expected = blobs_before + (removal == Removal::unlink ? 0 : 1);
    CHECK(wait_until([&] { return held_blobs(cache.db()) == 0; }, 10));
    CHECK(blobs_in(cache.db()) == expected);
    if (removal != Removal::unlink) {
        CHECK(read_all(cache.p("k/held.bin")) == std::optional<std::string>(replacement));
    }
    check_verify_clean(cache.db());
}

TEST_CASE_METHOD(KeptMount,
                 "takeover: an unlinked file open for reading reads to its end across a kill -9",
                 "[reliability][takeover][holds]") {
    removed_while_open(cache, keeper, Removal::unlink, Event::kill);
}

TEST_CASE_METHOD(KeptMount,
                 "takeover: a file renamed over while open reads to its end across a kill -9",
                 "[reliability][takeover][holds]") {
    removed_while_open(cache, keeper, Removal::rename_over, Event::kill);
}

TEST_CASE_METHOD(
    KeptMount,
    "takeover: a file rewritten with O_TRUNC while open reads its old version across a kill -9",
    "[reliability][takeover][holds]") {
    removed_while_open(cache, keeper, Removal::rewrite, Event::kill);
}

TEST_CASE_METHOD(
    KeptMount,
    "takeover: a file rewritten with O_TRUNC while open reads its old version across an upgrade",
    "[reliability][takeover][holds][upgrade]") {
    removed_while_open(cache, keeper, Removal::rewrite, Event::upgrade);
}

TEST_CASE_METHOD(KeptMount,
                 "takeover: an unlinked file open for reading reads to its end across an upgrade",
                 "[reliability][takeover][holds][upgrade]") {
    removed_while_open(cache, keeper, Removal::unlink, Event::upgrade);
}

TEST_CASE("takeover: a fresh mount clears the holds a previous mount left",
          "[reliability][takeover][holds]") {
    MountedCache cache;
    const std::string content = random_bytes(100000, 21);
    const std::uint64_t blobs_before = blobs_in(cache.db());
    fs::create_directories(cache.path("k"));
    REQUIRE(write_all(cache.p("k/stale.bin"), content) == 0);
    cache.unmount();
    // What a mount whose keeper died with a reader open leaves: the file removed and
    // its blob held, in one transaction.
    {
        kcache::core::OpenOptions options;
        options.path = cache.db().string();
        options.create = false;
        auto store = kcache::core::Store::open(options);
        REQUIRE(store);
        auto txn = (*store)->write();
        REQUIRE(txn);
        auto dir = txn->resolve("k");
        REQUIRE(dir);
        auto attr = txn->lookup(*dir, "stale.bin");
        REQUIRE(attr);
        REQUIRE(kcache::core::hold_blob(*txn, attr->digest));
        REQUIRE(txn->unlink(*dir, "stale.bin"));
        REQUIRE(txn->commit());
    }
    CHECK(held_blobs(cache.db()) == 1);
    CHECK(blobs_in(cache.db()) == blobs_before + 1);
    check_verify_clean(cache.db());  // a hold is a reference

    cache.mount();  // the keeper's first daemon on a new state: a fresh mount
    INFO("daemon log:\n" << cache.daemon_stderr());
    CHECK(held_blobs(cache.db()) == 0);
    CHECK(blobs_in(cache.db()) == blobs_before);
    CHECK(cache.daemon_stderr().find("cleared 1 holds") != std::string::npos);
    check_verify_clean(cache.db());
}

TEST_CASE("takeover: with keeper and daemon killed, kcache-fsd recovers the dead mount",
          "[reliability][takeover]") {
    MountedCache cache;
    REQUIRE(write_all(cache.p("kept.bin"), "still here") == 0);
    CHECK(cache.signal_daemon(SIGKILL) == -1);  // the keeper; its daemon dies with it
    // The mount is dead: ENOTCONN or ECONNABORTED. Over io_uring a request the dying
    // rings held is first answered ECANCELED.
    struct stat st {};
    int err = 0;
    const bool dead = wait_until(
        [&] {
            err = ::stat(cache.mnt().c_str(), &st) != 0 ? errno : 0;
            return err == ENOTCONN || err == ECONNABORTED;
        },
        10);
    INFO("stat of the dead mount: " << std::strerror(err));
    REQUIRE(dead);
    // Started again as an operator (or systemd's Restart=) would: no fusermount3 first.
    std::vector<std::string> argv{KCACHE_FSD_PATH, "--db", cache.db().string()};
    if (io_uring_run()) argv.emplace_back("--io-uring");
    argv.push_back(cache.mnt().string());
    const ProcResult r = run_process(argv);
    INFO("kcache-fsd on the dead mount: " << r.describe() << "\nlog:\n" << cache.daemon_stderr());
    REQUIRE(r.exit_code == 0);
    CHECK(read_all(cache.p("kept.bin")) == std::optional<std::string>("still here"));
    REQUIRE(write_all(cache.p("new.bin"), "works") == 0);
    CHECK(read_all(cache.p("new.bin")) == std::optional<std::string>("works"));
    CHECK(r.err.find("was a dead mount") != std::string::npos);
    // The daemonized keeper ends with the unmount.
    const pid_t keeper = find_daemon_with_arg(cache.mnt().string());
    REQUIRE(keeper > 0);
    const ProcResult u = run_process({"fusermount3", "-u", cache.mnt().string()});
    REQUIRE(u.exit_code == 0);
    CHECK(wait_until([&] { return ::kill(keeper, 0) != 0; }, 20));
}

namespace {

// A mount whose daemon kills itself after the commit of the first `op`, before its
// reply (KCACHE_FSD_FAULT, fsd/src/survival/resend.hpp; with `point` kill_before_reply, before
// the reply whatever the outcome); the keeper starts another, which gets the request
// resent.
struct FaultyMount {
    explicit FaultyMount(const std::string& op, const std::string& point = "kill_after_commit") {
        ::setenv("KCACHE_FSD_FAULT", (point + "=" + op).c_str(), 1);
        cache = std::make_unique<MountedCache>();
        ::unsetenv("KCACHE_FSD_FAULT");
        keeper = cache->daemon_pid();
        first = serving_daemon(keeper);
    }
    // A call that must succeed; the daemons' log explains a failure.
    void ok(long rc, const char* what) const {
        const int err = errno;
        INFO(what << " -> " << rc << " (" << std::strerror(err) << ")\ndaemon log:\n"
                  << cache->daemon_stderr());
        REQUIRE(rc >= 0);
    }
    // The daemon died of the fault point and another one serves.
    void check_taken_over() const {
        INFO("daemon log:\n" << cache->daemon_stderr());
        CHECK(cache->daemon_stderr().find("KCACHE_FSD_FAULT: killing this daemon") !=
              std::string::npos);
        const pid_t now = serving_daemon(keeper);
        CHECK(now > 0);
        CHECK(now != first);
    }
    std::unique_ptr<MountedCache> cache;
    pid_t keeper = -1, first = -1;
};

}  // namespace

TEST_CASE("takeover: a resent non-idempotent request gets its first answer",
          "[reliability][takeover][resend]") {
    SECTION("mkdir") {
        FaultyMount m("mkdir");
        m.ok(::mkdir(m.cache->p("d").c_str(), 0755), "mkdir");  // not EEXIST
        m.check_taken_over();
        struct stat st {};
        REQUIRE_SYS(::stat(m.cache->p("d").c_str(), &st));
        CHECK(S_ISDIR(st.st_mode));
    }
    SECTION("O_EXCL create") {
        FaultyMount m("create");
        Fd lock(::open(m.cache->p("lock").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
        m.ok(lock.get(), "open O_EXCL");  // its creator does not get EEXIST
        REQUIRE(write_fd(lock.get(), "pid 1") == 0);
        REQUIRE_SYS(lock.close());
        m.check_taken_over();
        CHECK(read_all(m.cache->p("lock")) == std::optional<std::string>("pid 1"));
        // Another O_EXCL create of it still fails.
        REQUIRE_FAILS_WITH(::open(m.cache->p("lock").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644),
                           EEXIST);
    }
    SECTION("rename") {
        FaultyMount m("rename");
        REQUIRE(write_all(m.cache->p("tmp"), "content") == 0);
        m.ok(::rename(m.cache->p("tmp").c_str(), m.cache->p("final").c_str()), "rename");
        m.check_taken_over();
        CHECK(read_all(m.cache->p("final")) == std::optional<std::string>("content"));
        CHECK_FALSE(read_all(m.cache->p("tmp")).has_value());
    }
    SECTION("unlink") {
        FaultyMount m("unlink");
        REQUIRE(write_all(m.cache->p("f"), "content") == 0);
        m.ok(::unlink(m.cache->p("f").c_str()), "unlink");  // not ENOENT
        m.check_taken_over();
        CHECK_FALSE(read_all(m.cache->p("f")).has_value());
    }
    SECTION("rmdir") {
        FaultyMount m("rmdir");
        REQUIRE_SYS(::mkdir(m.cache->p("d").c_str(), 0755));
        m.ok(::rmdir(m.cache->p("d").c_str()), "rmdir");  // not ENOENT
        m.check_taken_over();
    }
    SECTION("mknod") {
        FaultyMount m("mknod");
        m.ok(::mknod(m.cache->p("fifo").c_str(), S_IFIFO | 0644, 0), "mknod");  // not EEXIST
        m.check_taken_over();
        struct stat st {};
        REQUIRE_SYS(::lstat(m.cache->p("fifo").c_str(), &st));
        CHECK(S_ISFIFO(st.st_mode));
    }
    SECTION("link") {
        FaultyMount m("link");
        REQUIRE_SYS(::mkdir(m.cache->p("k").c_str(), 0755));  // one entry: links stay inside
        REQUIRE(write_all(m.cache->p("k/f"), "content") == 0);
        m.ok(::link(m.cache->p("k/f").c_str(), m.cache->p("k/g").c_str()), "link");  // not EEXIST
        m.check_taken_over();
        CHECK(read_all(m.cache->p("k/g")) == std::optional<std::string>("content"));
        struct stat st {};
        REQUIRE_SYS(::stat(m.cache->p("k/f").c_str(), &st));
        CHECK(st.st_nlink == 2);
    }
    SECTION("setxattr XATTR_CREATE") {
        FaultyMount m("setxattr");
        REQUIRE(write_all(m.cache->p("f"), "content") == 0);
        const std::string f = m.cache->p("f");
        m.ok(::setxattr(f.c_str(), "user.k", "v1", 2, XATTR_CREATE), "setxattr");  // not EEXIST
        m.check_taken_over();
        char value[8] = {};
        CHECK(::getxattr(f.c_str(), "user.k", value, sizeof value) == 2);
        CHECK(std::string(value) == "v1");
        REQUIRE_FAILS_WITH(::setxattr(f.c_str(), "user.k", "v2", 2, XATTR_CREATE), EEXIST);
    }
    SECTION("removexattr") {
        FaultyMount m("removexattr");
        REQUIRE(write_all(m.cache->p("f"), "content") == 0);
        const std::string f = m.cache->p("f");
        REQUIRE_SYS(::setxattr(f.c_str(), "user.k", "v", 1, 0));
        m.ok(::removexattr(f.c_str(), "user.k"), "removexattr");  // not ENODATA
        m.check_taken_over();
        REQUIRE_FAILS_WITH(::getxattr(f.c_str(), "user.k", nullptr, 0), ENODATA);
    }
    SECTION("removexattr of an attribute that never existed") {
        // Resent with nothing committed: the redo's ENODATA, not a guessed success.
        FaultyMount m("removexattr", "kill_before_reply");
        REQUIRE(write_all(m.cache->p("f"), "content") == 0);
        const std::string f = m.cache->p("f");
        REQUIRE_FAILS_WITH(::removexattr(f.c_str(), "user.never"), ENODATA);
        m.check_taken_over();
    }
}

TEST_CASE("takeover: the systemd unit in docs/operations.md verifies, and the keeper says READY=1",
          "[reliability][takeover][systemd]") {
    const ProcResult which = run_process({"sh", "-c", "command -v systemd-analyze"});
    if (which.exit_code != 0)
        skip("systemd-analyze is not installed (Debian: apt-get install systemd)");
    // The unit, as the docs show it, with the built binary for /usr/local/bin's.
    const fs::path docs = fs::path(KCACHE_FSD_FLOWS_DIR) / "../../../docs/operations.md";
    std::ifstream in(docs);
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    const std::string all = text.str();
    const auto begin = all.find("<!-- kcache.service begin -->");
    const auto end = all.find("<!-- kcache.service end -->");
    REQUIRE(begin != std::string::npos);
    REQUIRE(end != std::string::npos);
    std::string unit = all.substr(begin, end - begin);
    unit = unit.substr(unit.find("```ini\n") + 7);
    unit = unit.substr(0, unit.find("```"));
    const std::string installed = "/usr/local/bin/kcache-fsd";
    REQUIRE(unit.find(installed) != std::string::npos);
    unit.replace(unit.find(installed), installed.size(), KCACHE_FSD_PATH);
    TempDir dir;
    const fs::path file = dir.path() / "kcache.service";
    {
        std::ofstream out(file);
        out << unit;
    }
    const ProcResult v = run_process({"systemd-analyze", "verify", file.string()});
    INFO("systemd-analyze verify:\n" << v.describe() << "\nunit:\n" << unit);
    CHECK(v.exit_code == 0);
    CHECK(v.err.find("kcache.service") == std::string::npos);  // no complaint about it

    // Type=notify: the keeper tells $NOTIFY_SOCKET READY=1 and its pid once it serves.
    const fs::path socket_path = dir.path() / "notify";
    Fd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    REQUIRE_SYS(sock.get());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
    REQUIRE_SYS(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr));
    ::setenv("NOTIFY_SOCKET", socket_path.c_str(), 1);
    MountedCache cache;
    ::unsetenv("NOTIFY_SOCKET");
    timeval timeout{10, 0};
    REQUIRE_SYS(::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout));
    // Before it, the files for systemd's fd store (FDSTORE=1; their own test below).
    std::string message;
    for (int i = 0; i < 8 && message.rfind("READY=1", 0) != 0; ++i) {
        char buf[256] = {};
        const ssize_t n = ::recv(sock.get(), buf, sizeof buf - 1, 0);  // fds: dropped
        REQUIRE(n > 0);
        message.assign(buf, static_cast<std::size_t>(n));
    }
    CHECK(message == "READY=1\nMAINPID=" + std::to_string(cache.daemon_pid()));
}

// ---- systemd's fd store (fsd/src/survival/fd_store.hpp) ----
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "scoped_env.hpp"

extern char** environ;
//
// The test plays systemd: a notify socket that keeps the files the keeper sends with
// FDSTORE=1, then a restart with LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES. Nothing here may
// hang: every wait is bounded, every process it starts is killed and reaped on every
// path, and the test's copies of /dev/fuse are closed before any child is reaped (a
// child whose request a dead daemon had read waits, unkillable, until the connection
// ends, and the connection lives while any copy is open).
namespace fdstore {

constexpr const char* kFuse = "kcache-fuse";
constexpr const char* kState = "kcache-state";
constexpr const char* kLock = "kcache-lock";

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Whether `pid` (not necessarily our child) has ended: gone, or a zombie.
bool ended(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    if (!std::getline(in, stat)) return true;
    const auto close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() &&
           (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

// The mount id and device (major:minor) /proc/self/mountinfo gives `mnt`; "" if none.
std::pair<std::string, std::string> mount_of(const fs::path& mnt) {
    std::ifstream in("/proc/self/mountinfo");
    std::pair<std::string, std::string> found;
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string id, parent, dev, root, point;
        fields >> id >> parent >> dev >> root >> point;
        if (point == mnt.string()) found = {id, dev};
    }
    return found;
}

// Ends the FUSE connection of device `dev` ("0:NN") through fusectl, where it is
// mounted: the last resort for a child stuck in a request nobody will answer.
void abort_connection(const std::string& dev) {
    const auto colon = dev.find(':');
    if (colon == std::string::npos) return;
    std::ofstream abort("/sys/fs/fuse/connections/" + dev.substr(colon + 1) + "/abort");
    if (abort) abort << "1";
}

// Closes this process's copies of /dev/fuse: a forked child must not hold one (the
// connection would live as long as the child, and the child could then wait forever
// on a request of that connection).
void close_fuse_copies() {
    for (int fd = 3; fd < 1024; ++fd) {
        char link[64] = {};
        const std::string self = "/proc/self/fd/" + std::to_string(fd);
        if (::readlink(self.c_str(), link, sizeof link - 1) > 0 && std::string(link) == "/dev/fuse")
            ::close(fd);
    }
}

// A process this test forked: killed and reaped on every path, each wait bounded.
class Forked {
  public:
    Forked() = default;
    explicit Forked(pid_t pid) : m_pid(pid) {}
    // Runs `fn` in a child (no Catch2 in it); its return value is the exit code.
    static Forked run(const std::function<int()>& fn) {
        std::fflush(nullptr);
        const pid_t parent = ::getpid();
        const pid_t pid = ::fork();
        if (pid == 0) {
            // Ends with the test, even one the watchdog ends (_Exit).
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) std::_Exit(1);
            close_fuse_copies();
            int code = 101;
            try {
                code = fn();
            } catch (...) {
            }
            std::_Exit(code);
        }
        return Forked(pid);
    }
    Forked(Forked&& o) noexcept : m_pid(std::exchange(o.m_pid, -1)) {}
    Forked& operator=(Forked&& o) noexcept {
        end();
        m_pid = std::exchange(o.m_pid, -1);
        return *this;
    }
    ~Forked() { end(); }
    pid_t pid() const { return m_pid; }
    // Waits up to `timeout_s`: the exit code (-1: killed by a signal), or nullopt while
    // it runs.
    std::optional<int> wait(double timeout_s) {
        const auto start = std::chrono::steady_clock::now();
        while (m_pid > 0) {
            int status = 0;
            const pid_t r = ::waitpid(m_pid, &status, WNOHANG);
            if (r == m_pid || (r < 0 && errno == ECHILD)) {
                m_pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            }
            if (seconds_since(start) > timeout_s) return std::nullopt;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return -1;
    }
    // SIGKILL and reap, 10 s at most (then `stuck` runs and it gets 10 s more).
    void end(const std::function<void()>& stuck = {}) {
        if (m_pid <= 0) return;
        ::kill(m_pid, SIGKILL);
        if (wait(10)) return;
        if (stuck) stuck();
        if (!wait(10))
            std::fprintf(stderr, "fd store test: process %d could not be reaped\n", m_pid);
        m_pid = -1;
    }

  private:
    pid_t m_pid = -1;
};

// systemd's side: $NOTIFY_SOCKET, and the store it keeps (FDSTORE=1, FDSTOREREMOVE=1).
class FakeSystemd {
  public:
    FakeSystemd() : m_path((m_dir.path() / "notify").string()) {
        m_sock = Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
        REQUIRE_SYS(m_sock.get());
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        REQUIRE(m_path.size() < sizeof addr.sun_path);
        std::strncpy(addr.sun_path, m_path.c_str(), sizeof addr.sun_path - 1);
        REQUIRE_SYS(::bind(m_sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr));
    }
    const std::string& path() const { return m_path; }

    // Receives messages until `done` holds (true) or `timeout_s` passes (false).
    bool receive_until(const std::function<bool()>& done, double timeout_s) {
        const auto start = std::chrono::steady_clock::now();
        while (!done()) {
            const double left = timeout_s - seconds_since(start);
            if (left <= 0) return false;
            pollfd p{m_sock.get(), POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(std::min(left, 0.1) * 1000) + 1) == 1) receive_one();
        }
        return true;
    }
    // Takes whatever is queued now.
    void drain() {
        pollfd p{m_sock.get(), POLLIN, 0};
        while (::poll(&p, 1, 0) == 1) receive_one();
    }
    int count(const std::string& prefix) const {
        int n = 0;
        for (const auto& m : messages) n += m.rfind(prefix, 0) == 0;
        return n;
    }
    bool removed(const std::string& name) const {
        for (const auto& m : messages)
            if (m == "FDSTOREREMOVE=1\nFDNAME=" + name) return true;
        return false;
    }
    int stored(const std::string& name) const {
        const auto it = store.find(name);
        return it == store.end() ? -1 : it->second.get();
    }

    std::vector<std::string> messages;
    std::map<std::string, Fd> store;    // by FDNAME
    std::map<std::string, Fd> dropped;  // taken out by FDSTOREREMOVE=1 (kept for the test)

  private:
    void receive_one() {
        char buf[4096];
        iovec iov{buf, sizeof buf};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)] = {};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        const ssize_t n = ::recvmsg(m_sock.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) return;
        std::vector<Fd> fds;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (std::size_t i = 0; i < k; ++i) {
                int fd = -1;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                fds.emplace_back(fd);
            }
        }
        const std::string text(buf, static_cast<std::size_t>(n));
        messages.push_back(text);
        std::string name;
        const auto at = text.find("FDNAME=");
        if (at != std::string::npos) name = text.substr(at + 7, text.find('\n', at) - (at + 7));
        if (text.find("FDSTORE=1") != std::string::npos && fds.size() == 1)
            store[name] = std::move(fds.front());
        if (text.find("FDSTOREREMOVE=1") != std::string::npos && store.count(name)) {
            dropped[name] = std::move(store[name]);
            store.erase(name);
        }
    }

    TempDir m_dir;
    std::string m_path;
    Fd m_sock;
};

// Starts kcache-fsd as systemd restarts a unit whose store holds `files`: the process
// that becomes the keeper gets them at fds 3, 4, ... with LISTEN_PID (its own pid),
// LISTEN_FDS and LISTEN_FDNAMES; stdout and stderr go to `log`.
Forked start_with_files(const std::vector<std::pair<std::string, int>>& files,
                        const std::vector<std::string>& args, const std::string& notify_socket,
                        const std::string& log) {
    // Everything is made before the fork: the child runs only async-signal-safe calls.
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e) {
        const std::string entry(*e);
        if (entry.rfind("LISTEN_", 0) == 0 || entry.rfind("NOTIFY_SOCKET=", 0) == 0 ||
            entry.rfind("KCACHE_DB=", 0) == 0) {
            continue;
        }
        env.push_back(entry);
    }
    std::string names;
    for (const auto& f : files) names += (names.empty() ? "" : ":") + f.first;
    env.push_back("LISTEN_FDS=" + std::to_string(files.size()));
    env.push_back("LISTEN_FDNAMES=" + names);
    env.push_back("NOTIFY_SOCKET=" + notify_socket);
    env.push_back("LISTEN_PID=" + std::string(16, '\0'));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    char* pid_digits = env.back().data() + std::strlen("LISTEN_PID=");
    std::vector<std::string> argv_s = args;
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<int> sources;
    for (const auto& f : files) sources.push_back(f.second);
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    REQUIRE_SYS(log_fd);

    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);     // the keeper ends with the test (and its daemon
        if (::getppid() != parent) ::_exit(1);  // with it)
        ::setpgid(0, 0);
        // Above every target first, so that no source is overwritten.
        std::vector<int>::size_type i = 0;
        int high[16];
        for (i = 0; i < sources.size() && i < 16; ++i) high[i] = ::fcntl(sources[i], F_DUPFD, 100);
        const int null = ::open("/dev/null", O_RDONLY);
        ::dup2(null, STDIN_FILENO);
        ::dup2(log_fd, STDOUT_FILENO);
        ::dup2(log_fd, STDERR_FILENO);
        for (i = 0; i < sources.size() && i < 16; ++i) {
            ::dup2(high[i], 3 + static_cast<int>(i));  // not close-on-exec
            ::close(high[i]);
        }
        pid_t me = ::getpid();
        char digits[16];
        int n = 0;
        do {
            digits[n++] = static_cast<char>('0' + me % 10);
            me /= 10;
        } while (me > 0);
        for (int k = 0; k < n; ++k) pid_digits[k] = digits[n - 1 - k];
        ::execve(argv[0], argv.data(), envp.data());
        ::_exit(127);
    }
    ::close(log_fd);
    return Forked(pid);
}

std::string read_text(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// kcache-fsd started with `files` must refuse them: exit 1, the message naming the
// first wrong fd (`fd_named`, e.g. "fd 3 (kcache-fuse)") and `reason`; and systemd's
// store emptied of every name passed.
void check_refused(const std::vector<std::pair<std::string, int>>& files, const fs::path& db,
                   const fs::path& mnt, const std::string& fd_named, const std::string& reason) {
    FakeSystemd systemd;
    TempDir dir;
    const std::string log = (dir.path() / "stderr").string();
    Forked keeper = start_with_files(
        files, {KCACHE_FSD_PATH, "-f", "--db", db.string(), mnt.string()}, systemd.path(), log);
    const auto code = keeper.wait(20);
    const std::string err = read_text(log);
    INFO("refused: " << fd_named << ": " << reason << "\nkcache-fsd: exit "
                     << (code ? std::to_string(*code) : "none after 20 s") << "; stderr:\n"
                     << err);
    REQUIRE(code.has_value());
    CHECK(*code == 1);
    CHECK(err.find(fd_named + ": " + reason) != std::string::npos);
    CHECK(err.find("emptied the store") != std::string::npos);
    systemd.drain();
    for (const auto& f : files) {
        INFO("FDSTOREREMOVE=1 for " << f.first);
        CHECK(systemd.removed(f.first));
    }
    CHECK(systemd.count("READY=1") == 0);
}

// Shared with the reader (MAP_SHARED).
struct Reads {
    std::atomic<bool> stop{false};
    std::atomic<bool> restarted{false};
    std::atomic<std::uint64_t> reads{0};
    std::atomic<std::uint64_t> reads_after{0};  // completed after the restart
    std::atomic<std::uint64_t> errors{0};
    std::atomic<std::uint64_t> canceled{0};  // ECANCELED, where kill_cancels_calls()
    std::atomic<std::uint64_t> mismatches{0};
    std::atomic<int> first_errno{0};
    std::atomic<std::uint64_t> longest_ns{0};
};

}  // namespace fdstore

TEST_CASE(
    "takeover: under systemd's fd store, a keeper killed with its daemon is restarted on the same "
    "mount",
    "[reliability][takeover][systemd]") {
    using namespace fdstore;
    FakeSystemd systemd;
    std::optional<MountedCache> cache;
    {
        ScopedEnv notify("NOTIFY_SOCKET", systemd.path().c_str());
        cache.emplace();
    }
    const pid_t keeper = cache->daemon_pid();
    REQUIRE(keeper > 0);
    // Before READY=1, the three files.
    REQUIRE(systemd.receive_until([&] { return systemd.count("READY=1") > 0; }, 15));
    INFO("messages to systemd: " << systemd.messages.size() << "; log:\n"
                                 << cache->daemon_stderr());
    REQUIRE(systemd.store.size() == 3);
    REQUIRE(systemd.stored(kFuse) >= 0);
    REQUIRE(systemd.stored(kState) >= 0);
    REQUIRE(systemd.stored(kLock) >= 0);  // all three came before READY=1

    // What the restart must keep: files, a process with its cwd in the mount and one
    // open there, a reader.
    const std::string held = random_bytes(200000, 11), other = random_bytes(3000, 12);
    REQUIRE(::mkdir(cache->p("work").c_str(), 0755) == 0);
    REQUIRE(write_all(cache->p("work/held.bin"), held) == 0);
    REQUIRE(write_all(cache->p("work/other.bin"), other) == 0);
    for (int i = 0; i < 8; ++i)
        REQUIRE(write_all(cache->p("r" + std::to_string(i)),
                          random_bytes(20000, static_cast<std::uint64_t>(100 + i))) == 0);
    const auto [mount_id, mount_dev] = mount_of(cache->mnt());
    REQUIRE(!mount_id.empty());

    // The refused inputs, while the mount is served (they must not touch it).
    {
        const int fuse = systemd.stored(kFuse), state = systemd.stored(kState),
                  lock = systemd.stored(kLock);
        const fs::path db = cache->db(), mnt = cache->mnt();
        Fd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
        Fd fresh_fuse(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
        REQUIRE_SYS(fresh_fuse.get());
        struct stat st {};
        REQUIRE_SYS(::fstat(state, &st));
        Fd empty_state(::memfd_create("kcache-fsd-state", MFD_CLOEXEC));  // no magic
        REQUIRE_SYS(::ftruncate(empty_state.get(), st.st_size));
        Fd small_state(::memfd_create("kcache-fsd-state", MFD_CLOEXEC));
        REQUIRE_SYS(::ftruncate(small_state.get(), 4096));
        Fd foreign(::memfd_create("other", MFD_CLOEXEC));
        REQUIRE_SYS(::ftruncate(foreign.get(), st.st_size));
        TempDir other_db;
        Fd other_lock(
            ::open((other_db.path() / "daemon.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
        REQUIRE_SYS(other_lock.get());
        int pipe_fds[2];
        REQUIRE_SYS(::pipe2(pipe_fds, O_CLOEXEC));
        Fd pipe_r(pipe_fds[0]), pipe_w(pipe_fds[1]);

        check_refused({{kFuse, null.get()}, {kState, state}, {kLock, lock}}, db, mnt,
                      "fd 3 (kcache-fuse)", "not /dev/fuse (a character device 1:3");
        check_refused({{kFuse, fresh_fuse.get()}, {kState, state}, {kLock, lock}}, db, mnt,
                      "fd 3 (kcache-fuse)", "its FUSE connection is dead");
        check_refused({{kFuse, fuse}, {kState, state}, {kLock, lock}}, other_db.path(), mnt,
                      "fd 3 (kcache-fuse)", "the mount at " + mnt.string() + " serves the db");
        check_refused({{kFuse, fuse}, {kState, foreign.get()}, {kLock, lock}}, db, mnt,
                      "fd 4 (kcache-state)", "not kcache-fsd's state memfd");
        check_refused({{kFuse, fuse}, {kState, pipe_r.get()}, {kLock, lock}}, db, mnt,
                      "fd 4 (kcache-state)", "not kcache-fsd's state memfd");
        check_refused({{kFuse, fuse}, {kState, small_state.get()}, {kLock, lock}}, db, mnt,
                      "fd 4 (kcache-state)", "the state memfd has 4096 bytes");
        check_refused({{kFuse, fuse}, {kState, empty_state.get()}, {kLock, lock}}, db, mnt,
                      "fd 4 (kcache-state)", "the state memfd holds no kcache-fsd state");
        check_refused({{kFuse, fuse}, {kState, state}, {kLock, other_lock.get()}}, db, mnt,
                      "fd 5 (kcache-lock)", "not " + (db / "daemon.lock").string());
        check_refused({{kFuse, fuse}, {kState, state}, {kLock, lock}, {"other", null.get()}}, db,
                      mnt, "fd 6 (other)", "a name kcache-fsd does not store");
        check_refused({{kFuse, fuse}, {kState, state}, {kState, state}, {kLock, lock}}, db, mnt,
                      "fd 5 (kcache-state)", "stored twice");
        check_refused({{kFuse, fuse}, {kState, state}}, db, mnt, "systemd's fd store",
                      "no kcache-lock among the files passed");
        // The mount was not touched.
        CHECK(mount_of(mnt).first == mount_id);
        CHECK(read_all(cache->p("work/other.bin")) == std::optional<std::string>(other));
    }

    // The reader and the holder (which close their copies of systemd's files first).
    void* mem =
        ::mmap(nullptr, sizeof(Reads), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    Reads& reads = *new (mem) Reads();
    int go_fds[2], ready_fds[2];
    REQUIRE_SYS(::pipe2(go_fds, O_CLOEXEC));
    REQUIRE_SYS(::pipe2(ready_fds, O_CLOEXEC));
    Fd go_r(go_fds[0]), go_w(go_fds[1]), ready_r(ready_fds[0]), ready_w(ready_fds[1]);
    const std::string work = cache->p("work");
    const std::string root = cache->mnt().string();
    const bool cancels = kill_cancels_calls();
    Forked reader_proc = Forked::run([&] {
        std::mt19937 rng(7);
        while (!reads.stop.load()) {
            const int i = static_cast<int>(rng() % 8);
            const bool after = reads.restarted.load();
            const auto start = std::chrono::steady_clock::now();
            const auto got = read_all(root + "/r" + std::to_string(i));
            const auto ns = static_cast<std::uint64_t>(seconds_since(start) * 1e9);
            if (!got) {
                if (errno == ECANCELED && cancels) {
                    ++reads.canceled;
                    continue;
                }
                int expected = 0;
                reads.first_errno.compare_exchange_strong(expected, errno);
                ++reads.errors;
                continue;
            }
            if (*got != random_bytes(20000, 100 + static_cast<unsigned>(i))) ++reads.mismatches;
            ++reads.reads;
            if (after) ++reads.reads_after;
            std::uint64_t longest = reads.longest_ns.load();
            while (ns > longest && !reads.longest_ns.compare_exchange_weak(longest, ns)) {
            }
        }
        return 0;
    });
    // Exit 0: all went well; 2..9: the step that failed.
    Forked holder_proc = Forked::run([&] {
        if (::chdir(work.c_str()) != 0) return 2;
        Fd f(::open("held.bin", O_RDONLY | O_CLOEXEC));
        if (!f) return 3;
        std::string head(1000, '\0');
        if (::read(f.get(), head.data(), head.size()) != 1000) return 4;
        (void)!::write(ready_w.get(), "r", 1);
        pollfd p{go_r.get(), POLLIN, 0};
        if (::poll(&p, 1, 60000) != 1) return 5;
        const auto rest = read_fd(f.get());  // through the handle the kernel kept
        if (!rest || head + *rest != held) return 6;
        if (read_all("other.bin") != std::optional<std::string>(other)) return 7;  // by the cwd
        if (write_all("new.bin", "written after the restart") != 0) return 8;
        if (read_all("new.bin") != std::optional<std::string>("written after the restart"))
            return 9;
        return 0;
    });
    pollfd p{ready_r.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 20000) == 1);

    // What must end before any child is reaped, on every path: the test's copies of
    // /dev/fuse (systemd's) and the restarted keeper (its daemon dies with it).
    Forked restarted;
    struct Teardown {
        std::function<void()> fn;
        ~Teardown() { fn(); }
    } teardown{[&] {
        systemd.store.clear();
        systemd.dropped.clear();
        restarted.end();
        reads.stop = true;
        const auto stuck = [&] { abort_connection(mount_dev); };
        reader_proc.end(stuck);
        holder_proc.end(stuck);
        ::munmap(mem, sizeof(Reads));
    }};

    // kill -9 of keeper and daemon together, as an OOM kill of the service's cgroup.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    REQUIRE(reads.reads.load() > 0);
    const pid_t daemon = serving_daemon(keeper);
    REQUIRE(daemon > 0);
    const auto kill_at = std::chrono::steady_clock::now();
    REQUIRE(::kill(daemon, SIGKILL) == 0);
    CHECK(cache->signal_daemon(SIGKILL) == -1);
    REQUIRE(wait_until([&] { return ended(daemon); }, 10));
    // Nobody serves now; systemd's copy keeps the connection alive (RestartSec=).
    CHECK(mount_of(cache->mnt()).first == mount_id);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));

    // systemd's restart: the same command, with the store's files.
    const auto restart_at = std::chrono::steady_clock::now();
    const double unserved_s = seconds_since(kill_at);
    const std::size_t ready_before = static_cast<std::size_t>(systemd.count("READY=1"));
    restarted =
        start_with_files({{kFuse, systemd.stored(kFuse)},
                          {kState, systemd.stored(kState)},
                          {kLock, systemd.stored(kLock)}},
                         cache->argv(), systemd.path(), (cache->root() / "daemon.stderr").string());
    INFO("log:\n" << cache->daemon_stderr());
    REQUIRE(systemd.receive_until(
        [&] {
            return static_cast<std::size_t>(systemd.count("READY=1")) > ready_before ||
                   restarted.wait(0).has_value();  // or it exited
        },
        20));
    REQUIRE(static_cast<std::size_t>(systemd.count("READY=1")) > ready_before);
    CHECK(systemd.messages.back() == "READY=1\nMAINPID=" + std::to_string(restarted.pid()));
    reads.restarted = true;
    const double restart_s = seconds_since(restart_at);

    // Served again, on the same mount: the holder goes on, the reader reads on.
    REQUIRE(::write(go_w.get(), "g", 1) == 1);
    const auto held_code = holder_proc.wait(30);
    REQUIRE(held_code.has_value());
    CHECK(*held_code == 0);
    REQUIRE(wait_until([&] { return reads.reads_after.load() > 20; }, 20));
    reads.stop = true;
    const auto reader_code = reader_proc.wait(20);
    REQUIRE(reader_code.has_value());
    CHECK(*reader_code == 0);
    CHECK(mount_of(cache->mnt()).first == mount_id);  // not mounted again
    const std::string log = cache->daemon_stderr();
    CHECK(log.find("took " + cache->mnt().string() + " over from systemd's fd store") !=
          std::string::npos);
    CHECK(log.find("took over") != std::string::npos);  // its daemon, as after a crash
    // The restarted daemon set its rings up again (the restart runs cache->argv()).
    if (io_uring_run()) CHECK(count_occurrences(log, "serving over io_uring") == 2);
    INFO("first error: " << std::strerror(reads.first_errno.load()));
    CHECK(reads.errors.load() == 0);
    CHECK(reads.mismatches.load() == 0);
    std::printf(
        "fd store restart: %llu reads, %llu errors, %llu ECANCELED; the longest read %.3f s "
        "(from the kill to the restart's exec %.3f s, from its exec to READY=1 %.3f s)\n",
        static_cast<unsigned long long>(reads.reads.load()),
        static_cast<unsigned long long>(reads.errors.load()),
        static_cast<unsigned long long>(reads.canceled.load()),
        static_cast<double>(reads.longest_ns.load()) / 1e9, unserved_s, restart_s);

    // A clean stop (systemctl stop): the store emptied, then the unmount.
    REQUIRE(::kill(restarted.pid(), SIGTERM) == 0);
    const auto stop_code = restarted.wait(20);
    REQUIRE(stop_code.has_value());
    CHECK(*stop_code == 0);
    systemd.drain();
    CHECK(systemd.removed(kFuse));
    CHECK(systemd.removed(kState));
    CHECK(systemd.removed(kLock));
    CHECK(systemd.store.empty());
    CHECK(mount_of(cache->mnt()).first.empty());

    // The /dev/fuse systemd kept (had it missed the removal) is now a dead connection's.
    REQUIRE(systemd.dropped.count(kFuse));
    check_refused({{kFuse, systemd.dropped[kFuse].get()},
                   {kState, systemd.dropped[kState].get()},
                   {kLock, systemd.dropped[kLock].get()}},
                  cache->db(), cache->mnt(), "fd 3 (kcache-fuse)", "its FUSE connection is dead");
}
