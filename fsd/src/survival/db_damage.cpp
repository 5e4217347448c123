#include "db_damage.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "filesystem.hpp"
#include "kcache/core/integrity.hpp"
#include "kcache/core/store.hpp"

namespace kcache::fsd {
using core::fail;
using core::Status;

namespace {

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

}  // namespace

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

void serving_started() {
    g_starting = 0;
}

std::optional<std::string> db_damage(const std::string& db, bool full, bool read_only) {
    std::error_code ec;
    if (!std::filesystem::exists(db + "/data.mdb", ec)) return std::nullopt;
    // Every kcache process that opened the db made its kcache.lock: without one it is no
    // kcache db (a data.mdb of something else), which is refused, never moved.
    if (!std::filesystem::exists(db + "/kcache.lock", ec)) return std::nullopt;
    const std::string marker = db + "/" + kCorruptMarker;
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
}  // namespace kcache::fsd
