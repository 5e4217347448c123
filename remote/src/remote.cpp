// URLs, passwords, options, the Remote made on its Backend (RedisPool unless given
// another: redis_pool.cpp), counts. Moving entries is in transfer.cpp and pull.cpp.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>

#include <fmt/core.h>

#include "client.hpp"
#include "cluster.hpp"
#include "kcache/remote/remote.hpp"
#include "redis_pool.hpp"

namespace kcache::remote {

namespace {

bool all_of_charset(std::string_view s, std::string_view extra) {
    return std::all_of(s.begin(), s.end(), [&](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               extra.find(c) != std::string_view::npos;
    });
}

template <class T>
bool parse_number(std::string_view s, T& out, T max) {
    if (s.empty()) return false;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size() && out <= max;
}

tl::unexpected<core::Error> bad_url(std::string_view url, std::string_view why) {
    return core::fail(EINVAL, fmt::format("bad remote URL '{}': {}", url, why));
}

void ignore_sigpipe() {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
        struct sigaction ign {};
        ign.sa_handler = SIG_IGN;
        sigemptyset(&ign.sa_mask);
        sigaction(SIGPIPE, &ign, nullptr);
    }
}

}  // namespace

std::string Endpoint::id() const {
    // No user: a read-only node logs in as another user but must shard keys exactly
    // as the writers do.
    if (unix_socket)
        return db ? fmt::format("unix:{}?db={}", path, db) : fmt::format("unix:{}", path);
    const bool v6 = host.find(':') != std::string::npos;
    return fmt::format("{}://{}{}{}:{}/{}", tls ? "rediss" : "redis", v6 ? "[" : "", host,
                       v6 ? "]" : "", port, db);
}

Result<Endpoint> parse_endpoint(std::string_view url) {
    Endpoint e;
    constexpr unsigned kMaxDb = 1'000'000;
    if (url.starts_with("unix:")) {
        e.unix_socket = true;
        std::string_view rest = url.substr(5);
        if (rest.starts_with("//")) rest.remove_prefix(2);  // unix:///path
        const std::size_t q = rest.find('?');
        e.path = std::string(rest.substr(0, q));
        if (e.path.empty() || e.path.front() != '/')
            return bad_url(url, "a unix socket path must be absolute");
        std::string_view params =
            q == std::string_view::npos ? std::string_view() : rest.substr(q + 1);
        while (!params.empty()) {
            const std::size_t amp = params.find('&');
            const std::string_view p = params.substr(0, amp);
            params = amp == std::string_view::npos ? std::string_view() : params.substr(amp + 1);
            if (p.starts_with("db=")) {
                if (!parse_number(p.substr(3), e.db, kMaxDb))
                    return bad_url(url, "db must be a number");
            } else if (p.starts_with("user=")) {
                e.user = std::string(p.substr(5));
            } else if (p.starts_with("password=")) {
                return bad_url(url,
                               "a password in the URL is refused; use --remote-password-env or "
                               "--remote-password-file");
            } else {
                return bad_url(url,
                               fmt::format("unknown parameter '{}'", p.substr(0, p.find('='))));
            }
        }
        return e;
    }
    if (url.starts_with("rediss://")) {
        e.tls = true;
    } else if (!url.starts_with("redis://")) {
        return bad_url(url,
                       "expected redis://[user@]host:port[/db], rediss://... (TLS) or "
                       "unix:/path");
    }
    std::string_view rest = url.substr(e.tls ? 9 : 8);
    const std::size_t at = rest.rfind('@');
    if (at != std::string_view::npos) {
        const std::string_view userinfo = rest.substr(0, at);
        if (userinfo.find(':') != std::string_view::npos) {
            // Not echoed: the part after ':' is a secret.
            return core::fail(EINVAL,
                              "bad remote URL: a password in the URL is refused; use "
                              "--remote-password-env or --remote-password-file");
        }
        e.user = std::string(userinfo);
        rest.remove_prefix(at + 1);
    }
    const std::size_t slash = rest.find('/');
    std::string_view hostport = rest.substr(0, slash);
    if (slash != std::string_view::npos) {
        const std::string_view db = rest.substr(slash + 1);
        if (!db.empty() && !parse_number(db, e.db, kMaxDb))
            return bad_url(url, "db must be a number");
    }
    std::string_view port;
    if (hostport.starts_with('[')) {  // [IPv6]:port
        const std::size_t close = hostport.find(']');
        if (close == std::string_view::npos) return bad_url(url, "unclosed '['");
        e.host = std::string(hostport.substr(1, close - 1));
        const std::string_view after = hostport.substr(close + 1);
        if (!after.empty() && !after.starts_with(':'))
            return bad_url(url, "expected ':' after ']'");
        if (!after.empty()) port = after.substr(1);
    } else {
        const std::size_t colon = hostport.find(':');
        e.host = std::string(hostport.substr(0, colon));
        if (colon != std::string_view::npos) port = hostport.substr(colon + 1);
    }
    if (e.host.empty()) return bad_url(url, "no host");
    if (!port.empty() && (!parse_number(port, e.port, std::uint16_t{65535}) || e.port == 0)) {
        return bad_url(url, "port must be a number from 1 to 65535");
    }
    return e;
}

Result<std::vector<Endpoint>> parse_cluster_url(std::string_view url) {
    constexpr std::string_view kScheme = "redis-cluster://";
    constexpr std::string_view kTlsScheme = "rediss-cluster://";  // TLS to every node
    const bool tls = url.starts_with(kTlsScheme);
    if (!tls && !url.starts_with(kScheme))
        return bad_url(url,
                       "expected redis-cluster://[user@]host:port[,host:port...] or "
                       "rediss-cluster://... (TLS)");
    std::string_view rest = url.substr(tls ? kTlsScheme.size() : kScheme.size());
    std::string user;
    if (const std::size_t at = rest.rfind('@'); at != std::string_view::npos) {
        if (rest.substr(0, at).find(':') != std::string_view::npos) {
            return core::fail(EINVAL,
                              "bad remote URL: a password in the URL is refused; use "
                              "--remote-password-env or --remote-password-file");
        }
        user = std::string(rest.substr(0, at)) + "@";
        rest.remove_prefix(at + 1);
    }
    if (rest.ends_with("/0")) rest.remove_suffix(2);
    if (rest.find('/') != std::string_view::npos) return bad_url(url, "a cluster has only db 0");
    std::vector<Endpoint> seeds;
    while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string_view hostport = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        if (hostport.empty()) return bad_url(url, "an empty node between commas");
        auto e = parse_endpoint(fmt::format("{}://{}{}", tls ? "rediss" : "redis", user, hostport));
        if (!e) return bad_url(url, e.error().message);
        seeds.push_back(std::move(*e));
    }
    if (seeds.empty()) return bad_url(url, "no node");
    return seeds;
}

Result<std::string> load_password(const std::string& env_name, const std::string& file) {
    if (!env_name.empty()) {
        const char* value = std::getenv(env_name.c_str());
        if (value == nullptr)
            return core::fail(EINVAL, fmt::format("password variable {} is not set", env_name));
        return std::string(value);
    }
    if (file.empty()) return std::string();
    std::ifstream in(file);
    std::string line;
    if (!in || !std::getline(in, line)) {
        return core::fail(EINVAL, fmt::format("cannot read the password file {}", file));
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
}

Status validate(const Options& o) {
    if (o.servers.empty()) return core::fail(EINVAL, "no remote server given (--remote URL)");
    if (o.ns.empty() || o.ns.size() > 64 || !all_of_charset(o.ns, "._-")) {
        return core::fail(
            EINVAL, fmt::format("bad remote namespace '{}': 1-64 of A-Z a-z 0-9 . _ -", o.ns));
    }
    if (o.connect_timeout_ns <= 0 || o.op_timeout_ns <= 0 || o.breaker_cooldown_ns <= 0 ||
        o.oom_pause_ns < 0) {
        return core::fail(EINVAL, "remote timeouts must be positive");
    }
    if (o.breaker_threshold == 0)
        return core::fail(EINVAL, "the breaker threshold must be at least 1");
    if (o.lease_ms < 0 && o.lease_ms != Options::kLeaseRenewed)
        return core::fail(EINVAL, "a lease's time must be positive (or 0: no leases)");
    for (const Endpoint& e : o.cluster ? o.servers : std::vector<Endpoint>()) {
        if (e.unix_socket || e.db != 0) {
            return core::fail(EINVAL, fmt::format("cluster node {}: a cluster is reached over "
                                                  "TCP and has only db 0",
                                                  e.id()));
        }
        // The nodes a slot map names are reached as the seeds are: all TLS or none.
        if (e.tls != o.servers.front().tls) {
            return core::fail(EINVAL,
                              "cluster seeds mix rediss-cluster:// (TLS) and "
                              "redis-cluster:// (plaintext)");
        }
    }
    const bool any_tls =
        std::any_of(o.servers.begin(), o.servers.end(), [](const Endpoint& e) { return e.tls; });
    if (o.tls.any() && !any_tls) {
        return core::fail(EINVAL,
                          "--remote-tls-ca, --remote-tls-cert and --remote-tls-key are "
                          "for rediss:// servers, and none is given");
    }
    if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
        return core::fail(EINVAL,
                          "--remote-tls-cert and --remote-tls-key go together (a client "
                          "certificate and its private key)");
    }
    return {};
}

Status validate_job_tag(std::string_view tag) {
    if (tag.empty() || tag.size() > 128 || !all_of_charset(tag, "._:-")) {
        return core::fail(EINVAL,
                          fmt::format("bad job tag '{}': 1-128 of A-Z a-z 0-9 . _ : -", tag));
    }
    return {};
}

std::string_view outcome_name(Outcome o) {
    switch (o) {
        case Outcome::uploaded:
            return "uploaded";
        case Outcome::already_remote:
            return "already remote";
        case Outcome::pulled:
            return "pulled";
        case Outcome::already_local:
            return "already local";
        case Outcome::miss:
            return "miss";
        case Outcome::dangling:
            return "dangling";
        case Outcome::corrupt:
            return "corrupt";
        case Outcome::rejected:
            return "rejected";
    }
    return "unknown";
}

std::string_view rejection_name(Rejection r) {
    switch (r) {
        case Rejection::none:
            return "none";
        case Rejection::unsigned_entry:
            return "unsigned";
        case Rejection::untrusted:
            return "untrusted";
        case Rejection::revoked:
            return "revoked";
        case Rejection::bad:
            return "bad signature";
    }
    return "unknown";
}

Remote::Remote(Options options) : m_options(std::move(options)) {}
Remote::~Remote() = default;

Result<std::unique_ptr<Remote>> Remote::create(Options options) {
    return create(std::move(options),
                  [](const Options& o, AtomicCounts& counts) -> Result<std::unique_ptr<Backend>> {
                      return KCACHE_TRY(RedisPool::create(o, counts));
                  });
}

Result<std::unique_ptr<Remote>> Remote::create(Options options, const MakeBackend& make) {
    KCACHE_TRY(validate(options));
    ignore_sigpipe();
    std::unique_ptr<Remote> remote(new Remote(std::move(options)));
    if (!remote->m_options.signing_key.empty()) {
        auto key = SigningKey::load(remote->m_options.signing_key);
        if (!key) return tl::unexpected(core::with_context(key.error(), "--remote-signing-key"));
        remote->m_signing_key = std::move(*key);
    }
    if (!remote->m_options.trusted_keys.empty()) {
        auto trust = load_trust_file(remote->m_options.trusted_keys);
        if (!trust)
            return tl::unexpected(core::with_context(trust.error(), "--remote-trusted-keys"));
        remote->m_trust = std::move(*trust);
    }
    remote->m_backend = KCACHE_TRY(make(remote->m_options, remote->m_counts));
    return remote;
}

Shard& Remote::shard(std::string_view key) {
    return m_backend->shard(key);
}

Result<std::vector<Reply>> Remote::exec(Shard& shard, const std::vector<Command>& commands) {
    return m_backend->exec(shard, commands);
}

bool Remote::uploads_paused(Shard& shard) {
    return m_backend->uploads_paused(shard);
}

core::Error Remote::reply_error(const Shard& shard, const Reply& reply, std::string_view what) {
    m_counts.errors.fetch_add(1);
    int code = EPROTO;
    std::string text = reply.is_error() ? reply.str : "unexpected reply";
    if (text.starts_with("OOM")) {
        code = ENOSPC;
        text += fmt::format(" (uploads paused for {} s)", m_options.oom_pause_ns / 1'000'000'000);
    } else if (text.starts_with("NOPERM") || text.starts_with("NOAUTH") ||
               text.starts_with("WRONGPASS")) {
        code = EACCES;
    }
    return {code, fmt::format("redis {}: {}: {}", shard.id, what, text)};
}

std::vector<std::string> Remote::ping() {
    std::vector<std::string> out;
    for (Shard* s : m_backend->serving()) {
        auto r = exec(*s, {{"PING"}});
        if (!r) {
            out.push_back(r.error().message);
        } else if (r->front().type != Reply::Type::status || r->front().str != "PONG") {
            out.push_back(reply_error(*s, r->front(), "PING").message);
        } else {
            out.emplace_back();
        }
    }
    return out;
}

std::size_t Remote::probe() {
    return m_backend->probe();
}

namespace {

// Whether kStatistics has a remote statistic `name` for `id` (the row KCACHE_REMOTE_COUNTS
// names): checked at compile time for every counter, below.
constexpr bool remote_statistic(core::Counter id, std::string_view name) {
    for (const core::StatisticField& f : core::kStatistics) {
        if (f.id == id) return f.name == name && (f.counted_by & core::by_remote) != 0;
    }
    return false;
}
#define KCACHE_REMOTE_COUNT_ROW(name)                                              \
    static_assert(remote_statistic(core::Counter::remote_##name, "remote_" #name), \
                  "KCACHE_REMOTE_COUNTS: no by_remote row remote_" #name " in kStatistics");
KCACHE_REMOTE_COUNTS(KCACHE_REMOTE_COUNT_ROW)
#undef KCACHE_REMOTE_COUNT_ROW

}  // namespace

Counts AtomicCounts::load() const {
    Counts c;
#define KCACHE_REMOTE_COUNT_LOAD(name) c.name = name.load();
    KCACHE_REMOTE_COUNTS(KCACHE_REMOTE_COUNT_LOAD)
#undef KCACHE_REMOTE_COUNT_LOAD
    return c;
}

Counts Counts::operator-(const Counts& earlier) const {
    Counts d;
#define KCACHE_REMOTE_COUNT_MINUS(name) d.name = name - earlier.name;
    KCACHE_REMOTE_COUNTS(KCACHE_REMOTE_COUNT_MINUS)
#undef KCACHE_REMOTE_COUNT_MINUS
    return d;
}

bool Counts::any() const {
#define KCACHE_REMOTE_COUNT_ANY(name) name != 0 ||
    return KCACHE_REMOTE_COUNTS(KCACHE_REMOTE_COUNT_ANY) false;
#undef KCACHE_REMOTE_COUNT_ANY
}

Counts Remote::counts() const {
    return m_counts.load();
}

std::vector<ServerState> Remote::servers() {
    return m_backend->states();
}

Status record_counts(core::Store& store, const Counts& c) {
    using core::Counter;
    const std::pair<Counter, std::uint64_t> deltas[] = {
#define KCACHE_REMOTE_COUNT_DELTA(name) {Counter::remote_##name, c.name},
        KCACHE_REMOTE_COUNTS(KCACHE_REMOTE_COUNT_DELTA)
#undef KCACHE_REMOTE_COUNT_DELTA
    };
    return store.update([&](core::WriteTxn& txn) -> Status {
        for (const auto& [counter, delta] : deltas) {
            if (delta == 0) continue;
            if (auto s = txn.add(counter, delta); !s) return s;
        }
        return {};
    });
}

}  // namespace kcache::remote
