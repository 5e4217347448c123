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

#include "backend.hpp"
#include "client.hpp"
#include "kcache/core/entry_image.hpp"
#include "kcache/core/frames.hpp"
#include "kcache/core/names.hpp"
#include "kcache/remote/remote.hpp"
#include "protocol.hpp"
#include "signing.hpp"

namespace kcache::remote {

namespace {

constexpr std::size_t kChunksPerRoundTrip = 8;  // bounds one pipeline to about 8 MiB

}  // namespace

Status Remote::upload_blob(Shard& server, const core::Digest& digest, std::string_view content) {
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

namespace {

// The blobs of an entry that do not ride in its manifest, as push sends them: a stored
// zstd frame as it is (proto::encode_frame), anything else as content in chunks.
struct OutgoingBlob {
    std::string content;      // raw: a blob stored raw or as segments
    std::string frame_value;  // or: its frame's value (non-empty)
    core::Digest dictionary;  // the dictionary the frame needs (empty: none)
};
using OutgoingBlobs = std::map<core::Digest, OutgoingBlob, proto::DigestLess>;
using Dictionaries = std::map<core::Digest, std::string, proto::DigestLess>;  // by digest

// Which of `m`'s files ride inline and which go as blobs, read in `txn` (the snapshot the
// image came from). A file stored as a frame with a dictionary goes as that frame even when
// small (the dictionary makes it smaller than inline content compressed with the
// manifest); a frame without one only past kInlineMax, as content did.
Status collect_outgoing(const core::Txn& txn, proto::Manifest& m, OutgoingBlobs& blobs,
                        Dictionaries& dictionaries, EntryResult& result) {
    std::map<std::uint32_t, core::Digest> by_id;  // the local dictionaries read so far
    for (proto::Node& n : m.files) {
        if (n.type != core::FileType::regular) continue;
        ++result.files;
        result.bytes += n.size;
        if (n.content.empty()) continue;
        if (blobs.count(n.digest)) {
            n.has_content = false;
            n.content.clear();
            continue;
        }
        auto frame = KCACHE_TRY(core::read_frame(txn, n.digest));
        const bool as_frame =
            frame && (frame->dictionary != 0 || n.content.size() > proto::kInlineMax);
        if (!as_frame && n.content.size() <= proto::kInlineMax) continue;
        OutgoingBlob out;
        if (as_frame) {
            if (frame->dictionary != 0) {
                auto known = by_id.find(frame->dictionary);
                if (known == by_id.end()) {
                    auto bytes = KCACHE_TRY(core::read_dictionary(txn, frame->dictionary));
                    const core::Digest digest = core::dictionary_digest(bytes);
                    dictionaries.emplace(digest, std::move(bytes));
                    known = by_id.emplace(frame->dictionary, digest).first;
                }
                out.dictionary = known->second;
            }
            out.frame_value = proto::encode_frame(frame->raw_size, out.dictionary, frame->frame);
        } else {
            out.content = std::move(n.content);
        }
        n.has_content = false;
        n.content.clear();
        blobs.emplace(n.digest, std::move(out));
    }
    return {};
}

}  // namespace

struct Remote::Outgoing {
    OutgoingBlobs blobs;  // not inlined, by digest
    Dictionaries dictionaries;
};

Status Remote::send_blobs(const Outgoing& outgoing) {
    const OutgoingBlobs& blobs = outgoing.blobs;
    const Dictionaries& dictionaries = outgoing.dictionaries;
    // One pipeline of EXISTS per server, for the blobs and the dictionaries together.
    struct Probe {
        bool dictionary = false;
        core::Digest digest;
    };
    std::map<Shard*, std::pair<std::vector<Command>, std::vector<Probe>>> probes;
    for (const auto& [digest, out] : blobs) {
        const std::string key = proto::blob_key(m_options.ns, digest);
        auto& p = probes[&shard(key)];
        p.first.push_back({"EXISTS", key});
        p.second.push_back({false, digest});
    }
    for (const auto& [digest, bytes] : dictionaries) {
        const std::string key = proto::dictionary_key(m_options.ns, digest);
        auto& p = probes[&shard(key)];
        p.first.push_back({"EXISTS", key});
        p.second.push_back({true, digest});
    }
    std::vector<std::pair<Shard*, core::Digest>> missing_blobs, missing_dictionaries;
    for (auto& [server, p] : probes) {
        if (uploads_paused(*server)) {
            return core::fail(
                ENOSPC,
                fmt::format("redis {}: uploads are paused after an OOM reply (the remote is full)",
                            server->id));
        }
        auto have = KCACHE_TRY(exec(*server, p.first));
        for (std::size_t i = 0; i < have.size(); ++i) {
            if (have[i].type != Reply::Type::integer)
                return tl::unexpected(reply_error(*server, have[i], "EXISTS"));
            if (have[i].integer == 1) continue;
            (p.second[i].dictionary ? missing_dictionaries : missing_blobs)
                .emplace_back(server, p.second[i].digest);
        }
    }
    // Dictionaries first (SET NX: the same bytes whoever sends them), so that a frame
    // found is a frame whose dictionary was there (unless Redis evicted it since: the
    // puller then misses cleanly and drops the frame, and the next push of its entry
    // finds the dictionary missing here and sends it again).
    std::map<Shard*, std::vector<Command>> sets;
    for (const auto& [server, digest] : missing_dictionaries) {
        sets[server].push_back({"SET", proto::dictionary_key(m_options.ns, digest),
                                proto::encode_dictionary(dictionaries.at(digest)), "NX"});
    }
    auto flush = [&]() -> Status {
        for (auto& [server, commands] : sets) {
            auto replies = KCACHE_TRY(exec(*server, commands));
            for (const Reply& r : replies) {
                if (!r.is_ok() && r.type != Reply::Type::nil)
                    return tl::unexpected(reply_error(*server, r, "upload"));
            }
        }
        sets.clear();
        return {};
    };
    KCACHE_TRY(flush());
    // Frames pipelined per server (each under kSegmentedSize), then content in chunks.
    std::map<Shard*, std::uint64_t> pending;
    for (const auto& [server, digest] : missing_blobs) {
        const OutgoingBlob& out = blobs.at(digest);
        if (out.frame_value.empty()) continue;
        sets[server].push_back({"SET", proto::blob_key(m_options.ns, digest), out.frame_value});
        if ((pending[server] += out.frame_value.size()) >=
            kChunksPerRoundTrip * proto::kChunkBytes) {
            KCACHE_TRY(flush());
            pending.clear();
        }
    }
    KCACHE_TRY(flush());
    for (const auto& [server, digest] : missing_blobs) {
        const OutgoingBlob& out = blobs.at(digest);
        if (out.frame_value.empty()) KCACHE_TRY(upload_blob(*server, digest, out.content));
    }
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
    Outgoing outgoing;
    EntryResult result;
    std::optional<core::FamilyMember> member;  // recorded once the manifest is written
    {  // the manifest, the frames, the contents and the family member, from one snapshot
        auto txn = KCACHE_TRY(store.read());
        const auto entry = KCACHE_TRY(txn.find_entry(name));
        static_cast<core::EntryImage&>(m) = KCACHE_TRY(core::read_image(txn, entry, true));
        if (m_signing_key) {
            // The SHA-256 of every regular file, while the image still carries them all.
            proto::Signature sig;
            for (const proto::Node& n : m.files) {
                if (n.type == core::FileType::regular) sig.sha256.push_back(sha256(n.content));
            }
            m.signature = std::move(sig);
        }
        KCACHE_TRY(collect_outgoing(txn, m, outgoing.blobs, outgoing.dictionaries, result));
        member = family_member_of(txn, entry);
    }
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) m.writer = host;
    if (m_signing_key) {
        const PublicKey& key = m_signing_key->public_key();
        m.signature->key.assign(reinterpret_cast<const char*>(key.raw.data()), key.raw.size());
        m.signature->signature =
            m_signing_key->sign(KCACHE_TRY(proto::signed_statement(m_options.ns, m)));
        result.signer = key.id();
    }

    const std::string mkey = proto::manifest_key(m_options.ns, m.name);
    Shard& mserver = shard(mkey);
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
    // A signing pusher replaces a manifest there that its own policy would refuse
    // (unsigned, bad, or by a key it does not trust or has revoked): else such a
    // manifest, written first, would keep the name a miss for every verifying reader.
    // A manifest this pusher would accept stays (first writer wins).
    bool replace = false;
    if (exists.front().integer == 1 && m_signing_key) {
        auto got = KCACHE_TRY(exec(mserver, {{"GET", mkey}}));
        if (got.front().type == Reply::Type::string) {
            auto old = proto::decode_manifest(got.front().str);
            std::string detail, signer;
            replace = !old || old->name != m.name ||
                      check_signature(*old, m_options.ns, m_trust ? &*m_trust : nullptr, detail,
                                      signer) != Rejection::none;
        }
    }
    if (exists.front().integer == 1 && !replace) {
        KCACHE_TRY(record_containers(m.name));
        KCACHE_TRY(add_to_job());
        m_counts.upload_skipped.fetch_add(1);
        result.outcome = Outcome::already_remote;
        return result;
    }
    // Only what the remote lacks is sent.
    KCACHE_TRY(send_blobs(outgoing));
    // Every blob is acknowledged: now the manifest, first writer wins.
    Command set_manifest{"SET", mkey, proto::encode(m)};
    if (!replace) set_manifest.push_back("NX");
    auto set = KCACHE_TRY(exec(mserver, {set_manifest}));
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
    KCACHE_TRY(record_containers(m.name));
    KCACHE_TRY(add_to_job());
    return result;
}

Status Remote::record_containers(std::string_view entry) {
    Command sadd{"SADD", proto::containers_key(m_options.ns)};
    {
        MutexLock lock(m_containers_mutex);
        for (std::string& dir : core::ancestor_dirs(entry)) {
            if (!m_containers_recorded.contains(dir)) sadd.push_back(std::move(dir));
        }
    }
    if (sadd.size() == 2) return {};
    Shard& server = shard(sadd[1]);
    auto replies = KCACHE_TRY(exec(server, {sadd}));
    if (replies.front().type != Reply::Type::integer)
        return tl::unexpected(reply_error(server, replies.front(), "container set"));
    MutexLock lock(m_containers_mutex);
    if (m_containers_recorded.size() > kMaxContainersRecorded) m_containers_recorded.clear();
    m_containers_recorded.insert(sadd.begin() + 2, sadd.end());
    return {};
}

Result<std::uint64_t> Remote::container_count() {
    const std::string key = proto::containers_key(m_options.ns);
    Shard& server = shard(key);
    auto r = KCACHE_TRY(exec(server, {{"SCARD", key}}));
    if (r.front().type != Reply::Type::integer)
        return tl::unexpected(reply_error(server, r.front(), "SCARD"));
    return static_cast<std::uint64_t>(std::max<long long>(r.front().integer, 0));
}

Result<std::vector<std::string>> Remote::containers() {
    const std::string key = proto::containers_key(m_options.ns);
    Shard& server = shard(key);
    auto r = KCACHE_TRY(exec(server, {{"SMEMBERS", key}}));
    const Reply& set = r.front();
    if (set.type != Reply::Type::array) return tl::unexpected(reply_error(server, set, "SMEMBERS"));
    std::vector<std::string> paths;
    paths.reserve(set.elements.size());
    for (const Reply& e : set.elements) {
        if (e.type == Reply::Type::string) paths.push_back(e.str);
    }
    return paths;
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
    Shard& server = shard(jkey);
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
    Shard& server = shard(proto::lease_key(m_options.ns, entry));  // the manifest's server
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
    Shard& server = shard(proto::lease_key(m_options.ns, entry));  // the manifest's server
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
    Shard& server = shard(proto::lease_key(m_options.ns, entry));
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
    Shard& server = shard(proto::lease_key(m_options.ns, entry));  // the manifest's server
    auto replies = KCACHE_TRY(exec(server, {{"EXISTS", proto::lease_key(m_options.ns, entry)}}));
    const Reply& r = replies.front();
    if (r.type != Reply::Type::integer) return tl::unexpected(reply_error(server, r, "lease"));
    return r.integer > 0;
}

}  // namespace kcache::remote
