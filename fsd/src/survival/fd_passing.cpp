#include "fd_passing.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

namespace kcache::fsd {

ssize_t send_with_fds(int sock, std::string_view data, const std::vector<int>& fds,
                      const sockaddr* to, socklen_t to_length) {
    iovec iov{const_cast<char*>(data.data()), data.size()};
    msghdr msg{};
    msg.msg_name = const_cast<sockaddr*>(to);
    msg.msg_namelen = to ? to_length : 0;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    const std::size_t bytes = sizeof(int) * fds.size();
    std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(bytes));  // aligned by new
    if (!fds.empty()) {
        msg.msg_control = control.data();
        msg.msg_controllen = control.size();
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(bytes);
        std::memcpy(CMSG_DATA(c), fds.data(), bytes);
    }
    return ::sendmsg(sock, &msg, MSG_NOSIGNAL);
}

ssize_t receive_with_fds(int sock, char* buf, std::size_t size, std::vector<int>& fds,
                         std::size_t max_fds) {
    iovec iov{buf, size};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * max_fds));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) return n;
    std::size_t taken = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
            int fd = -1;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (taken++ < max_fds)
                fds.push_back(fd);
            else
                ::close(fd);
        }
    }
    return n;
}

}  // namespace kcache::fsd
