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

// ---- systemd's fd store (fsd/src/fd_store.hpp) ----
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
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the keeper ends with the test (and its daemon
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
    Forked keeper = start_with_files(files, {KCACHE_FSD_PATH, "-f", "--db", db.string(),
                                            mnt.string()},
                                     systemd.path(), log);
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
    if (io_uring_run())
        skip(
            "over io_uring a takeover does not complete under load (see the other takeover "
            "tests), and rings made by the keeper end with it: the fd store restart is tested "
            "over /dev/fuse");
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
    INFO("messages to systemd: " << systemd.messages.size() << "; log:\n" << cache->daemon_stderr());
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
        REQUIRE(write_all(cache->p("r" + std::to_string(i)), random_bytes(20000, static_cast<std::uint64_t>(100 + i))) == 0);
    const auto [mount_id, mount_dev] = mount_of(cache->mnt());
    REQUIRE(!mount_id.empty());

    // The refused inputs, while the mount is served (they must not touch it).
    {
        const int fuse = systemd.stored(kFuse), state = systemd.stored(kState), lock = systemd.stored(kLock);
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
        Fd other_lock(::open((other_db.path() / "daemon.lock").c_str(),
                             O_RDWR | O_CREAT | O_CLOEXEC, 0644));
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
    void* mem = ::mmap(nullptr, sizeof(Reads), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    Reads& reads = *new (mem) Reads();
    int go_fds[2], ready_fds[2];
    REQUIRE_SYS(::pipe2(go_fds, O_CLOEXEC));
    REQUIRE_SYS(::pipe2(ready_fds, O_CLOEXEC));
    Fd go_r(go_fds[0]), go_w(go_fds[1]), ready_r(ready_fds[0]), ready_w(ready_fds[1]);
    const std::string work = cache->p("work");
    const std::string root = cache->mnt().string();
    Forked reader_proc = Forked::run([&] {
        std::mt19937 rng(7);
        while (!reads.stop.load()) {
            const int i = static_cast<int>(rng() % 8);
            const bool after = reads.restarted.load();
            const auto start = std::chrono::steady_clock::now();
            const auto got = read_all(root + "/r" + std::to_string(i));
            const auto ns = static_cast<std::uint64_t>(seconds_since(start) * 1e9);
            if (!got) {
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
    restarted = start_with_files({{kFuse, systemd.stored(kFuse)},
                                  {kState, systemd.stored(kState)},
                                  {kLock, systemd.stored(kLock)}},
                                 {KCACHE_FSD_PATH, "-f", "--db", cache->db().string(),
                                  cache->mnt().string()},
                                 systemd.path(), (cache->root() / "daemon.stderr").string());
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
    INFO("first error: " << std::strerror(reads.first_errno.load()));
    CHECK(reads.errors.load() == 0);
    CHECK(reads.mismatches.load() == 0);
    std::printf(
        "fd store restart: %llu reads, %llu errors; the longest read %.3f s (from the kill to "
        "the restart's exec %.3f s, from its exec to READY=1 %.3f s)\n",
        static_cast<unsigned long long>(reads.reads.load()),
        static_cast<unsigned long long>(reads.errors.load()),
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
