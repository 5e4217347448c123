// The mount fixture cannot hang (tests/fsd/mount_fixture.hpp). A FUSE mount whose
// daemon stops answering leaves the processes that wait on it in D state, which no
// signal ends: a test's child killed with a file open there waits, uninterruptibly, for
// the FLUSH of its close; a blocking waitpid for it never returns, nor does anything
// reading the test's output pipe that child holds (CTest). The fixture bounds every
// wait and aborts the connection of its mount as the last resort.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"
#include "processes.hpp"
#include "skip.hpp"

using namespace kcache::test;

namespace {

// The state of process `pid` (R, S, D, Z, ...), or 0 when it is gone.
char process_state(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(in, line)) return 0;
    const auto close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size()) return 0;
    return line[close + 2];
}

// True when every thread of `pid` is stopped (state T): none can still take a request
// off the connection, which a thread blocked in read() of /dev/fuse does for a while
// after SIGSTOP was sent.
bool all_threads_stopped(pid_t pid) {
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
    DIR* dir = ::opendir(tasks.c_str());
    if (dir == nullptr) return false;
    bool stopped = true, any = false;
    while (const dirent* e = ::readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        std::ifstream in(tasks + "/" + e->d_name + "/stat");
        std::string line;
        if (!std::getline(in, line)) continue;
        const auto close = line.rfind(')');
        any = true;
        if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T')
            stopped = false;
    }
    ::closedir(dir);
    return any && stopped;
}

bool gone(pid_t pid) {
    return pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH) || process_state(pid) == 'Z';
}

// What the scenario's process tells the test (MAP_SHARED).
struct Shared {
    std::atomic<int> phase{0};
    std::atomic<unsigned> connection{0};
    std::atomic<pid_t> keeper{-1}, daemon{-1}, holder{-1};
    std::atomic<char> holder_state{0};
    char mnt[1024] = {};
};

}  // namespace

TEST_CASE("fixture: tearing down a mount whose daemon is stopped ends, with the child stuck on it",
          "[reliability][fixture]") {
    require_fuse();
    // Over io_uring the killed holder does not wait in D state for its FLUSH (it ends),
    // while `fusermount3 -u` of the stopped daemon's mount did hang in one run and the
    // forced unmount could not abort it: not understood yet, so not covered there.
    if (io_uring_run())
        skip(
            "over io_uring a stopped daemon leaves no child in D state to test with (see "
            "the comment above this skip)");
    void* mem =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    Shared& shared = *new (mem) Shared();

    // The scenario runs in a process of its own: should its teardown hang, this test
    // still ends it (aborting the connection from here) and fails.
    Child scenario([&] {
        MountedCache cache;
        if (write_all(cache.p("f"), "content") != 0) return 2;
        std::strncpy(shared.mnt, cache.mnt().c_str(), sizeof shared.mnt - 1);
        shared.connection = cache.connection();
        shared.keeper = cache.daemon_pid();
        const auto daemons = children_of(cache.daemon_pid(), false);
        if (daemons.size() != 1) return 3;
        shared.daemon = daemons.front();
        // A child holding a file of the mount open, written to: its close sends FLUSH.
        Child holder([&] {
            Fd fd(::open(cache.p("f").c_str(), O_WRONLY | O_APPEND));
            if (!fd || write_fd(fd.get(), " more") != 0) return 1;
            shared.phase = 1;
            ::pause();
            return 0;
        });
        shared.holder = holder.pid();
        if (!wait_until([&] { return shared.phase.load() == 1; }, 20)) return 4;
        // The daemon stops answering; the holder is killed and, closing its file on the
        // way out, waits for the FLUSH's answer in D state.
        ::kill(shared.daemon, SIGSTOP);
        if (!wait_until([&] { return all_threads_stopped(shared.daemon); }, 20)) return 5;
        ::kill(holder.pid(), SIGKILL);
        wait_until([&] { return process_state(holder.pid()) == 'D'; }, 10);
        shared.holder_state = process_state(holder.pid());
        shared.phase = 2;
        return 0;  // ~holder, then ~cache: the teardown under test
    });
    const bool ended = wait_until([&] { return !scenario.running(); }, 120);
    if (!ended) {  // the fixture hangs: end it from here
        abort_fuse_connection(shared.connection.load(), shared.mnt);
        ::kill(shared.keeper.load(), SIGKILL);
        ::kill(shared.daemon.load(), SIGKILL);
    }
    const ChildResult r = scenario.join(30);
    INFO("mount " << shared.mnt << ", connection " << shared.connection.load() << ", holder "
                  << shared.holder.load() << " in state " << shared.holder_state.load());
    CHECK(ended);
    CHECK(r.exit_code == 0);
    CHECK(shared.phase.load() == 2);
    CHECK(shared.holder_state.load() == 'D');  // the scenario did make a stuck process
    // Nothing is left: no process of the scenario, no mount.
    CHECK(wait_until([&] { return gone(shared.holder.load()); }, 10));
    CHECK(wait_until([&] { return gone(shared.daemon.load()); }, 10));
    CHECK(wait_until([&] { return gone(shared.keeper.load()); }, 10));
    CHECK_FALSE(in_mountinfo(shared.mnt));
    shared.~Shared();
    ::munmap(mem, sizeof(Shared));
}
