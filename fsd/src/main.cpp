// kcache-fsd: mounts a kcache db as a directory.
//
// Processes: kcache-fsd forks first (unless -f) and the parent waits for "ready" (exit
// 0) or the error (exit 1). The process that stays is the keeper (keeper.hpp): it
// mounts and runs the serving daemon, this binary again with $KCACHE_FSD_SERVE set,
// which opens the db and serves the mount the keeper holds; a daemon that starts on a
// state a dead one left takes the mount over (takeover.hpp). An LMDB environment must
// not cross a fork(): only the serving daemon opens the db. What can be wrong with the
// mountpoint is reported before anything is mounted; what is wrong with the db, by
// the first daemon, after which the keeper unmounts. Under systemd a keeper restarted
// with its predecessor's files (fd_store.hpp) serves that mount instead of mounting.
// --no-keeper: one process opens the db, mounts and serves (a crash then ends the
// mount).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "fd_passing.hpp"
#include "fd_store.hpp"
#include "filesystem.hpp"
#include "kcache/core/holds.hpp"
#include "kcache/core/integrity.hpp"
#include "kcache/core/store.hpp"
#include "keeper.hpp"
#include "log.hpp"
#include "options.hpp"
#include "resend.hpp"
#include "state.hpp"
#include "takeover.hpp"
#include "uring_area.hpp"
#include "uring_transport.hpp"

namespace {

using kcache::core::Error;
using kcache::core::fail;
using kcache::core::Status;
namespace fsd = kcache::fsd;

// Reports start-up success or failure to the parent that waits for it.
class StartupPipe {
  public:
    // Forks; returns only in the child. The parent exits with the child's verdict.
    void fork_daemon() {
        int fds[2];
        // Close-on-exec: the daemons the keeper starts must not hold the parent's pipe.
        if (pipe2(fds, O_CLOEXEC) != 0) return;  // then stay in the foreground
        const pid_t pid = fork();
        if (pid < 0) return;
        if (pid > 0) {
            close(fds[1]);
            std::string message;
            char buf[512];
            for (;;) {
                const ssize_t n = ::read(fds[0], buf, sizeof buf);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) break;
                message.append(buf, static_cast<std::size_t>(n));
            }
            if (message == "ready") std::_Exit(0);
            std::fputs(
                message.empty() ? "kcache-fsd: the daemon died during start-up\n" : message.c_str(),
                stderr);
            std::_Exit(1);
        }
        close(fds[0]);
        m_fd = fds[1];
        setsid();
    }
    // A daemon started by a keeper reports to it through `fd`; it detaches (its stderr
    // to the log) only when the keeper did (not -f).
    void report_to(int fd, bool detach) {
        m_fd = fd;
        m_detach = detach;
    }
    // A file the keeper keeps, sent with "ready" (the report is a unix socket then).
    void pass_fd(int fd) { m_pass_fd = fd; }
    void fail_startup(const std::string& message) {
        const std::string line = "kcache-fsd: " + message + "\n";
        if (m_fd >= 0)
            (void)!::write(m_fd, line.data(), line.size());
        else
            std::fputs(line.c_str(), stderr);
        std::exit(1);
    }
    // Detaches from the terminal; the daemon's messages go to `log_path`.
    void ready(const std::string& log_path) {
        if (m_fd < 0) return;
        if (m_pass_fd >= 0) send_ready();
        if (!m_detach) {
            if (m_pass_fd < 0) (void)!::write(m_fd, "ready", 5);
            close(m_fd);
            m_fd = -1;
            return;
        }
        const int null = ::open("/dev/null", O_RDWR);
        const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (null >= 0) {
            dup2(null, STDIN_FILENO);
            dup2(null, STDOUT_FILENO);
        }
        if (log >= 0) dup2(log, STDERR_FILENO);
        if (m_pass_fd < 0) (void)!::write(m_fd, "ready", 5);
        close(m_fd);
        m_fd = -1;
        (void)!chdir("/");
    }

  private:
    void send_ready() { (void)fsd::send_with_fds(m_fd, "ready", {m_pass_fd}); }

    int m_fd = -1;
    bool m_detach = true;
    int m_pass_fd = -1;
};

// Unmounts a dead FUSE mount (its daemon, and its keeper, died) lazily: processes that
// still hold files or directories there keep the dead mount, everyone else gets the
// new one. As root by umount2, else by fusermount3 -uz.
Status unmount_dead(const std::string& path) {
    if (::umount2(path.c_str(), MNT_DETACH) == 0) return {};
    const int err = errno;
    const pid_t pid = fork();
    if (pid == 0) {
        const int null = ::open("/dev/null", O_RDWR);
        if (null >= 0) dup2(null, STDOUT_FILENO);
        execlp("fusermount3", "fusermount3", "-uz", path.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    if (pid > 0) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
    return fail(ENOTCONN, fmt::format("mountpoint {} is a dead mount and cannot be unmounted "
                                      "(umount2: {}; fusermount3 -uz failed): run `fusermount3 "
                                      "-uz {}`",
                                      path, std::strerror(err), path));
}

Status check_mountpoint(const std::string& path) {
    struct stat st {};
    // ENOTCONN, or ECONNABORTED where the connection was aborted (fusectl).
    if (::stat(path.c_str(), &st) != 0 && (errno == ENOTCONN || errno == ECONNABORTED)) {
        // A mount whose daemon and keeper died: recovered without a person (issue 20).
        KCACHE_TRY(unmount_dead(path));
        fsd::log::warning(
            "mountpoint {} was a dead mount (its daemon and keeper had died): unmounted it "
            "lazily; processes that held files or directories there must reopen them",
            path);
    }
    if (::stat(path.c_str(), &st) != 0)
        return fail(errno, fmt::format("mountpoint {}: {}", path, std::strerror(errno)));
    if (!S_ISDIR(st.st_mode))
        return fail(ENOTDIR, fmt::format("mountpoint {} is not a directory", path));
    DIR* dir = opendir(path.c_str());
    if (!dir) return fail(errno, fmt::format("mountpoint {}: {}", path, std::strerror(errno)));
    bool empty = true;
    while (dirent* d = readdir(dir)) {
        if (std::strcmp(d->d_name, ".") != 0 && std::strcmp(d->d_name, "..") != 0) {
            empty = false;
            break;
        }
    }
    closedir(dir);
    if (!empty) return fail(ENOTEMPTY, fmt::format("mountpoint {} is not empty", path));
    return {};
}

// One daemon per db: a second one would double-count statistics and race evictions.
// Under a keeper the lock is the keeper's too: the first daemon hands its file to the
// keeper (StartupPipe::pass_fd), which passes it to every successor (`inherited`, the same
// open file, so locked already): a daemon that is still dying does not keep the next one
// out. Returns the locked file.
kcache::core::Result<int> lock_db_for_daemon(const std::string& db, const std::string& mountpoint,
                                             int inherited) {
    const std::string path = db + "/daemon.lock";
    const int fd =
        inherited >= 0 ? inherited : ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return fail(errno, fmt::format("db {}: {}: {}", db, path, std::strerror(errno)));
    // A daemon killed with its keeper a moment ago may not have exited yet: its lock
    // goes with it (PR_SET_PDEATHSIG, keeper.hpp), so a held lock is tried for a while.
    bool locked = false;
    for (int tries = 0; tries < 30 && !(locked = flock(fd, LOCK_EX | LOCK_NB) == 0); ++tries)
        usleep(100 * 1000);
    if (!locked) {
        char owner[512] = {};
        (void)!::pread(fd, owner, sizeof owner - 1, 0);
        close(fd);
        return fail(EBUSY, fmt::format("db {} is already served by kcache-fsd ({})", db,
                                       owner[0] ? owner : "unknown process"));
    }
    const std::string owner = fmt::format("pid {} at {}", getpid(), mountpoint);
    (void)!ftruncate(fd, 0);
    (void)!::pwrite(fd, owner.data(), owner.size(), 0);
    return fd;  // stays open (and locked) for the life of the daemon
}

// A daemon that dies of a signal a damaged page can cause (LMDB's assertions abort,
// a wild read faults) leaves this file in the db directory: its successor then checks
// the db deeply (check_structure's `deep`) before it serves, and removes it.
constexpr const char* kCrashMarker = "crashed";
char g_crash_marker_path[4096];  // set before the handler is installed
// Set until the daemon is ready: a fault before then is the db's, not chance's (see
// kStartupCrash).
volatile sig_atomic_t g_starting = 1;
// What the marker of a daemon that died before it was ready starts with: its successor
// sets the db aside at once. The start-up check found nothing and yet opening the db
// faulted, so it is damaged where the check does not look, and would fault again.
constexpr std::string_view kStartupCrash = "a starting daemon died";

extern "C" void on_fatal_signal(int sig) {
    // System calls only: open, write, close, then the signal again.
    const int fd = ::open(g_crash_marker_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        char serving[] = "a serving daemon died of signal 00";
        char starting[] = "a starting daemon died of signal 00";
        char* text = g_starting ? starting : serving;
        const std::size_t size = g_starting ? sizeof starting : sizeof serving;
        text[size - 3] = static_cast<char>('0' + sig / 10 % 10);
        text[size - 2] = static_cast<char>('0' + sig % 10);
        (void)!::write(fd, text, size - 1);
        ::close(fd);
    }
    // Then the default action (SA_RESETHAND): the daemon is not dumpable
    // (install_crash_marker), so it ends at once, and the keeper logs the signal.
    raise(sig);
}

void install_crash_marker(const std::string& db) {
    // Not dumpable: a fault then ends the daemon at once. A core dump first waits for
    // every thread of the daemon, among them one waiting for a FUSE answer that only a
    // successor could give, so the daemon never died and the keeper never started one
    // (seen with pages of data.mdb overwritten under a live mount). libfuse's workers
    // block every signal, so a fault there takes the default action, not the handler.
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    const std::string path = db + "/" + kCrashMarker;
    if (path.size() >= sizeof g_crash_marker_path) return;
    std::memcpy(g_crash_marker_path, path.c_str(), path.size() + 1);
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    action.sa_flags = static_cast<int>(SA_RESETHAND | SA_NODEFER);
    sigemptyset(&action.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE}) sigaction(sig, &action, nullptr);
}

// Why the db at `db` must be set aside (core/integrity.hpp), or nullopt when it is sound
// (or not there yet). A marker a daemon left on finding it corrupt while serving
// (Filesystem::db_corrupt) says so; else, when `full` or after a crash (kCrashMarker,
// then deeply), core::check_structure runs in a forked child, since a page bad enough
// makes LMDB read outside the map (SIGSEGV, SIGBUS) or abort: such a death is damage
// too. Errors that are no damage (EACCES, a newer schema ...) are left to the daemon's
// own open, which reports them.
std::optional<std::string> db_damage(const std::string& db, bool full, bool read_only) {
    std::error_code ec;
    if (!std::filesystem::exists(db + "/data.mdb", ec)) return std::nullopt;
    // Every kcache process that opened the db made its kcache.lock: without one it is no
    // kcache db (a data.mdb of something else), which is refused, never moved.
    if (!std::filesystem::exists(db + "/kcache.lock", ec)) return std::nullopt;
    const std::string marker = db + "/" + fsd::kCorruptMarker;
    if (std::ifstream in(marker); in) {
        std::stringstream reason;
        reason << in.rdbuf();
        return "the daemon before found it corrupt: " + reason.str();
    }
    const std::string crash_marker = db + "/" + kCrashMarker;
    if (std::ifstream in(crash_marker); in) {
        std::stringstream reason;
        reason << in.rdbuf();
        if (reason.str().rfind(kStartupCrash, 0) == 0)
            return reason.str() + " while it opened the db, after the start-up check passed";
    }
    const bool deep = std::filesystem::exists(crash_marker, ec);
    if (!full && !deep) return std::nullopt;
    std::remove(crash_marker.c_str());  // checked now; a damaged db is moved with it gone
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
    const pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return std::nullopt;
    }
    if (pid == 0) {
        close(fds[0]);
        kcache::core::OpenOptions open;
        open.path = db;
        open.create = false;
        open.read_only = read_only;
        auto store = kcache::core::Store::open(open);
        kcache::core::Status checked;
        if (!store)
            checked = tl::unexpected(store.error());
        else
            checked = kcache::core::check_structure(**store, deep);
        if (checked && !read_only) {
            // A write transaction that is never committed: it takes pages from LMDB's
            // free list as the daemon's first one will, where a damaged free list page
            // aborts or faults here rather than there.
            auto tried = (*store)->update([](kcache::core::WriteTxn& txn) -> Status {
                KCACHE_TRY(txn.add(kcache::core::Counter::damaged_dbs, 0));
                KCACHE_TRY(txn.set_config(txn.config()));
                return fail(ECANCELED, "a trial: never committed");
            });
            if (!tried && tried.error().code != ECANCELED) checked = tried;
        }
        if (checked) std::_Exit(0);
        (void)!::write(fds[1], checked.error().message.data(), checked.error().message.size());
        std::_Exit(checked.error().code == kcache::core::kCorruptDb ? 3 : 4);
    }
    close(fds[1]);
    std::string message;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
        message.append(buf, static_cast<std::size_t>(n));
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) {
        return fmt::format("its start-up check died of signal {} ({}): LMDB met a damaged page",
                           WTERMSIG(status), strsignal(WTERMSIG(status)));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3) return message;
    return std::nullopt;
}

// libfuse's arguments for the session (and the keeper's mount).
std::vector<std::string> fuse_arguments(const fsd::Options& options) {
    std::vector<std::string> args{"kcache-fsd", "-o",
                                  "fsname=kcache:" + options.db + ",subtype=kcache"};
    for (const auto& o : options.fuse_options) {
        args.push_back("-o");
        args.push_back(o);
    }
    if (options.debug) args.push_back("-d");
    return args;
}

// Opens the db and serves the mount: mounted here (--no-keeper), or the keeper's
// (`inherited`), which this daemon may take over from one that died.
int serve(const fsd::Options& options, const std::string& mountpoint, StartupPipe& startup,
          const std::optional<fsd::keeper::Inherited>& inherited) {
    // SIGTERM, SIGINT and SIGHUP end the FUSE loop only where they interrupt the thread
    // that waits for it (libfuse's handler sets a flag, then that thread must wake): a
    // thread of ours that took one (the background thread, the shared tier's...) left
    // the daemon serving. So every thread started from here on blocks them, and this
    // one takes them again just before the loop (libfuse's workers block them too).
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, sig);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    // A predecessor's ring entries are mapped where it had them before anything else
    // takes the address (uring_area.hpp): the db's map, threads' stacks.
    if (inherited && options.io_uring) fsd::uring_area::reserve_inherited(inherited->state_fd);

    kcache::core::OpenOptions open;
    open.path = options.db;
    open.create = !options.read_only;
    open.read_only = options.read_only;
    open.durability = options.durability;
    if (options.entry_depth) open.entry_depth = options.entry_depth;
    // The start-up check (docs/operations.md, "A damaged db"): the whole walk when this
    // daemon mounts, only the marker of a predecessor that found damage when it takes a
    // mount over (a kill -9's successor must start at once). A damaged db is set aside
    // and a fresh one served: a cache is rebuilt by its compilers, a node that cannot
    // compile is not. Read-only serving changes nothing: it refuses to start instead.
    // A daemon a keeper starts on a mount another daemon served has the db's lock already.
    const bool taking_over = inherited && inherited->lock_fd >= 0;
    std::optional<std::string> damage = db_damage(options.db, !taking_over, options.read_only);
    // From here a fault leaves a marker (install_crash_marker): one before "ready" makes
    // the successor set the db aside (kStartupCrash), one later makes it check deeply.
    if (!damage && !options.read_only) install_crash_marker(options.db);
    auto store = damage ? kcache::core::Result<std::unique_ptr<kcache::core::Store>>(
                              fail(kcache::core::kCorruptDb, *damage))
                        : kcache::core::Store::open(open);
    std::string set_aside;  // where the damaged db went
    // One daemon per db (lock_db_for_daemon), taken before a set-aside or the first change.
    std::optional<int> lock_fd;
    auto take_lock = [&] {
        if (lock_fd) return;
        auto lock = lock_db_for_daemon(options.db, mountpoint, inherited ? inherited->lock_fd : -1);
        if (!lock) startup.fail_startup(lock.error().message);
        lock_fd = *lock;
    };
    // Only a db known to be a kcache db is set aside: one the check found damaged (it
    // opens only where kcache.lock is), or the one a predecessor served. A data.mdb of
    // garbage in a directory kcache never used is refused (exit 1), as before.
    if (!store && store.error().code == kcache::core::kCorruptDb && !options.read_only &&
        (damage || taking_over)) {
        take_lock();  // a daemon serving it would keep this one out: nothing is moved then
        const std::string why = store.error().message;
        auto aside = kcache::core::set_aside(options.db, kcache::core::system_clock_ns());
        if (!aside)
            startup.fail_startup(fmt::format("db {} is damaged ({}) and cannot be set aside: {}",
                                             options.db, why, aside.error().message));
        set_aside = *aside;
        std::remove((options.db + "/" + fsd::kCorruptMarker).c_str());
        fsd::log::error(
            "DB DAMAGED: {} ({}); set aside as {} for `kcache verify --db` and a "
            "person; serving a fresh db",
            options.db, why, set_aside);
        store = kcache::core::Store::open(open);
        if (store) {
            // The kernel may still know the old db's inode numbers (a takeover): the
            // fresh one starts far above them (seconds << 24: later set-asides higher).
            const auto floor =
                static_cast<std::uint64_t>(kcache::core::system_clock_ns() / 1000000000) << 24;
            auto marked = (*store)->update([&](kcache::core::WriteTxn& txn) -> Status {
                KCACHE_TRY(kcache::core::start_inodes_at(txn, floor));
                return txn.add(kcache::core::Counter::damaged_dbs, 1);
            });
            if (!marked) startup.fail_startup(marked.error().message);
        }
    }
    if (damage && store && !options.read_only) install_crash_marker(options.db);  // the fresh db
    if (!store && store.error().code == EROFS) {
        startup.fail_startup(store.error().message +
                             " (serve it read-only with --read-only or -o ro)");
    }
    if (!store) startup.fail_startup(store.error().message);
    // A read-only daemon changes nothing (no statistics, no eviction): several may
    // serve one db, beside a read-write one, and its filesystem may be read-only.
    if (!options.read_only) {
        take_lock();
        if (inherited && inherited->lock_fd < 0) startup.pass_fd(*lock_fd);
        // Limits given on the command line become the db's (the CLI sees the same ones).
        auto configured = (*store)->update([&](kcache::core::WriteTxn& txn) -> Status {
            kcache::core::Config config = txn.config();
            if (options.max_bytes) config.max_bytes = options.max_bytes;
            if (options.max_entries) config.max_entries = options.max_entries;
            if (options.entry_depth) config.entry_depth = options.entry_depth;
            if (options.layout_rules) config.layout_rules = *options.layout_rules;
            return txn.set_config(config);
        });
        if (!configured) startup.fail_startup(configured.error().message);
    }

    // SIGUSR2 (from the keeper: an upgrade) is taken by the hand-over thread below; every
    // thread made from here on inherits the mask.
    sigset_t handover_signals;
    sigemptyset(&handover_signals);
    sigaddset(&handover_signals, SIGUSR2);
    if (inherited) pthread_sigmask(SIG_BLOCK, &handover_signals, nullptr);

    // The handle table and the saved INIT: the keeper's memfd, or private memory.
    auto state = fsd::StateFile::map(inherited ? inherited->state_fd : -1);
    if (!state) startup.fail_startup(state.error().message);
    fsd::Filesystem filesystem(**store, options, state->get());
    // Kept after "ready": an upgrade reports "handed over" on it (keeper.hpp).
    const int report_fd = inherited ? fcntl(inherited->ready_fd, F_DUPFD_CLOEXEC, 0) : -1;
    // The shared tier, made after the fork (its threads must not cross it). It connects
    // lazily: an unreachable Redis does not stop start-up, it only costs misses.
    std::unique_ptr<fsd::RemoteTier> remote;
    if (options.remote) {
        auto made = fsd::RemoteTier::create(**store, *options.remote, options.prefetch_job_tag,
                                            options.job_tag);
        if (!made) startup.fail_startup(made.error().message);
        remote = std::move(*made);
        filesystem.attach_remote(remote.get());
    }
    std::vector<std::string> arg_storage = fuse_arguments(options);
    std::vector<char*> fuse_argv;
    for (auto& a : arg_storage) fuse_argv.push_back(a.data());
    fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());
    fuse_session* session = fuse_session_new(&args, &fsd::Filesystem::operations(),
                                             sizeof(fuse_lowlevel_ops), &filesystem);
    if (!session) startup.fail_startup("invalid FUSE options (see above)");
    if (fuse_set_signal_handlers(session) != 0)
        startup.fail_startup("cannot install signal handlers");
    // The keeper's mount: libfuse takes "/dev/fd/N" as an open connection (and leaves the
    // unmount to the keeper).
    const std::string device =
        inherited ? fmt::format("/dev/fd/{}", inherited->fuse_fd) : mountpoint;
    if (fuse_session_mount(session, device.c_str()) != 0) {
        startup.fail_startup(fmt::format(
            "cannot mount {} (is /dev/fuse usable and fusermount3 installed?)", mountpoint));
    }
    const bool resuming = (*state)->inherited();
    const std::size_t adopted = resuming ? filesystem.adopt_handles() : 0;
    if (!resuming && !options.read_only) {
        // A fresh mount: the kernel knows no open file, so no hold a dead mount's
        // daemons took for one (core/holds.hpp) can be used again. A takeover keeps them.
        auto cleared = [&]() -> kcache::core::Result<std::uint64_t> {
            auto txn = KCACHE_TRY((*store)->write());
            const std::uint64_t n = KCACHE_TRY(kcache::core::clear_holds(txn));
            KCACHE_TRY(txn.commit());
            return n;
        }();
        if (!cleared)
            fsd::log::warning("cannot clear the holds of a previous mount: {}",
                              cleared.error().message);
        else if (*cleared)
            fsd::log::info("cleared {} holds on blobs for files a previous mount had open",
                           *cleared);
    }
    g_starting = 0;  // the db is open and read: a fault from here on is no start-up's
    fsd::takeover::begin(**state, fuse_session_fd(session));
    fsd::resend::attach(**state);
    // --io-uring: the rings are set up when the kernel's INIT comes (uring_transport.hpp);
    // /dev/fuse serves until then, and alone where the kernel does not offer them.
    std::unique_ptr<fsd::UringTransport> uring;
    if (options.io_uring)
        uring =
            fsd::UringTransport::install(session, inherited ? inherited->state_fd : -1, mountpoint);
    if (!uring) fsd::takeover::install_plain(session);
    if (remote) remote->start();
    filesystem.start(session);
    startup.ready(options.db + "/fsd.log");
    if (resuming) {
        fsd::log::info("took over {} at {} (daemon {}; {} open handles left by the previous one)",
                       options.db, mountpoint, getpid(), adopted);
    } else {
        fsd::log::info("serving {} at {}{}", options.db, mountpoint,
                       options.read_only ? " read-only" : "");
    }
    if (!set_aside.empty())
        fsd::log::error("DB DAMAGED: serving a fresh db; the damaged one is kept at {}", set_aside);
    if (options.remote && !resuming) {
        std::string servers;
        for (const auto& e : options.remote->servers)
            servers += (servers.empty() ? "" : ", ") + e.id();
        fsd::log::info("shared tier: {} (namespace {}{})", servers, options.remote->ns,
                       options.remote->read_only ? ", read-only" : "");
    }

    // An upgrade (keeper.hpp): on SIGUSR2 the daemon stops at a request boundary once no
    // writer has unpublished bytes (Filesystem::try_hand_over), and exits kHandedOver;
    // what it had read and not answered is resent to its successor.
    std::atomic<bool> loop_done{false};
    std::atomic<bool> handed_over{false};
    std::thread handover;
    if (inherited) {
        handover = std::thread([&] {
            const timespec tick{0, 100 * 1000 * 1000};
            while (!loop_done) {
                siginfo_t info{};
                if (sigtimedwait(&handover_signals, &info, &tick) != SIGUSR2) continue;
                fsd::log::info("upgrade: handing the mount over at a request boundary");
                const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
                bool ready = false;
                while (!loop_done && !(ready = filesystem.try_hand_over()) &&
                       std::chrono::steady_clock::now() < deadline) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(2));
                }
                if (!ready) {
                    fsd::log::warning(
                        "upgrade postponed: writers kept bytes unpublished for 30 s (SIGHUP to "
                        "the keeper tries again)");
                    continue;
                }
                handed_over = true;
                fuse_session_exit(session);
                kill(getpid(), SIGTERM);  // wakes the loop: libfuse's handler ends it
                return;
            }
        });
    }

    // One pending since start-up is taken here: the loop then ends at once.
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
    fuse_loop_config* loop = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(loop, 0);
    fuse_loop_cfg_set_max_threads(loop, 16);
    const int rc = fuse_session_loop_mt(session, loop);
    fuse_loop_cfg_destroy(loop);
    loop_done = true;
    if (handover.joinable()) handover.join();
    // Handed over: the successor may start now. Its resend brings back what this daemon
    // read and left unanswered; what the clean-up below waits on may need it. The ring
    // threads end first, with no entry waiting in the kernel (hand_over): the successor
    // answers what their entries hold then, and only once nobody else can
    // (uring_area.hpp).
    if (handed_over && uring) uring->hand_over();
    if (handed_over) (void)!::send(report_fd, "handed over", 11, MSG_NOSIGNAL);

    if (uring) uring->stop();       // no handler runs after this; later replies are refused
    if (remote) remote->stop();     // waiting lookups answered, counts recorded
    filesystem.stop();              // statistics flushed, db synced; no notification after this
    uring.reset();                  // no reply can come any more
    fuse_session_unmount(session);  // the keeper's mount: left to the keeper
    fuse_remove_signal_handlers(session);
    fuse_session_destroy(session);
    fuse_opt_free_args(&args);
    // A loop ended by SIGTERM/SIGINT/SIGHUP returns the signal: a clean stop too.
    const bool clean = rc == 0 || rc == SIGTERM || rc == SIGINT || rc == SIGHUP;
    if (handed_over) {
        fsd::log::info("daemon {} handed the mount over", getpid());
        return fsd::keeper::kHandedOver;
    }
    if (clean && !inherited)
        fsd::log::info("unmounted {}", mountpoint);
    else if (clean)
        fsd::log::info("daemon {} stopped", getpid());
    else
        fsd::log::error("the FUSE loop failed ({}){}", rc,
                        inherited ? "" : fmt::format("; unmounted {}", mountpoint));
    return clean ? 0 : 1;
}

}  // namespace

// kcache-fsd --upgrade MOUNTPOINT: SIGHUP to the mount's keeper, which replaces its
// daemon with the binary on disk; returns once another daemon serves (exit 0).
int upgrade(const std::string& path) {
    std::error_code ec;
    const std::string mountpoint = std::filesystem::absolute(path, ec).lexically_normal().string();
    std::ifstream mounts("/proc/self/mountinfo");
    std::string line, db;
    while (std::getline(mounts, line)) {
        std::istringstream fields(line);
        std::string id, parent, dev, root, point;
        fields >> id >> parent >> dev >> root >> point;
        const auto dash = line.find(" - ");
        if (point != mountpoint || dash == std::string::npos) continue;
        std::istringstream rest(line.substr(dash + 3));
        std::string type, source;
        rest >> type >> source;
        if (source.rfind("kcache:", 0) == 0) db = source.substr(7);
    }
    if (db.empty()) {
        std::fprintf(stderr, "kcache-fsd: %s is not a kcache-fsd mount\n", mountpoint.c_str());
        return 1;
    }
    auto daemon_pid = [&]() -> pid_t {
        std::ifstream lock(db + "/daemon.lock");
        std::string word;
        pid_t pid = -1;
        if (lock >> word >> pid && word == "pid") return pid;
        return -1;
    };
    const pid_t daemon = daemon_pid();
    pid_t keeper = -1;
    if (daemon > 0) {
        std::ifstream stat("/proc/" + std::to_string(daemon) + "/stat");
        std::string text;
        std::getline(stat, text);
        const auto close = text.rfind(')');
        std::istringstream rest(close == std::string::npos ? "" : text.substr(close + 1));
        std::string state;
        rest >> state >> keeper;
    }
    if (keeper <= 1 || kill(keeper, SIGHUP) != 0) {
        std::fprintf(stderr, "kcache-fsd: no keeper serves %s (is it run with --no-keeper?)\n",
                     mountpoint.c_str());
        return 1;
    }
    for (int i = 0; i < 600; ++i) {
        usleep(100 * 1000);
        const pid_t now = daemon_pid();
        if (now > 0 && now != daemon) {
            std::printf("kcache-fsd: %s: daemon %d replaced by %d\n", mountpoint.c_str(),
                        static_cast<int>(daemon), static_cast<int>(now));
            return 0;
        }
    }
    std::fprintf(stderr,
                 "kcache-fsd: %s: daemon %d was not replaced within 60 s (see %s/fsd.log)\n",
                 mountpoint.c_str(), static_cast<int>(daemon), db.c_str());
    return 1;
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--upgrade") return upgrade(argv[2]);
    auto options = fsd::parse_options(argc, argv);
    if (!options) {
        std::fprintf(stderr, "kcache-fsd: %s\n", options.error().message.c_str());
        return 2;
    }
    if (!options->help.empty()) {
        std::fputs(options->help.c_str(), stdout);
        return 0;
    }
    const std::string& mountpoint = options->mountpoint;  // absolute (parse_options)
    StartupPipe startup;
    // A daemon the keeper started: it serves the keeper's mount.
    if (const auto inherited = fsd::keeper::inherited()) {
        startup.report_to(inherited->ready_fd, !options->foreground);
        return serve(*options, mountpoint, startup, inherited);
    }
    // Restarted by systemd with the files of a keeper that died (fd_store.hpp): its mount
    // is live and nobody serves it yet, so the mountpoint is not looked at (a stat would
    // wait for a daemon); the files are checked instead.
    const auto adopted = fsd::fd_store::adopt(mountpoint, options->db, options->read_only);
    if (!adopted) startup.fail_startup(adopted.error().message);
    if (*adopted && options->no_keeper) {
        for (int fd : {(*adopted)->fuse, (*adopted)->state, (*adopted)->lock})
            if (fd >= 0) close(fd);
        fsd::fd_store::empty();
        startup.fail_startup(
            "systemd passed a keeper's files (its fd store), but --no-keeper runs no keeper: "
            "emptied the store");
    }
    if (!*adopted) {
        if (auto s = check_mountpoint(mountpoint); !s) startup.fail_startup(s.error().message);
    }
    if (!options->foreground) startup.fork_daemon();
    if (options->no_keeper) return serve(*options, mountpoint, startup, std::nullopt);
    const std::string log_path = options->db + "/fsd.log";
    fsd::keeper::Startup report{[&](const std::string& message) { startup.fail_startup(message); },
                                [&] { startup.ready(log_path); }};
    return fsd::keeper::run(mountpoint, fuse_arguments(*options), argv, report, *adopted);
}
