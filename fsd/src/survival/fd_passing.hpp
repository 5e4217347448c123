// Open files passed between processes over a Unix socket (SCM_RIGHTS): the keeper's
// start-up report from its daemon (startup.cpp, keeper.cpp) and systemd's fd store
// (fd_store.cpp). One way to build and read the control message, so that its size,
// alignment and close-on-exec are right everywhere.
#pragma once

#include <sys/socket.h>

#include <string_view>
#include <vector>

namespace kcache::fsd {

// Sends `data` with `fds` attached on `sock` (to `to`, for an unconnected datagram
// socket; null for a connected one), MSG_NOSIGNAL. The sender keeps its copies of the
// fds. Returns sendmsg's result: bytes sent, or -1 with errno set.
ssize_t send_with_fds(int sock, std::string_view data, const std::vector<int>& fds,
                      const sockaddr* to = nullptr, socklen_t to_length = 0);

// Receives up to `size` bytes into `buf` from `sock` and appends the fds that came with
// them (close-on-exec; the caller owns them) to `fds`, at most `max_fds` of them (more
// are closed: a control buffer never truncates silently into leaked descriptors).
// Returns recvmsg's result: bytes received, 0 at end, or -1 with errno set (EINTR
// included: the caller decides whether to try again).
ssize_t receive_with_fds(int sock, char* buf, std::size_t size, std::vector<int>& fds,
                         std::size_t max_fds = 1);

}  // namespace kcache::fsd
