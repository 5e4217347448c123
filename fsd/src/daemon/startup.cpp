#include "startup.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "fd_passing.hpp"
#include "log.hpp"

namespace kcache::fsd {
using core::fail;
using core::Status;

void StartupPipe::fork_daemon() {
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

void StartupPipe::fail_startup(const std::string& message) {
    const std::string line = "kcache-fsd: " + message + "\n";
    if (m_fd >= 0)
        (void)!::write(m_fd, line.data(), line.size());
    else
        std::fputs(line.c_str(), stderr);
    std::exit(1);
}

void StartupPipe::ready(const std::string& log_path) {
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

void StartupPipe::send_ready() {
    (void)send_with_fds(m_fd, "ready", {m_pass_fd});
}

namespace {

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

}  // namespace

Status check_mountpoint(const std::string& path) {
    struct stat st {};
    // ENOTCONN, or ECONNABORTED where the connection was aborted (fusectl).
    if (::stat(path.c_str(), &st) != 0 && (errno == ENOTCONN || errno == ECONNABORTED)) {
        // A mount whose daemon and keeper died: recovered without a person (issue 20).
        KCACHE_TRY(unmount_dead(path));
        log::warning(
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

core::Result<int> lock_db_for_daemon(const std::string& db, const std::string& mountpoint,
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

}  // namespace kcache::fsd
