// TLS to Redis (`rediss://`, `rediss-cluster://`) over OpenSSL 3, internal to kcache_remote.
//
// hiredis 0.14 has no TLS, so the connection (client.cpp) owns its socket's bytes: a
// TlsStream runs the handshake and moves bytes over a non-blocking socket that the
// caller polls (each call says what it waits for), and hiredis only formats commands
// and parses replies (redisReader, as reply.cpp limits it). Nothing here blocks or
// keeps time: the caller bounds every step by its deadline.
//
// What is verified: the server's certificate chain against the CA file
// (TlsOptions::ca_file; the system's store when empty) and its name against the host
// the URL names (a DNS name against the certificate's DNS names, an IP address against
// its IP addresses). Any failure is an error naming its cause; there is no fallback to
// plaintext and no way to turn verification off.
#pragma once

#include <poll.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kcache/remote/remote.hpp"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace kcache::remote {

// The client side's configuration, shared by every connection of a Remote (OpenSSL's
// SSL_CTX is safe to share across threads once set up; it is never changed after).
class TlsContext {
  public:
    // Loads the CA file (or the system's store), and the client certificate and key
    // when given (checked to match). EINVAL naming the option and OpenSSL's reason for
    // a file that cannot be read or is not PEM of the right kind.
    static Result<std::shared_ptr<const TlsContext>> create(const TlsOptions& options);
    ~TlsContext();
    TlsContext(const TlsContext&) = delete;
    TlsContext& operator=(const TlsContext&) = delete;
    SSL_CTX* get() const { return m_ctx; }

  private:
    explicit TlsContext(SSL_CTX* ctx) : m_ctx(ctx) {}
    SSL_CTX* m_ctx;
};

// One TLS session over a connected non-blocking socket (which the caller owns and
// closes after this is gone). Not thread-safe: one thread at a time, as Connection.
// Every call returns the bytes moved, or 0 with `want` set to POLLIN or POLLOUT: the
// call made no progress until the socket is ready for that; or an error: EPROTO for a
// handshake that fails (a certificate refused, not TLS at the other end, a protocol
// alert), EIO for a session that fails or closes afterwards. Messages start with
// "redis <name>: TLS".
class TlsStream {
  public:
    // `host`: the name (or IP address) the server's certificate must hold; also sent
    // as SNI when it is a name.
    static Result<std::unique_ptr<TlsStream>> start(const TlsContext& context, int fd,
                                                    const std::string& host, std::string name);
    ~TlsStream();
    TlsStream(const TlsStream&) = delete;
    TlsStream& operator=(const TlsStream&) = delete;

    // One step of the handshake: true once it is done, false with `want` set.
    Result<bool> handshake(short& want);
    Result<std::size_t> read(char* buffer, std::size_t size, short& want);
    Result<std::size_t> write(const char* data, std::size_t size, short& want);

  private:
    TlsStream(SSL* ssl, std::string name) : m_ssl(ssl), m_name(std::move(name)) {}
    // The error of a call that failed with `ret`, named `what`: the certificate's fault
    // when verification failed, else OpenSSL's reasons (with a hint for common faults).
    core::Error failure(int ret, const char* what);
    SSL* m_ssl;
    std::string m_name;
    bool m_handshaken = false;
};

}  // namespace kcache::remote
