// Single flight on one node (issue 14, point 5b; fsd/src/state/single_flight.hpp): while one
// compile fills an entry directory (a handle open for writing one of its files, or
// something made in it a moment ago), another compile's lookup of a name the entry lacks
// yet waits for it, bounded (-o single_flight_ms=N), instead of missing and compiling it
// again. The filler and its own processes never wait, the
// parent directory is never blocked (another compile makes its entry beside it while one
// waits), an interrupted wait ends at once, and the file the waiter then finds counts as
// a hit, not a miss.
//
// The filler and the waiter are sibling processes (children of this test): a process
// never waits for its own ancestor or descendant, which are "of one compile".

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <string>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

using namespace kcache::test;

namespace {

// Triton's cache keys: base32 of a sha256, 52 characters (an entry directory at the root).
const std::string kEntry = "SFLT7XUOUG4VYYBXBZYN7QL4E6AX3B7AXEAKLO5N3NS5ZC6WRD4G";
const std::string kOther = "SFLT7WJ5UE2RS4VN6KXA3MBY7DHC2PGTF5OIQ4ZL6NW3RT2XYKAA";
const std::string kThird = "SFLT7K7QWZ2LX5RM4UVJ6YTH2CPA7SGEF4NOIQ5ZK6LW3XT2RYMB";
const std::string kName = "__grp__add_kernel.json";

// A one-way signal between processes: a pipe.
class Signal {
  public:
    Signal() { REQUIRE(::pipe(m_fds) == 0); }
    ~Signal() {
        ::close(m_fds[0]);
        ::close(m_fds[1]);
    }
    void raise() const { (void)!::write(m_fds[1], "x", 1); }
    // True once raised; false after `timeout_s`.
    bool wait(double timeout_s) const {
        pollfd p{m_fds[0], POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(timeout_s * 1000)) != 1) return false;
        char c = 0;
        return ::read(m_fds[0], &c, 1) == 1;
    }

  private:
    int m_fds[2] = {-1, -1};
};

std::uint64_t stat_of(const MountedCache& m, const std::string& name) {
    return stat_value(cache_stats(m.db()), name);
}

DaemonOptions with_bound(int ms) {
    DaemonOptions o;
    o.args = {"-o", "single_flight_ms=" + std::to_string(ms)};
    return o;
}

// The filler, as Triton's cache stores a file: makes the entry directory and a temporary
// directory in it, writes the file there and holds it open until `go`, then closes it,
// renames it into place and removes the temporary directory. `while_open`, if given,
// runs while it holds the file and raises `ready` itself. Exit 0, or the step that failed.
int fill(const MountedCache& m, const std::string& content, const Signal& ready, const Signal& go,
         const std::function<int()>& while_open = {}) {
    const std::string dir = m.p(kEntry), tmp = dir + "/tmp.pid_1_abc";
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return 1;
    if (::mkdir(tmp.c_str(), 0755) != 0) return 2;
    const int fd = ::open((tmp + "/" + kName).c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) return 3;
    if (write_fd(fd, content) != 0) return 4;
    if (while_open) {  // it raises `ready` itself
        if (const int rc = while_open(); rc != 0) return rc;
    } else {
        ready.raise();
    }
    if (!go.wait(120)) return 5;
    if (::close(fd) != 0) return 6;
    if (::rename((tmp + "/" + kName).c_str(), (dir + "/" + kName).c_str()) != 0) return 7;
    if (::rmdir(tmp.c_str()) != 0) return 8;
    return 0;
}

}  // namespace

TEST_CASE("single flight: a lookup inside an entry being filled waits for it and finds the file",
          "[fsd][single_flight]") {
    MountedCache m(with_bound(60'000));  // a bound the test never reaches
    const std::string content = "{\"child_paths\": {\"add_kernel.cubin\": \"x\"}}";
    Signal ready, go;
    Child filler([&] { return fill(m, content, ready, go); });
    REQUIRE(ready.wait(30));

    // Another compile probes the file the filler is writing: it waits.
    Child prober([&] {
        struct stat st {};
        if (::stat(m.p(kEntry + "/" + kName).c_str(), &st) != 0) return errno == ENOENT ? 2 : 3;
        const auto got = read_all(m.p(kEntry + "/" + kName));
        if (!got || *got != content) return 4;
        return 0;
    });
    {
        INFO(m.daemon_stderr());
        REQUIRE(wait_until([&] { return stat_of(m, "single_flight_waits") >= 1; }, 30));
    }
    REQUIRE(prober.running());  // not answered while the filler holds its file

    go.raise();
    CHECK(filler.join(30).exit_code == 0);
    const ChildResult probed = prober.join(30);
    REQUIRE_FALSE(probed.timed_out);
    REQUIRE(probed.exit_code == 0);  // it found the file the filler renamed into place

    // One compile (the filler's miss), one kernel loaded from the cache (the prober's hit).
    REQUIRE(wait_until([&] { return stat_of(m, "hits") >= 1; }, 30));
    const auto stats = cache_stats(m.db());
    CHECK(stat_value(stats, "misses") == 1);
    CHECK(stat_value(stats, "hits") == 1);
    CHECK(stat_value(stats, "single_flight_waits") == 1);
    CHECK(stat_value(stats, "single_flight_timeouts") == 0);
}

TEST_CASE("single flight: a wait ends at its bound while the filler holds on",
          "[fsd][single_flight]") {
    MountedCache m(with_bound(1000));
    Signal ready, go;
    Child filler([&] { return fill(m, "content", ready, go); });
    REQUIRE(ready.wait(30));

    Child prober([&] {
        const auto begin = std::chrono::steady_clock::now();
        struct stat st {};
        const int rc = ::stat(m.p(kEntry + "/" + kName).c_str(), &st);
        const int err = errno;
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
        if (rc == 0) return 3;
        if (err != ENOENT) return 4;
        return waited >= 0.5 ? 0 : 5;  // loosely: it waited, about the bound
    });
    const ChildResult probed = prober.join(30);
    REQUIRE_FALSE(probed.timed_out);
    CHECK(probed.exit_code == 0);  // ENOENT, after about the bound
    CHECK(filler.running());       // while the filler still held its file
    REQUIRE(wait_until([&] { return stat_of(m, "single_flight_timeouts") >= 1; }, 30));
    CHECK(stat_of(m, "single_flight_waits") == 1);

    go.raise();
    CHECK(filler.join(30).exit_code == 0);
}

TEST_CASE("single flight: a waiter that is killed ends at once", "[fsd][single_flight]") {
    MountedCache m(with_bound(120'000));  // far beyond every wait below
    Signal ready, go;
    Child filler([&] { return fill(m, "content", ready, go); });
    REQUIRE(ready.wait(30));

    Child prober([&] {
        struct stat st {};
        (void)::stat(m.p(kEntry + "/" + kName).c_str(), &st);
        return 0;
    });
    {
        INFO(m.daemon_stderr());
        REQUIRE(wait_until([&] { return stat_of(m, "single_flight_waits") >= 1; }, 30));
    }
    REQUIRE(prober.running());
    REQUIRE(::kill(prober.pid(), SIGKILL) == 0);
    // The kernel interrupts the LOOKUP and waits for its answer: EINTR comes at once,
    // not at the bound.
    const ChildResult killed = prober.join(20);
    CHECK_FALSE(killed.timed_out);

    // The mount goes on: the filler finishes, and the file is there.
    go.raise();
    CHECK(filler.join(30).exit_code == 0);
    CHECK(read_all(m.p(kEntry + "/" + kName)) == std::optional<std::string>("content"));
    CHECK(stat_of(m, "single_flight_timeouts") == 0);
}

TEST_CASE("single flight: compiles at work in the entry and the parent directory never wait",
          "[fsd][single_flight]") {
    MountedCache m(with_bound(120'000));  // a wait would outlast every step below
    // An entry that is complete, beside the one being filled.
    REQUIRE_SYS(::mkdir(m.p(kOther).c_str(), 0755));
    REQUIRE(write_all(m.p(kOther + "/" + kName), "other") == 0);

    Signal ready, go, check, checked;
    Child filler([&] {
        return fill(m, "content", ready, go, [&] {
            ready.raise();  // holding its file
            if (!check.wait(120)) return 20;
            // A second compile fills the entry too now. The filler is at work itself:
            // its lookups, and those of a process it forks (its compile), never wait.
            struct stat st {};
            if (::stat(m.p(kEntry).c_str(), &st) != 0) return 21;
            if (::stat(m.p(kEntry + "/missing.json").c_str(), &st) == 0 || errno != ENOENT)
                return 22;
            const ChildResult own = run_child(
                [&] {
                    struct stat s {};
                    if (::stat(m.p(kEntry + "/" + kName).c_str(), &s) == 0 || errno != ENOENT)
                        return 1;
                    return 0;
                },
                100);
            if (own.exit_code != 0) return 23;
            checked.raise();
            return 0;
        });
    });
    REQUIRE(ready.wait(60));

    Signal second_ready, second_go;
    Child second([&] {
        const std::string tmp = m.p(kEntry + "/tmp.pid_2_def");
        if (::mkdir(tmp.c_str(), 0755) != 0) return 1;
        const int fd = ::open((tmp + "/other.json").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0) return 2;
        second_ready.raise();
        if (!second_go.wait(120)) return 3;
        ::close(fd);
        return 0;
    });
    REQUIRE(second_ready.wait(60));
    check.raise();
    REQUIRE(checked.wait(60));  // a wait would have lasted the bound (120 s)
    second_go.raise();
    CHECK(second.join(30).exit_code == 0);
    CHECK(stat_of(m, "single_flight_waits") == 0);

    // Another compile waits inside the entry being filled ...
    Child prober([&] {
        struct stat st {};
        return ::stat(m.p(kEntry + "/" + kName).c_str(), &st) == 0 ? 0 : 2;
    });
    REQUIRE(wait_until([&] { return stat_of(m, "single_flight_waits") >= 1; }, 30));

    // ... while a third one works in the parent directory: it makes its own entry there,
    // looks up the complete entry and a missing name, and none of it waits.
    Child neighbour([&] {
        if (::mkdir(m.p(kThird).c_str(), 0755) != 0) return 1;
        if (write_all(m.p(kThird + "/" + kName), "third") != 0) return 2;
        struct stat st {};
        if (::stat(m.p(kOther + "/" + kName).c_str(), &st) != 0) return 3;
        if (::stat(m.p("NOSUCHENTRYAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").c_str(), &st) == 0)
            return 4;
        return 0;
    });
    const ChildResult n = neighbour.join(60);
    REQUIRE_FALSE(n.timed_out);
    CHECK(n.exit_code == 0);
    CHECK(prober.running());  // still waiting for the filler meanwhile

    go.raise();
    CHECK(filler.join(60).exit_code == 0);
    const ChildResult p = prober.join(30);
    REQUIRE_FALSE(p.timed_out);
    CHECK(p.exit_code == 0);
    CHECK(stat_of(m, "single_flight_waits") == 1);
}

TEST_CASE(
    "single flight: a miss before the fill does not leave a negative entry that skips the wait",
    "[fsd][single_flight]") {
    MountedCache m(with_bound(60'000));
    // An entry directory made before anyone compiles into it (Triton's makedirs), and
    // probed: a miss. The kernel must not keep that answer ... (A child, gone when the
    // fill begins: this test process is the prober's parent, of its compile.)
    const ChildResult early = run_child([&] {
        if (::mkdir(m.p(kEntry).c_str(), 0755) != 0) return 1;
        struct stat st {};
        return ::stat(m.p(kEntry + "/" + kName).c_str(), &st) != 0 && errno == ENOENT ? 0 : 2;
    });
    REQUIRE(early.exit_code == 0);

    // ... so that a probe while a compile fills the entry still reaches the daemon, and waits.
    Signal ready, go;
    Child filler([&] { return fill(m, "content", ready, go); });
    REQUIRE(ready.wait(30));
    Child prober([&] {
        struct stat st {};
        if (::stat(m.p(kEntry + "/" + kName).c_str(), &st) != 0) return 2;
        const auto got = read_all(m.p(kEntry + "/" + kName));
        return got && *got == "content" ? 0 : 3;
    });
    {
        INFO(m.daemon_stderr());
        REQUIRE(wait_until([&] { return stat_of(m, "single_flight_waits") >= 1; }, 30));
    }
    go.raise();
    CHECK(filler.join(30).exit_code == 0);
    const ChildResult p = prober.join(30);
    REQUIRE_FALSE(p.timed_out);
    CHECK(p.exit_code == 0);
}

TEST_CASE("single flight: -o single_flight_ms=0 never waits", "[fsd][single_flight]") {
    MountedCache m(with_bound(0));
    Signal ready, go;
    Child filler([&] { return fill(m, "content", ready, go); });
    REQUIRE(ready.wait(30));
    Child prober([&] {
        struct stat st {};
        return ::stat(m.p(kEntry + "/" + kName).c_str(), &st) != 0 && errno == ENOENT ? 0 : 1;
    });
    const ChildResult p = prober.join(60);
    REQUIRE_FALSE(p.timed_out);
    CHECK(p.exit_code == 0);  // a miss at once, though the filler holds its file
    CHECK(filler.running());
    go.raise();
    CHECK(filler.join(30).exit_code == 0);
    CHECK(stat_of(m, "single_flight_waits") == 0);
}

TEST_CASE("single flight: a process making directories in an entry is no filler to wait for",
          "[fsd][single_flight]") {
    // mkdir -p by several processes at once (std::filesystem::create_directories, the
    // contract test's race): the kernel does not retry ESTALE for the lookup mkdir
    // makes of its new name, so a sibling's mkdir inside an entry that another process
    // had just made directories in failed with ESTALE. Making a directory is not
    // filling an entry: only files written or made (and renames into it) are.
    MountedCache m(with_bound(60'000));
    Signal ready, go;
    Child maker([&] {
        if (::mkdir(m.p(kEntry).c_str(), 0755) != 0) return 1;
        if (::mkdir(m.p(kEntry + "/x").c_str(), 0755) != 0) return 2;
        ready.raise();
        return go.wait(60) ? 0 : 3;
    });
    REQUIRE(ready.wait(30));
    Child sibling([&] {
        if (::mkdir(m.p(kEntry + "/y").c_str(), 0755) != 0) return errno;
        return ::mkdir(m.p(kEntry + "/x").c_str(), 0755) != 0 && errno == EEXIST ? 0 : 100;
    });
    const ChildResult s = sibling.join(30);
    go.raise();
    CHECK(maker.join(30).exit_code == 0);
    REQUIRE_FALSE(s.timed_out);
    CHECK(s.exit_code == 0);  // ESTALE (116) before
    CHECK(stat_of(m, "single_flight_waits") == 0);
}
