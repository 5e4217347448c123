// The mount outlives its daemon (issue 20): kcache-fsd's keeper restarts a serving
// daemon that dies, and the new one takes the mount over (fsd/src/keeper.hpp,
// takeover.hpp, state.hpp).
//
// - kill -9 of the serving daemon, again and again, while processes read hits and store
//   new entries (temp file + rename, as Triton does): readers get no error and
//   byte-exact content; each store either succeeds (its entry byte-exact afterwards) or
//   fails with EIO (its entry absent or complete); `kcache verify` is clean.
// - open files survive a takeover: a reader reads on; a writer whose bytes were all
//   published writes on; one whose bytes died gets EIO.
// - keeper and daemon both killed: kcache-fsd on the dead mountpoint recovers it.
//
// Figures: KCACHE_TAKEOVER_KILLS (default 10) kills, 1-2 s apart (seeded: the seed is
// printed).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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
#include <string>
#include <vector>

#include <catch2/catch.hpp>

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

constexpr int kHits = 24;
constexpr int kReaders = 6;
constexpr int kWriters = 3;
constexpr int kMaxStores = 4000;

enum Outcome : std::uint8_t { none = 0, stored = 1, eio = 2 };

// Shared with the load's processes (MAP_SHARED).
struct Load {
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> reads{0};
    std::atomic<std::uint64_t> read_errors{0};
    std::atomic<std::uint64_t> mismatches{0};
    std::atomic<std::uint64_t> store_errors{0};  // other than EIO
    std::atomic<int> first_errno{0};
    std::atomic<int> first_error_op{0};      // 1 read, 2 mkdir, 3 create/write/close, 4 rename
    std::atomic<int> kills{0};               // done so far
    std::atomic<int> first_error_kills{-1};  // kills done when the first error came
    std::atomic<int> stores[kWriters];
    Outcome outcomes[kWriters][kMaxStores];
};

void note_error(Load& load, int op, int err) {
    int expected = 0;
    if (load.first_errno.compare_exchange_strong(expected, err)) {
        load.first_error_op = op;
        load.first_error_kills = load.kills.load();
    }
}

int reader(Load& load, const MountedCache& cache, int seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    while (!load.stop.load()) {
        const int i = static_cast<int>(rng() % kHits);
        const auto got = read_all(hit_path(cache, i));
        if (!got) {
            ++load.read_errors;
            note_error(load, 1, errno);
            continue;
        }
        if (*got != hit_content(i)) ++load.mismatches;
        ++load.reads;
    }
    return 0;
}

// Stores entries as Triton does: mkdir -p, a temp file, rename into place. A call that
// fails with EIO ends that store (the entry may be absent or complete); any other
// failure is counted.
int writer(Load& load, const MountedCache& cache, int w) {
    for (int n = 0; n < kMaxStores && !load.stop.load(); ++n) {
        const std::string dir = store_dir(cache, w, n);
        const std::string content = store_content(w, n);
        auto fail = [&](int op, int err) {
            if (err == EIO) {
                load.outcomes[w][n] = eio;
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

// The takeovers over io_uring: the successor registers its rings again (a plain read
// after a kill works), but a request the dead daemon held in a ring entry is never
// answered: the kernel neither resends it (FUSE_NOTIFY_RESEND requeues /dev/fuse's
// processing lists only) nor ends it while the keeper holds the connection open
// (docs/operations.md, takeover). Under load a client then blocks for good; not
// covered.
void skip_over_io_uring() {
    if (io_uring_run())
        skip(
            "a takeover under load over io_uring does not complete yet (issue 20): see "
            "docs/operations.md");
}

// Runs the load (kReaders readers, kWriters writers) while `event` happens `events`
// times, 1-2 s apart, then checks every read and store. `eio_allowed`: a store may
// fail with EIO (a kill loses a writer's unpublished bytes), else none may.
void run_load(MountedCache& cache, int events, const std::function<void()>& event,
              std::uint64_t seed, bool eio_allowed) {
    const pid_t keeper = cache.daemon_pid();
    REQUIRE(keeper > 0);
    REQUIRE(serving_daemon(keeper) > 0);
    for (int i = 0; i < kHits; ++i) {
        REQUIRE(::mkdir(cache.p("h" + std::to_string(i)).c_str(), 0755) == 0);
        REQUIRE(write_all(hit_path(cache, i), hit_content(i)) == 0);
    }

    void* mem =
        ::mmap(nullptr, sizeof(Load), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    Load& load = *new (mem) Load();
    std::vector<std::unique_ptr<Child>> children;
    for (int r = 0; r < kReaders; ++r) {
        children.push_back(std::make_unique<Child>(
            [&, r] { return reader(load, cache, static_cast<int>(seed) + r); }));
    }
    for (int w = 0; w < kWriters; ++w)
        children.push_back(std::make_unique<Child>([&, w] { return writer(load, cache, w); }));

    std::mt19937_64 rng(seed);
    std::uint64_t reads_before = 0;
    for (int k = 0; k < events; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 1000));
        INFO("event " << k + 1 << "; daemon log:\n" << cache.daemon_stderr());
        REQUIRE(load.reads.load() > reads_before);  // the mount served since the last one
        reads_before = load.reads.load();
        event();
        ++load.kills;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    load.stop = true;
    for (auto& c : children) CHECK(c->join(60).exit_code == 0);

    INFO("daemon log:\n" << cache.daemon_stderr());
    INFO("reads " << load.reads.load() << ", first error (op " << load.first_error_op.load()
                  << ", after " << load.first_error_kills.load()
                  << " events): " << std::strerror(load.first_errno.load()));
    CHECK(load.read_errors.load() == 0);
    CHECK(load.mismatches.load() == 0);
    CHECK(load.store_errors.load() == 0);
    std::size_t stored_n = 0, eio_n = 0;
    for (int w = 0; w < kWriters; ++w) {
        for (int n = 0; n < load.stores[w].load(); ++n) {
            const std::string path = store_dir(cache, w, n) + "/kernel.bin";
            const auto got = read_all(path);
            INFO("store " << w << "/" << n << " outcome " << int(load.outcomes[w][n]));
            eio_n += load.outcomes[w][n] == eio;
            if (load.outcomes[w][n] == stored) {
                ++stored_n;
                CHECK(got == std::optional<std::string>(store_content(w, n)));
            } else if (got) {  // EIO, or cut short by the end: absent or complete
                CHECK(*got == store_content(w, n));
            }
        }
    }
    std::printf("takeover: %d events; %llu reads, 0 failed; %zu stores, %zu failed with EIO\n",
                events, static_cast<unsigned long long>(load.reads.load()), stored_n, eio_n);
    CHECK(stored_n > 0);
    if (!eio_allowed) CHECK(eio_n == 0);
    CHECK(serving_daemon(keeper) > 0);  // the same keeper serves on
    const ProcResult v = run_kcache(cache.db(), {"verify"});
    INFO("kcache verify: " << v.describe());
    CHECK(v.exit_code == 0);
    load.~Load();
    ::munmap(mem, sizeof(Load));
}

}  // namespace

TEST_CASE("takeover: kill -9 of the serving daemon under load costs a pause, never a failed read",
          "[reliability][takeover]") {
    skip_over_io_uring();
    const auto kills = static_cast<int>(env_u64("KCACHE_TAKEOVER_KILLS", 10));
    const auto seed = env_u64("KCACHE_TAKEOVER_SEED", 0x7a6e0ffull);
    std::printf("takeover: %d kills, seed %#llx (KCACHE_TAKEOVER_KILLS, KCACHE_TAKEOVER_SEED)\n",
                kills, static_cast<unsigned long long>(seed));
    MountedCache cache(DaemonOptions{.watchdog_s = 60.0 + kills * 6});
    const pid_t keeper = cache.daemon_pid();
    run_load(
        cache, kills, [&] { kill_serving_daemon(keeper); }, seed, true);
}

TEST_CASE("takeover: kcache-fsd --upgrade under load: no client sees an error",
          "[reliability][takeover][upgrade]") {
    skip_over_io_uring();
    MountedCache cache(DaemonOptions{.watchdog_s = 120});
    const pid_t keeper = cache.daemon_pid();
    run_load(
        cache, 3,
        [&] {
            const pid_t before = serving_daemon(keeper);
            const ProcResult r = run_process({KCACHE_FSD_PATH, "--upgrade", cache.mnt().string()});
            INFO("kcache-fsd --upgrade: " << r.describe());
            REQUIRE(r.exit_code == 0);
            // The old daemon may still be finishing (it stopped reading first).
            pid_t after = -1;
            CHECK(wait_until(
                [&] {
                    after = serving_daemon(keeper);
                    return after > 0 && after != before;
                },
                10));
        },
        0x5eedull, false);
    CHECK(cache.daemon_stderr().find("handed the mount over") != std::string::npos);
}

TEST_CASE("takeover: open files survive a new daemon", "[reliability][takeover]") {
    skip_over_io_uring();
    MountedCache cache;
    const pid_t keeper = cache.daemon_pid();
    const std::string a = random_bytes(300000, 1), c = random_bytes(5000, 3);
    REQUIRE(write_all(cache.p("a.bin"), a) == 0);
    REQUIRE(write_all(cache.p("c.bin"), c) == 0);

    Fd reader(::open(cache.p("a.bin").c_str(), O_RDONLY));
    REQUIRE_SYS(reader.get());
    std::string head(1000, '\0');
    REQUIRE(::read(reader.get(), head.data(), head.size()) == 1000);
    // A writer with bytes nobody published, and one whose bytes are all published.
    Fd lost(::open(cache.p("b.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    REQUIRE_SYS(lost.get());
    REQUIRE(write_fd(lost.get(), "unpublished") == 0);
    Fd clean(::open(cache.p("c.bin").c_str(), O_WRONLY | O_APPEND));
    REQUIRE_SYS(clean.get());
    REQUIRE(write_fd(clean.get(), "more") == 0);
    REQUIRE_SYS(::fsync(clean.get()));

    kill_serving_daemon(keeper);
    INFO("daemon log:\n" << cache.daemon_stderr());

    // The reader reads on, byte-exact (through the new daemon or the kernel's pages).
    const auto rest = read_fd(reader.get());
    REQUIRE(rest.has_value());
    CHECK(head + *rest == a);
    // The lost writer: EIO, and nothing of it published.
    REQUIRE_FAILS_WITH(::write(lost.get(), "x", 1), EIO);
    REQUIRE_FAILS_WITH(lost.close(), EIO);
    const auto b = read_all(cache.p("b.bin"));
    CHECK((!b || b->empty()));
    // The clean writer writes on.
    REQUIRE(write_fd(clean.get(), "tail") == 0);
    REQUIRE_SYS(clean.close());
    CHECK(read_all(cache.p("c.bin")) == std::optional<std::string>(c + "moretail"));
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
// reply (KCACHE_FSD_FAULT, fsd/src/resend.hpp); the keeper starts another, which gets
// the request resent.
struct FaultyMount {
    explicit FaultyMount(const std::string& op) {
        ::setenv("KCACHE_FSD_FAULT", ("kill_after_commit=" + op).c_str(), 1);
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
        CHECK(cache->daemon_stderr().find("killing this daemon after a commit") !=
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
    skip_over_io_uring();
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
    char buf[256] = {};
    const ssize_t n = ::recv(sock.get(), buf, sizeof buf - 1, 0);
    REQUIRE(n > 0);
    CHECK(std::string(buf, static_cast<std::size_t>(n)) ==
          "READY=1\nMAINPID=" + std::to_string(cache.daemon_pid()));
}
