#include "client.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/core.h>
#include <hiredis/hiredis.h>

#include "tls.hpp"

namespace kcache::remote {

namespace {

// Milliseconds to hand poll(2) until `deadline_ns`, rounded up; 0 once it has passed.
int poll_ms(std::int64_t deadline_ns) {
    const std::int64_t left = deadline_ns - steady_ns();
    if (left <= 0) return 0;
    const std::int64_t ms = (left + 999'999) / 1'000'000;
    return ms > 60'000 ? 60'000 : static_cast<int>(ms);
}

constexpr std::size_t kReadChunk = 64 * 1024;  // bytes read per call

}  // namespace

Connection::Connection(redisContext* context, std::string name)
    : m_context(context), m_name(std::move(name)), m_in(new char[kReadChunk]) {}

Result<std::unique_ptr<Connection>> Connection::open(const Endpoint& endpoint,
                                                     const std::string& password,
                                                     std::int64_t deadline_ns,
                                                     const TlsContext* tls) {
    const std::string name = endpoint.id();
    if (endpoint.tls && tls == nullptr) {
        return core::fail(EINVAL,
                          fmt::format("redis {}: a rediss:// server needs a TLS context", name));
    }
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
    KCACHE_TRY(conn->wait(POLLOUT, deadline_ns, "connect timed out"));
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
    if (so_error != 0) {
        return core::fail(so_error,
                          fmt::format("redis {}: connect: {}", name, std::strerror(so_error)));
    }
    if (endpoint.tls) {
        // The handshake, under the connect's deadline: a server that does not answer it
        // (a plaintext Redis waits for a line that never ends) costs that deadline.
        conn->m_tls = KCACHE_TRY(TlsStream::start(*tls, c->fd, endpoint.host, name));
        for (;;) {
            short want = 0;
            if (KCACHE_TRY(conn->m_tls->handshake(want))) break;
            KCACHE_TRY(conn->wait(want, deadline_ns,
                                  "TLS handshake timed out (no answer: a frozen server, or "
                                  "a port that does not speak TLS)"));
        }
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
    m_tls.reset();  // before the socket closes
    if (m_context) redisFree(m_context);
}

Status Connection::wait(short events, std::int64_t deadline_ns, std::string_view what) {
    for (;;) {
        const int ms = poll_ms(deadline_ns);
        if (ms == 0) return core::fail(ETIMEDOUT, fmt::format("redis {}: {}", m_name, what));
        pollfd p{m_context->fd, events, 0};
        const int n = ::poll(&p, 1, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return core::fail(errno,
                              fmt::format("redis {}: poll: {}", m_name, std::strerror(errno)));
        if (n == 0) continue;  // poll_ms says whether the deadline has passed
        return {};
    }
}

Result<std::size_t> Connection::send_some(const char* data, std::size_t size, short& want) {
    if (m_tls) return m_tls->write(data, size, want);
    for (;;) {
        const ssize_t n = ::send(m_context->fd, data, size, MSG_NOSIGNAL);
        if (n >= 0) return static_cast<std::size_t>(n);
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            want = POLLOUT;
            return std::size_t{0};
        }
        return core::fail(errno, fmt::format("redis {}: write: {}", m_name, std::strerror(errno)));
    }
}

Result<std::size_t> Connection::receive_some(char* buffer, std::size_t size, short& want) {
    if (m_tls) return m_tls->read(buffer, size, want);
    for (;;) {
        const ssize_t n = ::recv(m_context->fd, buffer, size, 0);
        if (n > 0) return static_cast<std::size_t>(n);
        if (n == 0)
            return core::fail(EIO, fmt::format("redis {}: read: connection closed", m_name));
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            want = POLLIN;
            return std::size_t{0};
        }
        return core::fail(errno, fmt::format("redis {}: read: {}", m_name, std::strerror(errno)));
    }
}

Result<std::vector<Reply>> Connection::exec(const std::vector<Command>& commands,
                                            std::int64_t deadline_ns, std::uint64_t* sent,
                                            std::uint64_t* received) {
    redisContext* c = m_context;
    m_out.clear();
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
        char* formatted = nullptr;
        const int len = redisFormatCommandArgv(&formatted, static_cast<int>(argv.size()),
                                               argv.data(), lens.data());
        if (len < 0 || formatted == nullptr)
            return core::fail(ENOMEM, fmt::format("redis {}: cannot queue a command", m_name));
        m_out.append(formatted, static_cast<std::size_t>(len));
        redisFreeCommand(formatted);
    }
    std::vector<Reply> replies;
    replies.reserve(commands.size());
    std::size_t written = 0;
    // Reads while writing: a long pipeline's early replies must not fill the socket
    // buffers while we still write. Each turn moves what it can without waiting, and
    // waits (poll) only when neither way moved a byte.
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
        if (steady_ns() >= deadline_ns) {
            return core::fail(ETIMEDOUT,
                              fmt::format("redis {}: no reply within the deadline", m_name));
        }
        bool moved = false;
        short events = 0;
        if (written < m_out.size()) {
            short want = 0;
            const std::size_t n =
                KCACHE_TRY(send_some(m_out.data() + written, m_out.size() - written, want));
            written += n;
            moved = n > 0;
            events |= want;
        }
        short want = 0;
        const std::size_t n = KCACHE_TRY(receive_some(m_in.get(), kReadChunk, want));
        if (n > 0) {
            if (redisReaderFeed(c->reader, m_in.get(), n) != REDIS_OK)
                return core::fail(EPROTO, fmt::format("redis {}: bad reply", m_name));
            moved = true;
        }
        events |= want;
        if (moved) continue;
        KCACHE_TRY(wait(events, deadline_ns, "no reply within the deadline"));
    }
    m_out.clear();
    return replies;
}

}  // namespace kcache::remote
