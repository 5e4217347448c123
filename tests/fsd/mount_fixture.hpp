// Fixture for the kcache-fsd integration tests: runs the built daemon on a fresh db
// in a private temporary directory and mounts it, plus the helpers those tests share
// (subprocesses with timeouts, forked children, the `kcache` CLI, the Python flows).
//
// Safety: a test must never leave a mount behind nor hang, whatever it does to its
// daemon (kill it, stop it) and wherever a REQUIRE throws.
// - Every wait is bounded. A child that a SIGKILL does not end is in D state, waiting
//   for a FUSE request (a killed process's FLUSH waits uninterruptibly for its answer):
//   the waits abort the FUSE connections of this process's mounts (abort_own_mounts),
//   which ends every such request, and leave a child that still does not end (with a
//   message) rather than wait forever.
// - Every forked child is killed and reaped by its owner's destructor (Child, and
//   run_process's own timeout), and dies with the thread that forked it
//   (PR_SET_PDEATHSIG, SIGKILL) when that is the main thread or a thread that waits
//   for it (run_process), so a test killed from outside (CTest's timeout) leaves no
//   process behind: its daemon's death ends the connection, which wakes the rest.
//   (A child forked by another thread, which may end first, does not get it.)
// - MountedCache's destructor unmounts; if the daemon is gone or the unmount does not
//   complete within its bound it aborts the connection (fusectl's
//   /sys/fs/fuse/connections/N/abort, else umount2(MNT_FORCE)), kills the daemon after
//   a bound, and unmounts lazily as a last resort. A watchdog thread per MountedCache
//   ends the whole test program (after aborting the connection, killing the daemon
//   and unmounting) when a test runs longer than its bound.
//
// Requirements: /dev/fuse and fusermount3; without them every test that constructs a
// MountedCache (or calls require_fuse()) is skipped (exit 77).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "temp_dir.hpp"

// Assertions on syscalls, with errno in the message.
#define REQUIRE_SYS(expr)                                                             \
    do {                                                                              \
        errno = 0;                                                                    \
        const auto kc_result = (expr);                                                \
        const int kc_errno = errno;                                                   \
        INFO(#expr << " -> " << kc_result << " (" << std::strerror(kc_errno) << ")"); \
        REQUIRE(kc_result >= 0);                                                      \
    } while (false)

#define REQUIRE_FAILS_WITH(expr, err)                                       \
    do {                                                                    \
        errno = 0;                                                          \
        const auto kc_result = (expr);                                      \
        const int kc_errno = errno;                                         \
        INFO(#expr << " -> " << kc_result << ", errno " << kc_errno << " (" \
                   << std::strerror(kc_errno) << "); expected " << #err);   \
        REQUIRE(kc_result == -1);                                           \
        REQUIRE(kc_errno == (err));                                         \
    } while (false)

namespace kcache::test {

namespace fs = std::filesystem;

inline constexpr long kFuseSuperMagic = 0x65735546;

// Skips the test (exit 77) unless /dev/fuse can be opened and fusermount3 exists.
void require_fuse();
// KCACHE_TEST_IO_URING=1 (the `uring` CTest label): every MountedCache mounts with
// --io-uring and requires that the rings serve (it skips where enable_uring is off).
bool io_uring_run();

// How many times `what` occurs in `text` (a line in a daemon's log).
std::size_t count_occurrences(const std::string& text, const std::string& what);
// True when `path` is the root of a FUSE mount (statfs f_type; may ask the daemon).
bool is_fuse_mount(const fs::path& path);
// True when /proc/self/mountinfo lists `path` as a mount point (never asks a daemon).
bool in_mountinfo(const fs::path& path);
// The FUSE connection of mount point `mnt` as fusectl names it (the mount's device
// number, read from /proc/self/mountinfo: no daemon is asked); 0 if it is not mounted.
unsigned fuse_connection_of(const fs::path& mnt);
// Aborts FUSE connection `connection` (of mount point `mnt`): every request on it ends
// with ECONNABORTED and every process waiting for one wakes, a killed one in D state
// too; the mount answers ENOTCONN from then on. Through fusectl's
// /sys/fs/fuse/connections/<connection>/abort where it is mounted, else
// umount2(MNT_FORCE) (root; it also unmounts when nothing is open). True if done.
bool abort_fuse_connection(unsigned connection, const fs::path& mnt);
// Aborts the connections of every mount of a live MountedCache of this process (and,
// in a forked child, of its parent's): the last resort of a wait for a child that a
// SIGKILL did not end.
void abort_own_mounts();

struct ProcResult {
    int exit_code = -1;   // -1 when killed by a signal or timed out
    int term_signal = 0;  // the signal that ended it, 0 if it exited
    bool timed_out = false;
    std::string out;
    std::string err;
    std::string describe() const;  // "exit 1; stderr: ..." for failure messages
};

struct ProcOptions {
    std::map<std::string, std::string> env;  // set in the child
    std::vector<std::string> unset_env;      // removed in the child (KCACHE_DB always is)
    std::string cwd;                         // empty: inherit
    double timeout_s = 60;                   // then the child's process group is killed
};

// Runs argv[0] (a path, or a name searched in PATH) with stdin from /dev/null and
// stdout/stderr captured, in its own process group (killed whole at the timeout).
ProcResult run_process(const std::vector<std::string>& argv, const ProcOptions& options = {});

// Runs `fn` in a forked child (it must not use Catch2 assertions); its return value is
// the child's exit code, an exception is exit 101. Returns the exit code, or -1 when
// the child was killed by a signal or ran longer than `timeout_s` (then it is killed).
struct ChildResult {
    int exit_code = -1;
    bool timed_out = false;
};
ChildResult run_child(const std::function<int()>& fn, double timeout_s = 30);

// A forked child running in the background until joined.
class Child {
  public:
    explicit Child(const std::function<int()>& fn);
    ~Child();  // kills and reaps (bounded, see the file comment) a child not joined
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;
    pid_t pid() const { return m_pid; }
    bool running();  // false once it has exited (then join() returns at once)
    // Waits up to `timeout_s`, then kills it (timed_out) and reaps it, bounded.
    ChildResult join(double timeout_s = 30);

  private:
    pid_t m_pid = -1;
    std::optional<int> m_status;  // wait status, once reaped by running()
};

// Polls `pred` every 10 ms until it holds or `timeout_s` passes; returns its last value.
bool wait_until(const std::function<bool()>& pred, double timeout_s);

// `kcache --db DB ARGS...`
ProcResult run_kcache(const fs::path& db, const std::vector<std::string>& args);
// run_kcache, tried again for up to 2 s while it refuses with "write in flight": a
// writer's RELEASE (which ends its write lease) reaches the daemon after its close()
// returned, so an evict right after a write may see the lease still held.
ProcResult run_kcache_settled(const fs::path& db, const std::vector<std::string>& args);
// `kcache --db DB stats --json`, parsed (REQUIRE: it succeeds).
nlohmann::json cache_stats(const fs::path& db);
std::uint64_t stat_value(const nlohmann::json& stats, const std::string& name);

// /usr/bin/python3 tests/fsd/flows/SCRIPT ARGS...
ProcResult run_flow(const std::string& script, const std::vector<std::string>& args,
                    double timeout_s = 90);

// Deterministic content: `n` bytes from a seed, incompressible.
std::string random_bytes(std::size_t n, std::uint64_t seed);
// Appends a 16-byte digest of `content` to it, so that a torn or mixed copy of it differs
// from the whole however it was cut (the crash and soak tests' versions end so).
void append_digest(std::string& content);
// Reads a whole file with raw syscalls; nullopt with errno set on failure.
std::optional<std::string> read_all(const std::string& path);
// Writes a whole file (open O_CREAT|O_TRUNC, write, close); 0 or the errno of the
// first failing call.
int write_all(const std::string& path, const std::string& bytes, int extra_flags = 0);

// An owned file descriptor.
class Fd {
  public:
    Fd() = default;
    explicit Fd(int fd) : m_fd(fd) {}
    ~Fd() { reset(); }
    Fd(Fd&& other) noexcept : m_fd(other.release()) {}
    Fd& operator=(Fd&& other) noexcept {
        if (this != &other) {
            reset();
            m_fd = other.release();
        }
        return *this;
    }
    int get() const { return m_fd; }
    explicit operator bool() const { return m_fd >= 0; }
    int release() {
        const int fd = m_fd;
        m_fd = -1;
        return fd;
    }
    void reset() {
        if (m_fd >= 0) ::close(m_fd);
        m_fd = -1;
    }
    int close() {  // 0 or -1 with errno, as close(2)
        const int fd = release();
        return fd < 0 ? 0 : ::close(fd);
    }

  private:
    int m_fd = -1;
};

// Writes all of `bytes` at the current offset; 0 or the errno of the failing write.
int write_fd(int fd, std::string_view bytes);
// Reads from the current offset to EOF; nullopt with errno set on failure.
std::optional<std::string> read_fd(int fd);

// Ends the test program when a deadline passes (see the file comment).
class Watchdog {
  public:
    using Action = std::function<void()>;
    Watchdog(double seconds, std::string what, Action on_fire);
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

  private:
    std::mutex m_mutex;
    std::condition_variable m_cv;
    bool m_stop = false;
    std::thread m_thread;
};

struct DaemonOptions {
    std::vector<std::string> args;  // extra options, e.g. {"--max-size", "1M"}
    bool foreground = true;         // -f; false: the daemon daemonizes itself
    double watchdog_s = 120;        // the whole test's bound while this cache exists
    fs::path db;                    // where the db lives; empty: <tmp>/db
    // Started in <tmp> with `--db db`, a relative path (db must be empty).
    bool relative_db = false;
    fs::path binary;  // the kcache-fsd to start; empty: the one built (KCACHE_FSD_PATH)
};

// A kcache-fsd serving <tmp>/db on <tmp>/mnt. The constructor mounts (REQUIRE: it comes
// up within 10 s; the failure message carries the daemon's stderr).
class MountedCache {
  public:
    explicit MountedCache(DaemonOptions options = {});
    ~MountedCache();
    MountedCache(const MountedCache&) = delete;
    MountedCache& operator=(const MountedCache&) = delete;

    const fs::path& root() const { return m_root; }  // the temporary directory
    const fs::path& mnt() const { return m_mnt; }
    const fs::path& db() const { return m_db; }
    fs::path path(const std::string& relative) const { return m_mnt / relative; }
    std::string p(const std::string& relative) const { return path(relative).string(); }

    bool mounted() const { return m_mounted; }
    pid_t daemon_pid() const { return m_pid; }  // -1 when unknown (daemonized) or gone
    // Everything the daemon wrote to stderr, and a last line saying so if it has died.
    std::string daemon_stderr() const;

    void mount();    // REQUIRE: mounted within 10 s
    void unmount();  // fusermount3 -u; REQUIRE: it succeeds and the daemon exits 0
    void remount() {
        unmount();
        mount();
    }
    // Sends `sig` to the daemon (foreground only) and returns how it ended (exit code,
    // -1 if killed by a signal or still alive after `timeout_s`).
    int signal_daemon(int sig, double timeout_s = 15);
    // The mount's FUSE connection (fuse_connection_of, read when it was mounted).
    unsigned connection() const { return m_connection.load(); }
    // The command line mount() runs (binary, -f, --db, the options' args, --io-uring in
    // an io_uring run, the mountpoint): what a service manager's restart runs again.
    std::vector<std::string> argv() const;

  private:
    void cleanup() noexcept;  // unmount and kill whatever is left; never throws

    DaemonOptions m_options;
    TempDir m_dir;
    fs::path m_root, m_mnt, m_db, m_log;
    std::atomic<pid_t> m_pid{-1};           // read by the watchdog thread
    std::atomic<unsigned> m_connection{0};  // likewise
    bool m_mounted = false;
    std::unique_ptr<Watchdog> m_watchdog;
};

// Finds a live kcache-fsd (the built binary) with `arg` among its arguments (a
// daemonized one, by its unique mount path); -1 if none.
pid_t find_daemon_with_arg(const std::string& arg);

}  // namespace kcache::test
