// Who is calling: FUSE reports the calling *thread*; statistics are per process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace kcache::fsd {

struct Caller {
    std::uint32_t pid = 0;  // the process (thread group) id
    std::string name;       // its command name
};

// The process (thread group) of thread `tid`, from /proc; the thread itself if /proc
// cannot tell (the thread may be gone already). Cached per thread id and validated by
// the thread's start time: one read of /proc/<tid>/stat per call. Thread-safe.
std::uint32_t process_of(pid_t tid);
// The same with the process's name.
Caller caller_of(pid_t tid);
// True when process `a` is process `b`, or one is an ancestor of the other (from
// /proc, while both are alive): the processes of one compile (Inductor's workers, the
// g++ it runs on the .cpp it wrote) reading what another of them wrote load nothing
// from the cache. Processes that are gone, or unrelated, are not of one compile.
bool same_compile(std::uint32_t a, std::uint32_t b);
// The file mode creation mask of thread `tid` (the Umask line of /proc/<tid>/status,
// Linux 4.7+); `fallback` when /proc cannot tell (the thread is gone).
mode_t umask_of(pid_t tid, mode_t fallback = 022);
// True while thread `tid` is exiting because a signal killed it (SIGKILL, an unhandled
// SIGTERM ...): the kernel sets PF_EXITING and the exit code before it closes the
// task's files, so a FLUSH sent by that closing can tell a kill from a normal exit.
bool killed_by_signal(pid_t tid);

}  // namespace kcache::fsd
