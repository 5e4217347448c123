#include "tls_fixture.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <random>
#include <sstream>

#include <catch2/catch.hpp>

#include "run_program.hpp"
#include "skip.hpp"

namespace kcache::test {

namespace {

std::string find_openssl() {
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path ? path : "/usr/bin:/usr/sbin");
    for (std::string dir; std::getline(dirs, dir, ':');) {
        const std::string candidate = dir + "/openssl";
        if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return {};
}

// Our own configuration, so that the system's openssl.cnf changes nothing.
constexpr const char* kConfig = R"([req]
distinguished_name = dn
prompt = no
[dn]
CN = kcache test
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:FALSE
subjectAltName = DNS:localhost,IP:127.0.0.1
extendedKeyUsage = serverAuth,clientAuth
[other-host]
basicConstraints = CA:FALSE
subjectAltName = DNS:other.invalid
extendedKeyUsage = serverAuth,clientAuth
[client]
basicConstraints = CA:FALSE
extendedKeyUsage = clientAuth
)";

}  // namespace

TlsCerts::TlsCerts() {
    const std::string openssl = find_openssl();
    if (openssl.empty()) skip("openssl is not installed (scripts/setup.sh installs it)");
    const std::string cnf = path("openssl.cnf");
    write_file(cnf, kConfig);
    auto run = [&](std::vector<std::string> args) {
        args.insert(args.begin(), openssl);
        const ProgramResult r = run_program(args, {}, {"OPENSSL_CONF"}, 60);
        INFO("openssl " << args[1] << ": " << r.out << r.err);
        REQUIRE(r.exit_code == 0);
    };
    const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt",
                                         "ec_paramgen_curve:prime256v1", "-nodes"};
    for (const std::string ca : {"ca", "other-ca"}) {
        std::vector<std::string> args = {"req", "-x509", "-new"};
        args.insert(args.end(), ec.begin(), ec.end());
        args.insert(args.end(),
                    {"-keyout", path(ca + ".key"), "-out", path(ca + ".pem"), "-days", "2",
                     "-config", cnf, "-extensions", "ca", "-subj", "/CN=kcache test " + ca});
        run(args);
    }
    for (const std::string leaf : {"server", "other-host", "client"}) {
        std::vector<std::string> req = {"req", "-new"};
        req.insert(req.end(), ec.begin(), ec.end());
        req.insert(req.end(),
                   {"-keyout", path(leaf + ".key"), "-out", path(leaf + ".csr"), "-config", cnf,
                    "-subj", leaf == "server" ? "/CN=localhost" : "/CN=" + leaf});
        run(req);
        run({"x509", "-req", "-in", path(leaf + ".csr"), "-CA", ca(), "-CAkey", path("ca.key"),
             "-CAcreateserial", "-out", path(leaf + ".pem"), "-days", "2", "-extfile", cnf,
             "-extensions", leaf});
    }
}

remote::TlsOptions TlsCerts::options(bool client_cert) const {
    remote::TlsOptions o;
    o.ca_file = ca();
    if (client_cert) {
        o.cert_file = path("client.pem");
        o.key_file = path("client.key");
    }
    return o;
}

std::uint16_t free_port() {
    std::mt19937 gen(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(std::time(nullptr)));
    for (int tries = 0; tries < 1000; ++tries) {
        const auto port = static_cast<std::uint16_t>(20000 + gen() % 25000);
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) continue;
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        ::close(fd);
        if (ok) return port;
    }
    FAIL("no free TCP port on 127.0.0.1");
    return 0;
}

std::vector<std::string> tls_server_args(const TlsCerts& certs, std::uint16_t port,
                                         const std::string& cert, bool auth_clients) {
    return {"--bind",
            "127.0.0.1",
            "--tls-port",
            std::to_string(port),
            "--tls-cert-file",
            certs.path(cert + ".pem"),
            "--tls-key-file",
            certs.path(cert + ".key"),
            "--tls-ca-cert-file",
            certs.ca(),
            "--tls-auth-clients",
            auth_clients ? "yes" : "no"};
}

}  // namespace kcache::test
