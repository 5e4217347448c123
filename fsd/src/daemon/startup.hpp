// kcache-fsd's start-up before the db is served (main.cpp): the report to the process
// that waits for "ready", the mountpoint's checks, and the db's one-daemon lock.
#pragma once

#include <string>

#include "kcache/core/error.hpp"

namespace kcache::fsd {

// Reports start-up success or failure to the parent that waits for it.
class StartupPipe {
  public:
    // Forks; returns only in the child. The parent exits with the child's verdict.
    void fork_daemon();
    // A daemon started by a keeper reports to it through `fd`; it detaches (its stderr
    // to the log) only when the keeper did (not -f).
    void report_to(int fd, bool detach) {
        m_fd = fd;
        m_detach = detach;
    }
    // A file the keeper keeps, sent with "ready" (the report is a unix socket then).
    void pass_fd(int fd) { m_pass_fd = fd; }
    // Reports `message` (or prints it, with no one waiting) and exits 1.
    [[noreturn]] void fail_startup(const std::string& message);
    // Detaches from the terminal; the daemon's messages go to `log_path`.
    void ready(const std::string& log_path);

  private:
    void send_ready();

    int m_fd = -1;
    bool m_detach = true;
    int m_pass_fd = -1;
};

// The mountpoint is an empty directory; a dead mount there (its daemon and keeper died)
// is unmounted lazily first.
core::Status check_mountpoint(const std::string& path);

// One daemon per db: a second one would double-count statistics and race evictions.
// Under a keeper the lock is the keeper's too: the first daemon hands its file to the
// keeper (StartupPipe::pass_fd), which passes it to every successor (`inherited`, the same
// open file, so locked already): a daemon that is still dying does not keep the next one
// out. Returns the locked file.
core::Result<int> lock_db_for_daemon(const std::string& db, const std::string& mountpoint,
                                     int inherited);

}  // namespace kcache::fsd
