// kcache-fsd: mounts a kcache db as a directory.
//
// Start-up order matters: an LMDB environment must not cross a fork(), so the
// daemon forks first (unless -f); the child opens the db, mounts, and only then
// tells the waiting parent "ready" (exit 0) or the error (exit 1). Everything that
// can be wrong with the db or the mountpoint is reported before anything is mounted.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "filesystem.hpp"
#include "kcache/core/store.hpp"
#include "log.hpp"
#include "options.hpp"
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
        if (pipe(fds) != 0) return;  // then stay in the foreground
        const pid_t pid = fork();
        if (pid < 0) return;
        if (pid > 0) {
            close(fds[1]);
            std::string message;
            char buf[512];
            for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
                message.append(buf, static_cast<std::size_t>(n));
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
        const int null = ::open("/dev/null", O_RDWR);
        const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (null >= 0) {
            dup2(null, STDIN_FILENO);
            dup2(null, STDOUT_FILENO);
        }
        if (log >= 0) dup2(log, STDERR_FILENO);
        (void)!::write(m_fd, "ready", 5);
        close(m_fd);
        m_fd = -1;
        (void)!chdir("/");
    }

  private:
    int m_fd = -1;
};

Status check_mountpoint(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        if (errno == ENOTCONN) {
            return fail(
                ENOTCONN,
                fmt::format("mountpoint {} is a dead mount: run `fusermount3 -u {}`", path, path));
        }
        return fail(errno, fmt::format("mountpoint {}: {}", path, std::strerror(errno)));
    }
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
Status lock_db_for_daemon(const std::string& db, const std::string& mountpoint) {
    const std::string path = db + "/daemon.lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return fail(errno, fmt::format("db {}: {}: {}", db, path, std::strerror(errno)));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char owner[512] = {};
        (void)!::pread(fd, owner, sizeof owner - 1, 0);
        close(fd);
        return fail(EBUSY, fmt::format("db {} is already served by kcache-fsd ({})", db,
                                       owner[0] ? owner : "unknown process"));
    }
    const std::string owner = fmt::format("pid {} at {}", getpid(), mountpoint);
    (void)!ftruncate(fd, 0);
    (void)!::pwrite(fd, owner.data(), owner.size(), 0);
    return {};  // fd stays open (and locked) for the life of the daemon
}

}  // namespace

int main(int argc, char** argv) {
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
    if (auto s = check_mountpoint(mountpoint); !s) startup.fail_startup(s.error().message);
    if (!options->foreground) startup.fork_daemon();

    kcache::core::OpenOptions open;
    open.path = options->db;
    open.create = !options->read_only;
    open.read_only = options->read_only;
    open.durability = options->durability;
    if (options->entry_depth) open.entry_depth = options->entry_depth;
    auto store = kcache::core::Store::open(open);
    if (!store && store.error().code == EROFS) {
        startup.fail_startup(store.error().message +
                             " (serve it read-only with --read-only or -o ro)");
    }
    if (!store) startup.fail_startup(store.error().message);
    // A read-only daemon changes nothing (no statistics, no eviction): several may
    // serve one db, beside a read-write one, and its filesystem may be read-only.
    if (!options->read_only) {
        if (auto s = lock_db_for_daemon(options->db, mountpoint); !s)
            startup.fail_startup(s.error().message);
        // Limits given on the command line become the db's (the CLI sees the same ones).
        auto configured = (*store)->update([&](kcache::core::WriteTxn& txn) -> Status {
            kcache::core::Config config = txn.config();
            if (options->max_bytes) config.max_bytes = options->max_bytes;
            if (options->max_entries) config.max_entries = options->max_entries;
            if (options->entry_depth) config.entry_depth = options->entry_depth;
            if (options->layout_rules) config.layout_rules = *options->layout_rules;
            return txn.set_config(config);
        });
        if (!configured) startup.fail_startup(configured.error().message);
    }

    fsd::Filesystem filesystem(**store, *options);
    // The shared tier, made after the fork (its threads must not cross it). It connects
    // lazily: an unreachable Redis does not stop start-up, it only costs misses.
    std::unique_ptr<fsd::RemoteTier> remote;
    if (options->remote) {
        auto made = fsd::RemoteTier::create(**store, *options->remote, options->prefetch_job_tag,
                                            options->job_tag);
        if (!made) startup.fail_startup(made.error().message);
        remote = std::move(*made);
        filesystem.attach_remote(remote.get());
    }
    std::vector<std::string> arg_storage{"kcache-fsd", "-o",
                                         "fsname=kcache:" + options->db + ",subtype=kcache"};
    for (const auto& o : options->fuse_options) {
        arg_storage.push_back("-o");
        arg_storage.push_back(o);
    }
    if (options->debug) arg_storage.push_back("-d");
    std::vector<char*> fuse_argv;
    for (auto& a : arg_storage) fuse_argv.push_back(a.data());
    fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());
    fuse_session* session = fuse_session_new(&args, &fsd::Filesystem::operations(),
                                             sizeof(fuse_lowlevel_ops), &filesystem);
    if (!session) startup.fail_startup("invalid FUSE options (see above)");
    if (fuse_set_signal_handlers(session) != 0)
        startup.fail_startup("cannot install signal handlers");
    if (fuse_session_mount(session, mountpoint.c_str()) != 0) {
        startup.fail_startup(fmt::format(
            "cannot mount {} (is /dev/fuse usable and fusermount3 installed?)", mountpoint));
    }
    // --io-uring: the rings are set up when the kernel's INIT comes (uring_transport.hpp);
    // /dev/fuse serves until then, and alone where the kernel does not offer them.
    std::unique_ptr<fsd::UringTransport> uring;
    if (options->io_uring) uring = fsd::UringTransport::install(session);
    if (remote) remote->start();
    filesystem.start(session);
    startup.ready(options->db + "/fsd.log");
    fsd::log::info("serving {} at {}{}", options->db, mountpoint,
                   options->read_only ? " read-only" : "");
    if (options->remote) {
        std::string servers;
        for (const auto& e : options->remote->servers)
            servers += (servers.empty() ? "" : ", ") + e.id();
        fsd::log::info("shared tier: {} (namespace {}{})", servers, options->remote->ns,
                       options->remote->read_only ? ", read-only" : "");
    }

    fuse_loop_config* loop = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(loop, 0);
    fuse_loop_cfg_set_max_threads(loop, 16);
    const int rc = fuse_session_loop_mt(session, loop);
    fuse_loop_cfg_destroy(loop);

    if (uring) uring->stop();    // no handler runs after this; later replies are refused
    if (remote) remote->stop();  // waiting lookups answered, counts recorded
    filesystem.stop();           // statistics flushed, db synced; no notification after this
    uring.reset();               // no reply can come any more
    fuse_session_unmount(session);
    fuse_remove_signal_handlers(session);
    fuse_session_destroy(session);
    fuse_opt_free_args(&args);
    // A loop ended by SIGTERM/SIGINT/SIGHUP returns the signal: a clean stop too.
    const bool clean = rc == 0 || rc == SIGTERM || rc == SIGINT || rc == SIGHUP;
    if (clean)
        fsd::log::info("unmounted {}", mountpoint);
    else
        fsd::log::error("the FUSE loop failed ({}); unmounted {}", rc, mountpoint);
    return clean ? 0 : 1;
}
