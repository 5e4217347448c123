// The shared tier's command-line options, one definition for every program that talks
// to Redis (`kcache remote ...` and `kcache-fsd --remote ...`), so that a server is
// named, authenticated and timed the same way everywhere (docs/operations.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "kcache/remote/remote.hpp"

namespace kcache::remote {

// What the options say, before the environment's defaults are applied.
struct Settings {
    std::vector<std::string> urls;  // --remote (repeatable); empty: $KCACHE_REMOTE
    std::string ns;  // --remote-namespace; empty: $KCACHE_REMOTE_NAMESPACE, else "default"
    std::string password_env;                         // --remote-password-env
    std::string password_file;                        // --remote-password-file
    std::int64_t timeout_ns = 2'000'000'000;          // --remote-timeout
    std::int64_t connect_timeout_ns = 1'000'000'000;  // --remote-connect-timeout
    bool read_only = false;                           // --remote-read-only
    // rediss://: empty: $KCACHE_REMOTE_TLS_CA / _CERT / _KEY (Options::tls)
    std::string tls_ca;    // --remote-tls-ca
    std::string tls_cert;  // --remote-tls-cert
    std::string tls_key;   // --remote-tls-key
    // Signed entries (kcache/remote/trust.hpp). --remote-signing-key: sign every entry
    // pushed with this private key.
    std::string signing_key;
    // --remote-trusted-keys: accept only entries signed by its keys; empty:
    // kDefaultTrustFile when it exists, else none (unverified); "none": none.
    std::string trusted_keys;
};

// "250ms", or a core duration ("2s"; a bare number is seconds); positive, at most a day.
Result<std::int64_t> parse_deadline(std::string_view text);

// Adds --remote, --remote-namespace, --remote-password-env, --remote-password-file,
// --remote-timeout, --remote-connect-timeout, --remote-read-only, --remote-tls-ca /
// -cert / -key, --remote-signing-key and --remote-trusted-keys to `app`, writing into
// `settings` (which must outlive the parse).
void add_options(CLI::App& app, Settings& settings);

// The servers the settings name: --remote, else $KCACHE_REMOTE (spaces or commas).
std::vector<std::string> configured_urls(const Settings& settings);

// The Options a Remote is made with: URLs parsed, the password loaded (never logged),
// the namespace defaulted, TLS files named (read when the Remote is made), everything
// validated. EINVAL with a message naming the option for no server, both password
// options, a bad URL, namespace or password source, TLS files without a rediss:// URL.
Result<Options> resolve(const Settings& settings);

}  // namespace kcache::remote
