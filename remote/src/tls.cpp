// TLS to Redis over OpenSSL 3 (tls.hpp).
#include "tls.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include <fmt/core.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

namespace kcache::remote {

namespace {

// OpenSSL's reasons queued on this thread, oldest first, and the queue emptied: "wrong
// version number", "tlsv13 alert certificate required"... or `fallback`.
std::string drain_errors(std::string_view fallback) {
    std::string out;
    while (const unsigned long e = ERR_get_error()) {
        const char* reason = ERR_reason_error_string(e);
        if (!out.empty()) out += "; ";
        out += reason ? reason : fmt::format("error {:#x}", e);
    }
    return out.empty() ? std::string(fallback) : out;
}

// A key file protected by a passphrase would make OpenSSL ask on the terminal: refuse.
int no_passphrase(char*, int, int, void*) {
    return 0;
}

// SNI: the server's name in the ClientHello (OpenSSL's macro casts in C style).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
bool set_server_name(SSL* ssl, const char* host) {
    return SSL_set_tlsext_host_name(ssl, host) == 1;
}
#pragma GCC diagnostic pop

bool is_ip_address(const std::string& host) {
    unsigned char buf[sizeof(in6_addr)];
    return inet_pton(AF_INET, host.c_str(), buf) == 1 ||
           inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// What to say after OpenSSL's reason, for the faults met most.
std::string hint(std::string_view reason) {
    if (reason.find("wrong version number") != std::string_view::npos ||
        reason.find("packet length too long") != std::string_view::npos ||
        reason.find("record layer failure") != std::string_view::npos) {
        return " (does this port speak TLS? a plaintext Redis behind a rediss:// URL)";
    }
    if (reason.find("certificate required") != std::string_view::npos ||
        reason.find("handshake failure") != std::string_view::npos) {
        return " (the server may want a client certificate: --remote-tls-cert and "
               "--remote-tls-key)";
    }
    if (reason.find("unknown ca") != std::string_view::npos ||
        reason.find("bad certificate") != std::string_view::npos) {
        return " (the server refused our client certificate)";
    }
    return {};
}

}  // namespace

Result<std::shared_ptr<const TlsContext>> TlsContext::create(const TlsOptions& options) {
    ERR_clear_error();
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == nullptr)
        return core::fail(ENOMEM, fmt::format("TLS: {}", drain_errors("cannot make a context")));
    std::shared_ptr<const TlsContext> out(new TlsContext(ctx));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    // Non-blocking writes: take what fits, and accept the rest of the same bytes from
    // another address when a write is tried again (our buffer may have moved).
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    if (!options.ca_file.empty()) {
        if (SSL_CTX_load_verify_locations(ctx, options.ca_file.c_str(), nullptr) != 1) {
            return core::fail(EINVAL, fmt::format("--remote-tls-ca {}: cannot load CA "
                                                  "certificates (PEM): {}",
                                                  options.ca_file, drain_errors("no certificate")));
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        return core::fail(EINVAL, fmt::format("TLS: cannot load the system's CA certificates: {}",
                                              drain_errors("unknown error")));
    }
    if (!options.cert_file.empty()) {
        if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1) {
            return core::fail(EINVAL,
                              fmt::format("--remote-tls-cert {}: cannot load a certificate "
                                          "(PEM): {}",
                                          options.cert_file, drain_errors("no certificate")));
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, options.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
            return core::fail(EINVAL,
                              fmt::format("--remote-tls-key {}: cannot load a private key (PEM, "
                                          "without a passphrase): {}",
                                          options.key_file, drain_errors("no key")));
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
            return core::fail(
                EINVAL, fmt::format("--remote-tls-key {} is not the key of --remote-tls-cert "
                                    "{}: {}",
                                    options.key_file, options.cert_file, drain_errors("mismatch")));
        }
    }
    return out;
}

TlsContext::~TlsContext() {
    SSL_CTX_free(m_ctx);
}

Result<std::unique_ptr<TlsStream>> TlsStream::start(const TlsContext& context, int fd,
                                                    const std::string& host, std::string name) {
    ERR_clear_error();
    SSL* ssl = SSL_new(context.get());
    if (ssl == nullptr) {
        return core::fail(ENOMEM,
                          fmt::format("redis {}: TLS: {}", name, drain_errors("no session")));
    }
    std::unique_ptr<TlsStream> out(new TlsStream(ssl, std::move(name)));
    bool ok = SSL_set_fd(ssl, fd) == 1;
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (is_ip_address(host)) {
        ok = ok && X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1;
    } else {
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        ok = ok && SSL_set1_host(ssl, host.c_str()) == 1 && set_server_name(ssl, host.c_str());
    }
    if (!ok) {
        return core::fail(EINVAL, fmt::format("redis {}: TLS: cannot expect host '{}': {}",
                                              out->m_name, host, drain_errors("bad name")));
    }
    SSL_set_connect_state(ssl);
    return out;
}

TlsStream::~TlsStream() {
    // No close_notify: the connection is dropped after a failure as often as not, and
    // Redis needs none. The caller closes the socket.
    SSL_free(m_ssl);
}

core::Error TlsStream::failure(int ret, const char* what) {
    const int err = SSL_get_error(m_ssl, ret);
    const int saved_errno = errno;
    if (!m_handshaken) {
        const long verify = SSL_get_verify_result(m_ssl);
        if (verify != X509_V_OK) {
            ERR_clear_error();
            std::string why;
            switch (verify) {
                case X509_V_ERR_HOSTNAME_MISMATCH:
                case X509_V_ERR_IP_ADDRESS_MISMATCH:
                    why = " (it does not name the host of the URL)";
                    break;
                case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
                case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
                case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
                case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
                    why = " (no CA of --remote-tls-ca, or of the system's store, signed it)";
                    break;
                default:
                    break;
            }
            return {EPROTO, fmt::format("redis {}: TLS handshake: the server's certificate is "
                                        "refused: {}{}",
                                        m_name, X509_verify_cert_error_string(verify), why)};
        }
    }
    std::string reason;
    if (err == SSL_ERROR_ZERO_RETURN) {
        reason = "closed by the server";
    } else if (err == SSL_ERROR_SYSCALL) {
        reason = drain_errors(saved_errno ? std::strerror(saved_errno) : "connection closed");
    } else {
        reason = drain_errors(fmt::format("error {}", err));
    }
    const std::string extra = hint(reason);
    return {m_handshaken ? EIO : EPROTO,
            fmt::format("redis {}: TLS {}: {}{}", m_name, what, reason, extra)};
}

Result<bool> TlsStream::handshake(short& want) {
    ERR_clear_error();
    errno = 0;
    const int ret = SSL_do_handshake(m_ssl);
    if (ret == 1) {
        m_handshaken = true;
        return true;
    }
    const int err = SSL_get_error(m_ssl, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        want = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return false;
    }
    return tl::unexpected(failure(ret, "handshake"));
}

Result<std::size_t> TlsStream::read(char* buffer, std::size_t size, short& want) {
    ERR_clear_error();
    errno = 0;
    std::size_t n = 0;
    const int ret = SSL_read_ex(m_ssl, buffer, size, &n);
    if (ret == 1) return n;
    const int err = SSL_get_error(m_ssl, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        want = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return std::size_t{0};
    }
    return tl::unexpected(failure(ret, "read"));
}

Result<std::size_t> TlsStream::write(const char* data, std::size_t size, short& want) {
    ERR_clear_error();
    errno = 0;
    std::size_t n = 0;
    const int ret = SSL_write_ex(m_ssl, data, size, &n);
    if (ret == 1) return n;
    const int err = SSL_get_error(m_ssl, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        want = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return std::size_t{0};
    }
    return tl::unexpected(failure(ret, "write"));
}

}  // namespace kcache::remote
