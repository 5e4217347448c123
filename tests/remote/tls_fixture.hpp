// Fixtures of the TLS tests (rediss://): a CA and certificates made at test time with
// the `openssl` CLI into a temp dir, and the redis-server arguments that serve TLS with
// them. Skips the test (exit 77) with a message without `openssl`, or when redis-server
// was built without TLS (its log says so).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kcache/remote/remote.hpp"
#include "temp_dir.hpp"

namespace kcache::test {

class TlsCerts {
  public:
    TlsCerts();  // makes every file below (a few EC keys: fast)
    std::string path(const std::string& name) const { return (m_dir / name).string(); }
    // ca.pem: the CA that signed every certificate below; other-ca.pem: one that
    // signed none of them. server.pem/.key: for DNS:localhost and IP:127.0.0.1;
    // other-host.pem/.key: for DNS:other.invalid only; client.pem/.key: a client's.
    std::string ca() const { return path("ca.pem"); }
    std::string other_ca() const { return path("other-ca.pem"); }
    // The client side's files: the CA, and the client certificate when `client_cert`.
    remote::TlsOptions options(bool client_cert = false) const;

  private:
    TempDir m_dir;
};

// A TCP port of 127.0.0.1 free now (a hint: another program may take it later).
std::uint16_t free_port();

// redis-server arguments serving TLS on 127.0.0.1:`port` (besides the fixture's Unix
// socket, which stays plaintext for the test's own checks) with `cert` ("server" or
// "other-host"), asking clients for a certificate when `auth_clients`.
std::vector<std::string> tls_server_args(const TlsCerts& certs, std::uint16_t port,
                                         const std::string& cert = "server",
                                         bool auth_clients = false);

}  // namespace kcache::test
