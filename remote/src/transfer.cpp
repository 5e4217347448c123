// Pushing entries (blobs, then the manifest with SET NX, then the job set), job sets and
// compile leases. Pulling is in pull.cpp.
//
// No LMDB write transaction is ever open while waiting on Redis: a push reads from a
// snapshot that ends before the first command.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>
#include <unordered_map>

#include <fmt/core.h>

#include "client.hpp"
#include "kcache/core/names.hpp"
#include "kcache/remote/remote.hpp"
#include "protocol.hpp"
#include "server.hpp"

namespace kcache::remote {

namespace {

constexpr std::size_t kChunksPerRoundTrip = 8;  // bounds one pipeline to about 8 MiB

}  // namespace

Status Remote::upload_blob(Server& server, const core::Digest& digest, std::string_view content) {
    const std::uint32_t chunks = proto::chunk_count(content.size());
    for (std::uint32_t first = 0; first < chunks; first += kChunksPerRoundTrip) {
        std::vector<Command> batch;
        for (std::uint32_t i = first;
             i < std::min<std::uint32_t>(chunks, first + kChunksPerRoundTrip); ++i) {
            const std::string_view raw =
                content.substr(std::size_t{i} * proto::kChunkBytes, proto::kChunkBytes);
            batch.push_back(
                {"SET", proto::chunk_key(m_options.ns, digest, i), proto::encode_chunk(raw)});
        }
        auto replies = KCACHE_TRY(exec(server, batch));
        for (const Reply& r : replies) {
            if (!r.is_ok()) return tl::unexpected(reply_error(server, r, "upload"));
        }
    }
    // The header last: a reader that finds it finds every chunk (unless evicted).
    const auto header =
        KCACHE_TRY(exec(server, {{"SET", proto::blob_key(m_options.ns, digest),
                                  proto::encode(proto::BlobHeader{content.size(), chunks})}}));
    if (!header.front().is_ok())
        return tl::unexpected(reply_error(server, header.front(), "upload"));
    return {};
}

Result<EntryResult> Remote::push(const core::Store& store, std::string_view name,
                                 std::string_view job_tag) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): nothing is pushed");
    if (!job_tag.empty()) {
        KCACHE_TRY(validate_job_tag(job_tag));
    }
    proto::Manifest m;
    std::map<core::Digest, std::string, proto::DigestLess> blobs;  // not inlined, by digest
    EntryResult result;
    std::optional<core::FamilyMember> member;  // recorded once the manifest is written
    {  // the manifest and the contents, from one snapshot that ends here
        auto txn = KCACHE_TRY(store.read());
        const auto entry = KCACHE_TRY(txn.find_entry(name));
        static_cast<core::EntryImage&>(m) = KCACHE_TRY(core::read_image(txn, entry, true));
        member = family_member_of(txn, entry);
    }
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) m.writer = host;
    // Small files ride in the manifest; the others go as blobs, each once.
    for (proto::Node& n : m.files) {
        if (n.type != core::FileType::regular) continue;
        ++result.files;
        result.bytes += n.size;
        if (n.content.size() <= proto::kInlineMax) continue;
        n.has_content = false;
        if (!blobs.count(n.digest)) blobs.emplace(n.digest, std::move(n.content));
        n.content.clear();
    }

    const std::string mkey = proto::manifest_key(m_options.ns, m.name);
    Server& mserver = shard(mkey);
    auto add_to_job = [&]() -> Status {
        if (job_tag.empty()) return {};
        return this->add_to_job(job_tag, {m.name});
    };
    if (uploads_paused(mserver)) {
        return core::fail(
            ENOSPC,
            fmt::format("redis {}: uploads are paused after an OOM reply (the remote is full)",
                        mserver.id));
    }
    auto exists = KCACHE_TRY(exec(mserver, {{"EXISTS", mkey}}));
    if (exists.front().type != Reply::Type::integer)
        return tl::unexpected(reply_error(mserver, exists.front(), "EXISTS"));
    if (exists.front().integer == 1) {
        KCACHE_TRY(add_to_job());
        m_counts.upload_skipped.fetch_add(1);
        result.outcome = Outcome::already_remote;
        return result;
    }
    // Only the blobs the remote lacks are sent, grouped by the server that holds them.
    std::map<Server*, std::vector<core::Digest>> by_server;
    for (const auto& [digest, content] : blobs)
        by_server[&shard(proto::blob_key(m_options.ns, digest))].push_back(digest);
    for (const auto& [server, digests] : by_server) {
        if (uploads_paused(*server)) {
            return core::fail(
                ENOSPC,
                fmt::format("redis {}: uploads are paused after an OOM reply (the remote is full)",
                            server->id));
        }
        std::vector<Command> probes;
        for (const core::Digest& d : digests)
            probes.push_back({"EXISTS", proto::blob_key(m_options.ns, d)});
        auto have = KCACHE_TRY(exec(*server, probes));
        for (std::size_t i = 0; i < digests.size(); ++i) {
            const Reply& r = have[i];
            if (r.type != Reply::Type::integer)
                return tl::unexpected(reply_error(*server, r, "EXISTS"));
            if (r.integer == 1) continue;
            KCACHE_TRY(upload_blob(*server, digests[i], blobs.at(digests[i])));
        }
    }
    // Every blob is acknowledged: now the manifest, first writer wins.
    auto set = KCACHE_TRY(exec(mserver, {{"SET", mkey, proto::encode(m), "NX"}}));
    const Reply& r = set.front();
    if (r.is_ok()) {
        m_counts.uploads.fetch_add(1);
        result.outcome = Outcome::uploaded;
        record_member(member);
    } else if (r.type == Reply::Type::nil) {
        m_counts.upload_skipped.fetch_add(1);
        result.outcome = Outcome::already_remote;
    } else {
        return tl::unexpected(reply_error(mserver, r, "manifest"));
    }
    KCACHE_TRY(add_to_job());
    return result;
}

std::optional<core::FamilyMember> Remote::family_member_of(const core::Txn& txn,
                                                           const core::EntryInfo& entry) {
    auto member = core::family_member(txn, entry);
    if (member) return std::move(*member);
    m_counts.family_errors.fetch_add(1);
    return std::nullopt;
}

void Remote::record_member(const std::optional<core::FamilyMember>& member) {
    if (member && !record_family_member(*member)) m_counts.family_errors.fetch_add(1);
}

Status Remote::add_to_job(std::string_view job_tag, const std::vector<std::string>& entries) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): no job set");
    if (auto s = validate_job_tag(job_tag); !s) return s;
    const std::string jkey = proto::job_key(m_options.ns, job_tag);
    Server& server = shard(jkey);
    constexpr std::size_t kPerCommand = 512;
    std::vector<Command> commands;
    for (std::size_t first = 0; first < entries.size(); first += kPerCommand) {
        Command sadd{"SADD", jkey};
        const std::size_t end = std::min(entries.size(), first + kPerCommand);
        sadd.insert(sadd.end(), entries.begin() + static_cast<std::ptrdiff_t>(first),
                    entries.begin() + static_cast<std::ptrdiff_t>(end));
        commands.push_back(std::move(sadd));
    }
    if (commands.empty()) return {};
    auto replies = KCACHE_TRY(exec(server, commands));
    for (const Reply& r : replies) {
        if (r.type != Reply::Type::integer)
            return tl::unexpected(reply_error(server, r, "job set"));
    }
    return {};
}

Result<bool> Remote::acquire_lease(std::string_view entry, std::string_view owner,
                                   std::int64_t ttl_ms) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): no lease");
    Server& server = shard(proto::lease_key(m_options.ns, entry));  // the manifest's server
    const auto replies =
        KCACHE_TRY(exec(server, {{"SET", proto::lease_key(m_options.ns, entry), std::string(owner),
                                  "NX", "PX", std::to_string(std::max<std::int64_t>(ttl_ms, 1))}}));
    const Reply& r = replies.front();
    if (r.is_ok()) return true;
    if (r.type == Reply::Type::nil) return false;  // held by another
    return tl::unexpected(reply_error(server, r, "lease"));
}

Status Remote::release_lease(std::string_view entry, std::string_view owner) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): no lease");
    Server& server = shard(proto::lease_key(m_options.ns, entry));  // the manifest's server
    // Compare and delete in one step: a lease that expired and was taken by another
    // node meanwhile is theirs.
    static const char* const kScript =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
        "else return 0 end";
    const auto replies = KCACHE_TRY(
        exec(server,
             {{"EVAL", kScript, "1", proto::lease_key(m_options.ns, entry), std::string(owner)}}));
    const Reply& r = replies.front();
    if (r.type != Reply::Type::integer) return tl::unexpected(reply_error(server, r, "lease"));
    return {};
}

Result<bool> Remote::renew_lease(std::string_view entry, std::string_view owner,
                                 std::int64_t ttl_ms) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): no lease");
    Server& server = shard(proto::lease_key(m_options.ns, entry));
    static const char* const kScript =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], "
        "ARGV[2]) else return 0 end";
    const auto replies = KCACHE_TRY(
        exec(server, {{"EVAL", kScript, "1", proto::lease_key(m_options.ns, entry),
                       std::string(owner), std::to_string(std::max<std::int64_t>(ttl_ms, 1))}}));
    const Reply& r = replies.front();
    if (r.type != Reply::Type::integer) return tl::unexpected(reply_error(server, r, "lease"));
    return r.integer == 1;
}

Result<bool> Remote::lease_held(std::string_view entry) {
    Server& server = shard(proto::lease_key(m_options.ns, entry));  // the manifest's server
    auto replies = KCACHE_TRY(exec(server, {{"EXISTS", proto::lease_key(m_options.ns, entry)}}));
    const Reply& r = replies.front();
    if (r.type != Reply::Type::integer) return tl::unexpected(reply_error(server, r, "lease"));
    return r.integer > 0;
}

}  // namespace kcache::remote
