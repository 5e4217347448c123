#include "kcache/remote/settings.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <sstream>

#include <fmt/core.h>

#include "kcache/core/units.hpp"

namespace kcache::remote {

Result<std::int64_t> parse_deadline(std::string_view text) {
    constexpr std::int64_t kMaxNs = std::int64_t{86'400} * 1'000'000'000;
    auto invalid = [&] {
        return core::fail(EINVAL, fmt::format("invalid deadline '{}' (e.g. 250ms, 2s)", text));
    };
    if (text.size() > 2 && text.ends_with("ms")) {
        std::int64_t ms = 0;
        const std::string_view digits = text.substr(0, text.size() - 2);
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), ms);
        if (ec != std::errc() || end != digits.data() + digits.size() || ms <= 0 ||
            ms > kMaxNs / 1'000'000) {
            return invalid();
        }
        return ms * 1'000'000;
    }
    auto ns = core::parse_duration(text);
    if (!ns || *ns <= 0 || *ns > kMaxNs) return invalid();
    return *ns;
}

namespace {

// CLI11 hands the text to this transform, which leaves the nanoseconds for the option.
CLI::Validator deadline_transform() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            auto ns = parse_deadline(text);
            if (!ns) return ns.error().message;
            text = std::to_string(*ns);
            return {};
        },
        "", "deadline");
}

}  // namespace

void add_options(CLI::App& app, Settings& s) {
    app.add_option("--remote", s.urls,
                   "redis://[user@]host:port[/db] or unix:/path[?db=N&user=U]; repeat to shard "
                   "over several; or one Redis Cluster: "
                   "redis-cluster://[user@]host:port[,host:port...]; rediss:// and "
                   "rediss-cluster:// for TLS (default: $KCACHE_REMOTE)")
        ->type_name("URL");
    app.add_option("--remote-namespace", s.ns,
                   "keys live under kc2:NS: (default: $KCACHE_REMOTE_NAMESPACE, else 'default')")
        ->type_name("NS");
    app.add_option("--remote-password-env", s.password_env,
                   "read the password from this environment variable (default: "
                   "KCACHE_REMOTE_PASSWORD when set)")
        ->type_name("VAR");
    app.add_option("--remote-password-file", s.password_file, "read the password from this file")
        ->type_name("FILE");
    app.add_option("--remote-timeout", s.timeout_ns,
                   "deadline of each remote operation: 250ms, 2s ... (default 2s)")
        ->transform(deadline_transform())
        ->type_name("DURATION");
    app.add_option("--remote-connect-timeout", s.connect_timeout_ns,
                   "deadline of a connect (default 1s)")
        ->transform(deadline_transform())
        ->type_name("DURATION");
    app.add_flag("--remote-read-only", s.read_only, "never write to the remote");
    app.add_option("--remote-tls-ca", s.tls_ca,
                   "rediss://: the CA certificates (PEM) the servers' certificates must chain "
                   "to (default: $KCACHE_REMOTE_TLS_CA, else the system's store)")
        ->type_name("FILE");
    app.add_option("--remote-tls-cert", s.tls_cert,
                   "rediss://: a client certificate (PEM) for servers that ask for one "
                   "(tls-auth-clients); with --remote-tls-key (default: $KCACHE_REMOTE_TLS_CERT)")
        ->type_name("FILE");
    app.add_option("--remote-tls-key", s.tls_key,
                   "rediss://: the client certificate's private key (PEM, no passphrase; "
                   "default: $KCACHE_REMOTE_TLS_KEY)")
        ->type_name("FILE");
    app.add_option("--remote-signing-key", s.signing_key,
                   "sign every entry pushed with this private key (kcache keys generate)")
        ->type_name("FILE");
    app.add_option("--remote-trusted-keys", s.trusted_keys,
                   "accept only entries signed by a key this trust file trusts (default: " +
                       std::string(kDefaultTrustFile) +
                       " when it exists; 'none': accept unsigned entries, unverified)")
        ->type_name("FILE");
}

std::vector<std::string> configured_urls(const Settings& s) {
    if (!s.urls.empty()) return s.urls;
    std::vector<std::string> urls;
    if (const char* env = std::getenv("KCACHE_REMOTE"); env && *env) {
        std::string text(env);
        for (char& ch : text) {
            if (ch == ',') ch = ' ';
        }
        std::istringstream in(text);
        for (std::string url; in >> url;) urls.push_back(url);
    }
    return urls;
}

Result<Options> resolve(const Settings& s) {
    const std::vector<std::string> urls = configured_urls(s);
    if (urls.empty())
        return core::fail(EINVAL, "no remote server: give --remote URL or set KCACHE_REMOTE");
    Options options;
    auto is_cluster = [](const std::string& u) {
        return u.starts_with("redis-cluster://") || u.starts_with("rediss-cluster://");
    };
    for (const std::string& url : urls) {
        if (is_cluster(url)) {
            // Several cluster URLs name seeds of one cluster; plain servers cannot join it.
            options.cluster = true;
            auto seeds = KCACHE_TRY(parse_cluster_url(url));
            options.servers.insert(options.servers.end(), seeds.begin(), seeds.end());
            continue;
        }
        auto endpoint = KCACHE_TRY(parse_endpoint(url));
        options.servers.push_back(std::move(endpoint));
    }
    if (options.cluster && !std::all_of(urls.begin(), urls.end(), is_cluster)) {
        return core::fail(EINVAL,
                          "--remote: a redis-cluster:// URL cannot be mixed with plain servers "
                          "(shards are for plain servers; a cluster shards itself)");
    }
    if (!s.password_env.empty() && !s.password_file.empty()) {
        return core::fail(EINVAL,
                          "--remote-password-env and --remote-password-file exclude each other");
    }
    std::string env = s.password_env;
    if (env.empty() && s.password_file.empty() && std::getenv("KCACHE_REMOTE_PASSWORD"))
        env = "KCACHE_REMOTE_PASSWORD";
    options.password = KCACHE_TRY(load_password(env, s.password_file));
    const char* ns_env = std::getenv("KCACHE_REMOTE_NAMESPACE");
    options.ns = !s.ns.empty() ? s.ns : (ns_env && *ns_env ? ns_env : "default");
    options.op_timeout_ns = s.timeout_ns;
    options.connect_timeout_ns = s.connect_timeout_ns;
    options.read_only = s.read_only;
    auto from_env = [](const std::string& given, const char* var) {
        const char* value = std::getenv(var);
        return !given.empty() ? given : (value && *value ? std::string(value) : std::string());
    };
    options.tls.ca_file = from_env(s.tls_ca, "KCACHE_REMOTE_TLS_CA");
    options.tls.cert_file = from_env(s.tls_cert, "KCACHE_REMOTE_TLS_CERT");
    options.tls.key_file = from_env(s.tls_key, "KCACHE_REMOTE_TLS_KEY");
    options.signing_key = s.signing_key;
    if (s.trusted_keys.empty()) {
        struct stat st {};
        const std::string fallback(kDefaultTrustFile);
        if (::stat(fallback.c_str(), &st) == 0) options.trusted_keys = fallback;
    } else if (s.trusted_keys != "none") {
        options.trusted_keys = s.trusted_keys;
    }
    KCACHE_TRY(validate(options));
    return options;
}

}  // namespace kcache::remote
