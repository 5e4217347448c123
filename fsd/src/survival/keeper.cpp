#include "keeper.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "fd_passing.hpp"
#include "log.hpp"
#include "state.hpp"

namespace kcache::fsd::keeper {

std::optional<Inherited> inherited() {
    const char* value = std::getenv(kServeEnv);
    if (!value) return std::nullopt;
    Inherited fds;
    if (std::sscanf(value, "%d,%d,%d,%d", &fds.fuse_fd, &fds.state_fd, &fds.ready_fd,
                    &fds.lock_fd) != 4) {
        return std::nullopt;
    }
    unsetenv(kServeEnv);
    return fds;
}

namespace {

std::string describe(int status) {
    if (WIFSIGNALED(status)) {
        return fmt::format("was killed by signal {} ({}){}", WTERMSIG(status),
                           strsignal(WTERMSIG(status)), WCOREDUMP(status) ? ", core dumped" : "");
    }
    return fmt::format("exited with status {}", WEXITSTATUS(status));
}

// Whether /proc says `pid`'s main thread is gone (a zombie, or no such process).
bool main_thread_gone(pid_t pid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) return true;
    buf[n] = '\0';
    const char* close = std::strrchr(buf, ')');
    return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

// Whether `pid` is dying: its main thread exited (a zombie) while another may still be
// stuck in the kernel. A daemon that exited whole is a zombie too until it is reaped:
// that one is dead, not dying, and its SIGCHLD is pending (a poll that timed out just
// before it exited must not start a successor for a clean stop).
bool dying(pid_t pid) {
    if (!main_thread_gone(pid)) return false;
    siginfo_t info{};
    const bool exited_whole =
        ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid;
    return !exited_whole;
}

// The binary to start: the path this one was started from, as it is on disk now.
std::string own_path() {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return "/proc/self/exe";
    std::string path(buf, static_cast<std::size_t>(n));
    const std::string deleted = " (deleted)";
    if (path.size() > deleted.size() &&
        path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0) {
        path.resize(path.size() - deleted.size());
    }
    return path;
}

class Keeper {
  public:
    Keeper(std::string mountpoint, char** argv, const Startup& startup)
        : m_mountpoint(std::move(mountpoint)), m_argv(argv), m_startup(startup) {}

    int run(const std::vector<std::string>& arguments,
            const std::optional<fd_store::Files>& adopted);

  private:
    // Mounts (or takes the mount systemd's fd store kept over), starts the first daemon
    // and reports "ready"; fails start-up when no daemon starts.
    void start(const std::vector<std::string>& arguments,
               const std::optional<fd_store::Files>& adopted);
    // SIGCHLD: reaps every child that ended, and replaces a serving daemon that died
    // unless `stopping`; false when one could not be replaced or died while stopping.
    bool reap_children(bool stopping);
    // Starts a daemon and waits until it is ready or dead; its message when it failed.
    std::optional<std::string> start_daemon();
    bool m_start_crashed = false;  // the last start_daemon() that failed: killed by a signal
    // Whether the daemon reported that it handed the mount over (m_report_fd).
    bool handed_over();
    // Starts the successor of a daemon that died or is dying; false: gave up.
    bool replace(pid_t old, const std::string& why);
    // How long to wait before starting the successor of a daemon that died (`why`):
    // counts a run of short-lived daemons (keeper.hpp, kShortLife); nullopt: a crash
    // loop, give up.
    std::optional<std::chrono::milliseconds> restart_delay(pid_t old, const std::string& why);
    // Mounts with libfuse's `arguments`; makes the state memfd. Fails start-up on error.
    void mount(const std::vector<std::string>& arguments);
    // Hands systemd the files a restarted keeper takes over (fd_store.hpp).
    void store_files();
    // Empties systemd's store, then unmounts (libfuse's session, or the adopted mount).
    void unmount();
    void unmount_adopted();

    std::string m_mountpoint;
    char** m_argv;
    const Startup& m_startup;
    std::string m_exe = own_path();
    // Where kcache-fsd was started: relative paths of its arguments are the daemons' too
    // (the keeper itself goes to / once detached).
    std::string m_cwd = std::filesystem::current_path().string();
    fuse_session* m_session = nullptr;  // the mount made here; null for an adopted one
    int m_fuse_fd = -1;
    int m_state_fd = -1;
    int m_lock_fd = -1;  // the db's daemon.lock, from the first daemon
    pid_t m_daemon = -1;
    std::chrono::steady_clock::time_point m_ready_at;  // when m_daemon said "ready"
    int m_short_lives = 0;  // daemons in a row that died within kShortLife of ready
    // The serving daemon's report socket after "ready": "handed over" once it stopped
    // reading requests (an upgrade), before its own clean-up, which may wait on a
    // notification only its successor can unblock.
    int m_report_fd = -1;
    std::vector<pid_t> m_dying;  // taken for dead, not yet reaped
    sigset_t m_old_mask{};
};

bool Keeper::handed_over() {
    if (m_report_fd < 0) return false;
    pollfd p{m_report_fd, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLIN)) return false;
    char buf[64];
    const ssize_t n = ::recv(m_report_fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) {  // the daemon is gone: SIGCHLD says how
        close(m_report_fd);
        m_report_fd = -1;
        return false;
    }
    return std::string(buf, static_cast<std::size_t>(n)).find("handed over") != std::string::npos;
}

std::optional<std::chrono::milliseconds> Keeper::restart_delay(pid_t old, const std::string& why) {
    using std::chrono::milliseconds;
    const auto lived = std::chrono::steady_clock::now() - m_ready_at;
    m_short_lives = lived < kShortLife ? m_short_lives + 1 : 0;
    if (m_short_lives == 0) {
        log::error("keeper: the serving daemon (pid {}) {}: starting another", old, why);
        return milliseconds(0);
    }
    const auto lived_ms = std::chrono::duration_cast<milliseconds>(lived).count();
    if (m_short_lives >= kCrashLoopDeaths) {
        log::error(
            "keeper: the serving daemon (pid {}) {}, {} ms after it started: {} daemons in a "
            "row died within {} ms (a crash loop: is {} broken?): unmounting {}",
            old, why, lived_ms, m_short_lives, kShortLife.count(), m_exe, m_mountpoint);
        return std::nullopt;
    }
    if (m_short_lives <= kFreeRestarts) {
        log::error(
            "keeper: the serving daemon (pid {}) {}, {} ms after it started: starting "
            "another",
            old, why, lived_ms);
        return milliseconds(0);
    }
    const milliseconds delay = std::min(
        kMaxBackoff, kFirstBackoff * (1 << std::min(m_short_lives - kFreeRestarts - 1, 16)));
    log::error(
        "keeper: the serving daemon (pid {}) {}, {} ms after it started ({} in a row): "
        "starting another in {} ms; the mount ends after {} in a row",
        old, why, lived_ms, m_short_lives, delay.count(), kCrashLoopDeaths);
    return delay;
}

bool Keeper::replace(pid_t old, const std::string& why) {
    if (why == "handed the mount over") {
        log::info("keeper: daemon {} handed the mount over; starting {}", old, m_exe);
        m_short_lives = 0;
    } else {
        const auto delay = restart_delay(old, why);
        if (!delay) return false;
        // Signals wait meanwhile (they are blocked, taken by sigtimedwait): a SIGTERM is
        // late by one delay at most.
        if (delay->count() > 0) std::this_thread::sleep_for(*delay);
    }
    const auto started = std::chrono::steady_clock::now();
    for (int tries = 1;; ++tries) {
        auto failed = start_daemon();
        if (!failed) break;
        log::error("keeper: a new daemon could not start: {}", *failed);
        if (tries >= kQuickDeaths) {
            log::error("keeper: {} daemons in a row could not start: unmounting {}", tries,
                       m_mountpoint);
            return false;
        }
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    log::info("keeper: daemon {} serves {} ({:.0f} ms to start)", m_daemon, m_mountpoint, ms);
    return true;
}

std::optional<std::string> Keeper::start_daemon() {
    int ready[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ready) != 0)
        return fmt::format("cannot make a socket pair: {}", std::strerror(errno));
    const std::string fds = fmt::format("{},{},{},{}", m_fuse_fd, m_state_fd, ready[1], m_lock_fd);
    const pid_t keeper = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
        close(ready[0]);
        close(ready[1]);
        return fmt::format("cannot fork: {}", std::strerror(errno));
    }
    if (pid == 0) {
        // The daemon dies with its keeper: nobody would restart it (keeper.hpp).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != keeper) _exit(1);
        for (int fd : {m_fuse_fd, m_state_fd, ready[1], m_lock_fd})
            if (fd >= 0) fcntl(fd, F_SETFD, 0);
        setenv(kServeEnv, fds.c_str(), 1);
        unsetenv("NOTIFY_SOCKET");  // the keeper is the service's main process
        sigprocmask(SIG_SETMASK, &m_old_mask, nullptr);
        if (chdir(m_cwd.c_str()) != 0) _exit(127);
        execv(m_exe.c_str(), m_argv);
        const std::string message =
            fmt::format("cannot start the daemon {}: {}", m_exe, std::strerror(errno));
        (void)!::write(ready[1], message.data(), message.size());
        _exit(127);
    }
    close(ready[1]);
    m_daemon = pid;
    std::string message;
    char buf[512];
    for (;;) {
        std::vector<int> passed;  // the daemon's lock file, with its "ready"
        const ssize_t n = receive_with_fds(ready[0], buf, sizeof buf, passed);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (const int fd : passed) {
            if (m_lock_fd < 0)
                m_lock_fd = fd;
            else
                ::close(fd);
        }
        message.append(buf, static_cast<std::size_t>(n));
        if (message == "ready") break;
    }
    if (message == "ready") {
        m_ready_at = std::chrono::steady_clock::now();
        if (m_report_fd >= 0) close(m_report_fd);
        m_report_fd = ready[0];
        return std::nullopt;
    }
    close(ready[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    m_daemon = -1;
    m_start_crashed = WIFSIGNALED(status);
    if (message.empty()) message = "the daemon died during start-up: it " + describe(status);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    const std::string prefix = "kcache-fsd: ";
    if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
    return message;
}

void Keeper::mount(const std::vector<std::string>& arguments) {
    std::vector<std::string> storage = arguments;
    std::vector<char*> argv;
    for (auto& a : storage) argv.push_back(a.data());
    fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
    static const fuse_lowlevel_ops no_ops{};
    m_session = fuse_session_new(&args, &no_ops, sizeof no_ops, nullptr);
    if (!m_session) m_startup.fail("invalid FUSE options (see above)");
    if (fuse_session_mount(m_session, m_mountpoint.c_str()) != 0) {
        fuse_session_destroy(m_session);
        m_session = nullptr;
        m_startup.fail(fmt::format(
            "cannot mount {} (is /dev/fuse usable and fusermount3 installed?)", m_mountpoint));
    }
    m_fuse_fd = fuse_session_fd(m_session);
    m_state_fd = memfd_create(fd_store::kStateMemfdName, MFD_CLOEXEC);
    if (m_state_fd < 0 || ftruncate(m_state_fd, StateFile::kSize) != 0) {
        const std::string why = std::strerror(errno);
        unmount();
        m_startup.fail(fmt::format("cannot make the daemon's state memfd: {}", why));
    }
}

void Keeper::store_files() {
    if (!fd_store::under_systemd()) return;
    bool stored = fd_store::store(fd_store::kFuseName, m_fuse_fd) &&
                  fd_store::store(fd_store::kStateName, m_state_fd);
    if (stored && m_lock_fd >= 0) stored = fd_store::store(fd_store::kLockName, m_lock_fd);
    if (stored)
        log::info("keeper: systemd's fd store holds the mount's files: a restart takes it over");
    else
        log::warning(
            "keeper: systemd's fd store did not take the mount's files: a restart of "
            "this keeper mounts afresh");
}

void Keeper::unmount() {
    // First: systemd's copy of /dev/fuse would keep the connection alive after the
    // unmount, and hand the next start a dead mount's files.
    fd_store::empty();
    if (m_session) {
        fuse_session_unmount(m_session);  // closes the fd; nothing if already unmounted
        fuse_session_destroy(m_session);
        m_session = nullptr;
    } else if (m_fuse_fd >= 0) {
        unmount_adopted();
    }
    m_fuse_fd = -1;
}

// What libfuse's fuse_session_unmount does for a mount it made (fuse_kern_unmount, not
// public): nothing if the connection is gone already (POLLERR), else the fd closed first
// (a synchronous unmount would wait on the file system it serves), then a lazy unmount,
// as root by umount2, else by fusermount3 -u -z.
void Keeper::unmount_adopted() {
    pollfd p{m_fuse_fd, 0, 0};
    const bool gone = ::poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
    ::close(m_fuse_fd);
    m_fuse_fd = -1;
    if (gone || ::umount2(m_mountpoint.c_str(), MNT_DETACH) == 0) return;
    const pid_t pid = fork();
    if (pid == 0) {
        sigprocmask(SIG_SETMASK, &m_old_mask, nullptr);
        execlp("fusermount3", "fusermount3", "-u", "-q", "-z", "--", m_mountpoint.c_str(),
               static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    // Bounded: a lazy unmount does not wait on the file system.
    for (int i = 0; pid > 0 && i < 200; ++i) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                log::error("keeper: fusermount3 -u -z {} failed", m_mountpoint);
            return;
        }
        usleep(50 * 1000);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    log::error("keeper: cannot unmount {}", m_mountpoint);
}

int Keeper::run(const std::vector<std::string>& arguments,
                const std::optional<fd_store::Files>& adopted) {
    // Signals are taken synchronously (sigwaitinfo); the daemon gets the old mask back.
    sigset_t mask;
    sigemptyset(&mask);
    for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&mask, sig);
    sigprocmask(SIG_BLOCK, &mask, &m_old_mask);

    start(arguments, adopted);

    bool stopping = false;
    int code = 0;
    const timespec poll{0, 20 * 1000 * 1000};  // how often a daemon is checked for dying
    while (m_daemon > 0) {
        siginfo_t info{};
        const int sig = sigtimedwait(&mask, &info, &poll);
        if (sig < 0) {
            if (errno == EAGAIN && !stopping && handed_over()) {
                const pid_t old = m_daemon;
                m_dying.push_back(old);
                m_daemon = -1;
                if (!replace(old, "handed the mount over")) code = 1;
            } else if (errno == EAGAIN && !stopping && dying(m_daemon)) {
                const pid_t old = m_daemon;
                m_dying.push_back(old);
                m_daemon = -1;
                if (!replace(old, "is dying (a thread of it is stuck in the kernel)")) code = 1;
            }
            continue;
        }
        if (sig == SIGTERM || sig == SIGINT) {
            stopping = true;
            kill(m_daemon, SIGTERM);  // the daemon flushes and exits 0
            continue;
        }
        if (sig == SIGHUP) {
            log::info("keeper: SIGHUP: replacing daemon {} with {}", m_daemon, m_exe);
            kill(m_daemon, SIGUSR2);  // it hands over at a request boundary
            continue;
        }
        if (!reap_children(stopping)) code = 1;
    }
    fd_store::notify("STOPPING=1");
    unmount();
    log::info("keeper: {} unmounted", m_mountpoint);
    return code;
}

void Keeper::start(const std::vector<std::string>& arguments,
                   const std::optional<fd_store::Files>& adopted) {
    if (adopted) {
        // systemd kept the files of a keeper that died: its mount is served again as is.
        m_fuse_fd = adopted->fuse;
        m_state_fd = adopted->state;
        m_lock_fd = adopted->lock;
        log::info("keeper {}: took {} over from systemd's fd store (not mounting again)", getpid(),
                  m_mountpoint);
    } else {
        mount(arguments);
    }
    auto failed = start_daemon();
    if (failed && m_start_crashed) {
        // Killed by a signal while it opened the db: its crash marker makes the next one
        // set a db it cannot open aside (db_damage.cpp, kStartupCrash), so one more try.
        log::error("keeper: the first daemon could not start ({}): starting another", *failed);
        failed = start_daemon();
    }
    if (failed) {
        unmount();
        m_startup.fail(*failed);
    }
    if (!adopted) store_files();  // kept by systemd across restarts: stored once
    m_startup.ready();
    fd_store::notify(fmt::format("READY=1\nMAINPID={}", getpid()));
    log::info("keeper {}: serving {} through daemon {}", getpid(), m_mountpoint, m_daemon);
}

bool Keeper::reap_children(bool stopping) {
    bool replaced = true;
    for (;;) {
        int status = 0;
        const pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        if (pid != m_daemon) {
            std::erase(m_dying, pid);
            log::info("keeper: the previous daemon (pid {}) {}", pid, describe(status));
            continue;
        }
        m_daemon = -1;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;  // unmounted, or stopped
        if (stopping) {
            replaced = false;
            log::error("keeper: the daemon {} while stopping", describe(status));
            break;
        }
        if (WIFEXITED(status) && WEXITSTATUS(status) == kHandedOver) {
            if (!replace(pid, "handed the mount over")) replaced = false;
        } else if (!replace(pid, describe(status))) {
            replaced = false;
        }
    }
    return replaced;
}

}  // namespace

int run(const std::string& mountpoint, const std::vector<std::string>& fuse_args, char** argv,
        const Startup& startup, const std::optional<fd_store::Files>& adopted) {
    Keeper keeper(mountpoint, argv, startup);
    return keeper.run(fuse_args, adopted);
}

}  // namespace kcache::fsd::keeper
