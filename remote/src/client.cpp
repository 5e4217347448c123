#include "client.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/core.h>
#include <hiredis/hiredis.h>

namespace kcache::remote {

namespace {

// Milliseconds to hand poll(2) until `deadline_ns`, rounded up; 0 once it has passed.
int poll_ms(std::int64_t deadline_ns) {
    const std::int64_t left = deadline_ns - steady_ns();
    if (left <= 0) return 0;
    const std::int64_t ms = (left + 999'999) / 1'000'000;
    return ms > 60'000 ? 60'000 : static_cast<int>(ms);
}

core::Error io_error(const std::string& name, redisContext* c, std::string_view what) {
    const int code = (c->err == REDIS_ERR_IO && errno) ? errno : EIO;
    return {code == EAGAIN ? EIO : code,
            fmt::format("redis {}: {}: {}", name, what,
                        c->errstr[0] ? c->errstr : "connection closed")};
}

}  // namespace

Result<std::unique_ptr<Connection>> Connection::open(const Endpoint& endpoint,
                                                     const std::string& password,
                                                     std::int64_t deadline_ns) {
    const std::string name = endpoint.id();
    // Name resolution in redisConnectNonBlock is getaddrinfo(3) and may block: name
    // servers by address (or a name /etc/hosts answers) where that matters.
    redisContext* c = endpoint.unix_socket
                          ? redisConnectUnixNonBlock(endpoint.path.c_str())
                          : redisConnectNonBlock(endpoint.host.c_str(), endpoint.port);
    if (c == nullptr)
        return core::fail(ENOMEM, fmt::format("redis {}: cannot allocate a context", name));
    if (c->err) {
        core::Error e{c->err == REDIS_ERR_IO && errno ? errno : ECONNREFUSED,
                      fmt::format("redis {}: connect: {}", name, c->errstr)};
        redisFree(c);
        return tl::unexpected(std::move(e));
    }
    limit_replies(c->reader);
    std::unique_ptr<Connection> conn(new Connection(c, name));
    // The connect is in progress: wait for the socket to become writable, then ask it
    // how the connect ended.
    for (;;) {
        pollfd p{c->fd, POLLOUT, 0};
        const int ms = poll_ms(deadline_ns);
        if (ms == 0) return core::fail(ETIMEDOUT, fmt::format("redis {}: connect timed out", name));
        const int n = ::poll(&p, 1, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return core::fail(errno, fmt::format("redis {}: poll: {}", name, std::strerror(errno)));
        if (n == 0) return core::fail(ETIMEDOUT, fmt::format("redis {}: connect timed out", name));
        int so_error = 0;
        socklen_t len = sizeof so_error;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
        if (so_error != 0) {
            return core::fail(so_error,
                              fmt::format("redis {}: connect: {}", name, std::strerror(so_error)));
        }
        break;
    }
    std::vector<Command> hello;
    if (!password.empty()) {
        hello.push_back(endpoint.user.empty() ? Command{"AUTH", password}
                                              : Command{"AUTH", endpoint.user, password});
    }
    if (endpoint.db != 0) hello.push_back({"SELECT", std::to_string(endpoint.db)});
    if (!hello.empty()) {
        auto replies = KCACHE_TRY(conn->exec(hello, deadline_ns));
        for (std::size_t i = 0; i < replies.size(); ++i) {
            const Reply& r = replies[i];
            if (r.is_ok()) continue;
            // The reply to AUTH never echoes the password; it is still not quoted here.
            const bool auth = !password.empty() && i == 0;
            return core::fail(
                auth ? EACCES : EINVAL,
                fmt::format("redis {}: {} refused: {}", name, auth ? "AUTH" : "SELECT",
                            r.is_error() ? r.str : "unexpected reply"));
        }
    }
    return conn;
}

Connection::~Connection() {
    if (m_context) redisFree(m_context);
}

Result<std::vector<Reply>> Connection::exec(const std::vector<Command>& commands,
                                            std::int64_t deadline_ns, std::uint64_t* sent,
                                            std::uint64_t* received) {
    redisContext* c = m_context;
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const Command& cmd : commands) {
        argv.clear();
        lens.clear();
        for (const std::string& arg : cmd) {
            argv.push_back(arg.data());
            lens.push_back(arg.size());
            if (sent) *sent += arg.size();
        }
        if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
            REDIS_OK) {
            return core::fail(ENOMEM, fmt::format("redis {}: cannot queue a command", m_name));
        }
    }
    std::vector<Reply> replies;
    replies.reserve(commands.size());
    int written = 0;
    // Reads while writing: a long pipeline's early replies must not fill the socket
    // buffers while we still write.
    while (replies.size() < commands.size()) {
        void* raw = nullptr;
        if (redisGetReplyFromReader(c, &raw) != REDIS_OK) {
            return core::fail(EPROTO, fmt::format("redis {}: bad reply: {}", m_name, c->errstr));
        }
        if (raw != nullptr) {
            replies.push_back(reply_of(static_cast<redisReply*>(raw), received));
            freeReplyObject(raw);
            continue;
        }
        const int ms = poll_ms(deadline_ns);
        if (ms == 0)
            return core::fail(ETIMEDOUT,
                              fmt::format("redis {}: no reply within the deadline", m_name));
        pollfd p{c->fd, static_cast<short>(POLLIN | (written ? 0 : POLLOUT)), 0};
        const int n = ::poll(&p, 1, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return core::fail(errno,
                              fmt::format("redis {}: poll: {}", m_name, std::strerror(errno)));
        if (n == 0)
            return core::fail(ETIMEDOUT,
                              fmt::format("redis {}: no reply within the deadline", m_name));
        if (!written && (p.revents & POLLOUT)) {
            errno = 0;
            if (redisBufferWrite(c, &written) != REDIS_OK)
                return tl::unexpected(io_error(m_name, c, "write"));
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) {
            errno = 0;
            if (redisBufferRead(c) != REDIS_OK) return tl::unexpected(io_error(m_name, c, "read"));
        }
    }
    return replies;
}

}  // namespace kcache::remote
