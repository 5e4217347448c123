// Moving entries: push (blobs, then the manifest with SET NX, then the job set) and
// pull (manifest, blobs, every digest checked, then one write transaction).
//
// No LMDB write transaction is ever open while waiting on Redis: a pull fetches and
// checks everything first, a push reads from a snapshot.
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
constexpr std::size_t kMaxPath = 0xffff;        // the manifest's str16

struct DigestLess {
    bool operator()(const core::Digest& a, const core::Digest& b) const {
        return a.high != b.high ? a.high < b.high : a.low < b.low;
    }
};

// A relative path of valid names (core::check_path), as long as the manifest's str16 allows.
Status check_path(std::string_view path, std::string_view what) {
    if (auto s = core::check_path(path, kMaxPath); !s) {
        return tl::unexpected(core::with_context(s.error(), std::string(what)));
    }
    return {};
}

std::string dir_of(std::string_view path) {
    const std::size_t slash = path.rfind('/');
    return slash == std::string_view::npos ? std::string() : std::string(path.substr(0, slash));
}

// Everything a hostile manifest could get wrong about names, checked before any
// blob is fetched.
Status check_manifest(const proto::Manifest& m, std::string_view asked) {
    if (m.entry != asked)
        return core::fail(EINVAL, fmt::format("the manifest names another entry, '{}'", m.entry));
    if (auto s = check_path(m.entry, "entry"); !s) return s;
    const std::string dir = dir_of(m.entry);
    if (m.kind == core::EntryKind::stem) {
        if (m.stem.empty() || m.entry != (dir.empty() ? m.stem : dir + "/" + m.stem)) {
            return core::fail(EINVAL, "a stem entry's name must be its directory and its stem");
        }
    }
    if (m.nodes.empty()) return core::fail(EINVAL, "the manifest has no files");
    std::map<std::string, core::FileType, std::less<>> seen;
    for (const proto::Node& n : m.nodes) {
        if (auto s = check_path(n.path, "file"); !s) return s;
        if (seen.count(n.path))
            return core::fail(EINVAL, fmt::format("'{}' appears twice", n.path));
        if (m.kind == core::EntryKind::stem) {
            if (n.path.find('/') != std::string::npos || !n.path.starts_with(m.stem) ||
                n.type == core::FileType::directory) {
                return core::fail(EINVAL,
                                  fmt::format("'{}' is not a file of stem '{}'", n.path, m.stem));
            }
        } else if (const std::string parent = dir_of(n.path); !parent.empty()) {
            auto it = seen.find(parent);
            if (it == seen.end() || it->second != core::FileType::directory) {
                return core::fail(EINVAL, fmt::format("'{}' comes before its directory", n.path));
            }
        }
        if (n.type == core::FileType::symlink) {
            const std::string full = m.kind == core::EntryKind::stem
                                         ? (dir.empty() ? n.path : dir + "/" + n.path)
                                         : m.entry + "/" + n.path;
            if (auto s = core::check_link_target(full, n.target); !s) return s;
        }
        seen.emplace(n.path, n.type);
    }
    return {};
}

// Writes the checked manifest's nodes with their verified contents, then checks that
// the layout here forms the same entry. The caller commits or drops the transaction.
Status write_entry(core::WriteTxn& txn, const proto::Manifest& m,
                   const std::map<core::Digest, std::string, DigestLess>& blobs) {
    const core::Origin origin = core::Origin::current();
    std::unordered_map<std::string, core::Ino> made;  // relative path -> ino
    core::Ino top = 0;
    if (m.kind == core::EntryKind::node) {
        auto parent = txn.mkdirs(dir_of(m.entry));
        if (!parent) return tl::unexpected(parent.error());
        const std::string base = m.entry.substr(m.entry.rfind('/') + 1);
        auto existing = txn.lookup(*parent, base);  // an empty entry directory is filled
        auto dir = existing && existing->is_dir()
                       ? existing
                       : txn.mkdir(*parent, base, m.dir_mode & 0777, getuid(), getgid());
        if (!dir) return tl::unexpected(core::with_context(dir.error(), m.entry));
        top = dir->ino;
    } else {
        auto parent = txn.mkdirs(dir_of(m.entry));
        if (!parent) return tl::unexpected(parent.error());
        top = *parent;
    }
    for (const proto::Node& n : m.nodes) {
        const std::string parent_path =
            m.kind == core::EntryKind::node ? dir_of(n.path) : std::string();
        const core::Ino parent = parent_path.empty() ? top : made.at(parent_path);
        const std::string name = n.path.substr(n.path.rfind('/') + 1);
        core::Result<core::Attr> attr = core::fail(EINVAL, "unknown node type");
        switch (n.type) {
            case core::FileType::directory:
                attr = txn.mkdir(parent, name, n.mode & 0777, getuid(), getgid());
                break;
            case core::FileType::symlink:
                attr = txn.symlink(parent, name, n.target, getuid(), getgid());
                break;
            case core::FileType::regular: {
                attr = txn.create(parent, name, n.mode & 0777, getuid(), getgid(), true);
                const std::string_view content = n.inlined || n.size == 0
                                                     ? std::string_view(n.content)
                                                     : std::string_view(blobs.at(n.digest));
                if (attr && !content.empty()) attr = txn.write(attr->ino, content, origin);
                break;
            }
        }
        if (!attr) return tl::unexpected(core::with_context(attr.error(), n.path));
        core::SetAttr times;
        times.mtime_ns = n.mtime_ns;
        if (auto a = txn.setattr(attr->ino, times); !a) return tl::unexpected(a.error());
        made[n.path] = attr->ino;
    }
    auto formed = txn.find_entry(m.entry);
    if (!formed || formed->kind != m.kind ||
        (m.kind == core::EntryKind::node && formed->ino != top)) {
        return core::fail(
            EINVAL, fmt::format("'{}' would not form the same entry here (the layout rules differ)",
                                m.entry));
    }
    return {};
}

// The content of a blob the local db holds with `size` raw bytes, copied out of a
// snapshot; nullopt when it lacks it (or cannot read it: then the remote's copy is used).
std::optional<std::string> local_blob(const core::Store& store, const core::Digest& digest,
                                      std::uint64_t size) {
    auto txn = store.read();
    if (!txn) return std::nullopt;
    auto present = txn->has_blob(digest);
    if (!present || !*present) return std::nullopt;
    auto content = txn->read_blob(digest, size);
    if (!content) return std::nullopt;
    return std::string(content->bytes());
}

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
        auto replies = exec(server, batch);
        if (!replies) return tl::unexpected(replies.error());
        for (const Reply& r : *replies) {
            if (!r.is_ok()) return tl::unexpected(reply_error(server, r, "upload"));
        }
    }
    // The header last: a reader that finds it finds every chunk (unless evicted).
    auto header = exec(server, {{"SET", proto::blob_key(m_options.ns, digest),
                                 proto::encode(proto::BlobHeader{content.size(), chunks})}});
    if (!header) return tl::unexpected(header.error());
    if (!header->front().is_ok())
        return tl::unexpected(reply_error(server, header->front(), "upload"));
    return {};
}

Result<EntryResult> Remote::push(const core::Store& store, std::string_view name,
                                 std::string_view job_tag) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): nothing is pushed");
    if (!job_tag.empty()) {
        if (auto s = validate_job_tag(job_tag); !s) return tl::unexpected(s.error());
    }
    proto::Manifest m;
    std::map<core::Digest, std::string, DigestLess> blobs;  // not inlined, by digest
    EntryResult result;
    {  // the manifest and the contents, from one snapshot that ends here
        auto txn = store.read();
        if (!txn) return tl::unexpected(txn.error());
        auto entry = txn->find_entry(name);
        if (!entry) return tl::unexpected(entry.error());

        m.entry = entry->name;
        m.kind = entry->kind;
        m.stem = entry->stem;
        m.producer = entry->producer;
        m.created_ns = entry->created_ns;
        char host[256] = {};
        if (gethostname(host, sizeof host - 1) == 0) m.writer = host;
        if (entry->kind == core::EntryKind::node) {
            auto dir = txn->getattr(entry->ino);
            if (!dir) return tl::unexpected(dir.error());
            m.dir_mode = dir->mode & 07777;
        }
        std::vector<core::EntryFile> files;
        auto listed = txn->for_each_entry_file(*entry, [&](const core::EntryFile& f) {
            files.push_back(f);
            return true;
        });
        if (!listed) return tl::unexpected(listed.error());
        for (const core::EntryFile& f : files) {
            proto::Node n;
            n.path = f.path;
            n.type = f.attr.type();
            n.mode = f.attr.mode & 07777;
            n.mtime_ns = f.attr.mtime_ns;
            if (f.attr.is_symlink()) n.target = f.link_target;
            if (f.attr.is_regular()) {
                auto content = txn->read(f.attr.ino);
                if (!content) return tl::unexpected(core::with_context(content.error(), f.path));
                const std::string_view bytes = content->bytes();
                n.size = bytes.size();
                n.digest = f.attr.digest;
                n.inlined = bytes.size() <= proto::kInlineMax;
                if (n.inlined) {
                    n.content = std::string(bytes);
                } else if (!blobs.count(n.digest)) {
                    blobs.emplace(n.digest, std::string(bytes));
                }
                ++result.files;
                result.bytes += n.size;
            }
            m.nodes.push_back(std::move(n));
        }
    }

    const std::string mkey = proto::manifest_key(m_options.ns, m.entry);
    Server& mserver = shard(mkey);
    auto add_to_job = [&]() -> Status {
        if (job_tag.empty()) return {};
        const std::string jkey = proto::job_key(m_options.ns, job_tag);
        Server& js = shard(jkey);
        auto r = exec(js, {{"SADD", jkey, m.entry}});
        if (!r) return tl::unexpected(r.error());
        if (r->front().type != Reply::Type::integer)
            return tl::unexpected(reply_error(js, r->front(), "job set"));
        return {};
    };
    if (uploads_paused(mserver)) {
        return core::fail(
            ENOSPC,
            fmt::format("redis {}: uploads are paused after an OOM reply (the remote is full)",
                        mserver.id));
    }
    auto exists = exec(mserver, {{"EXISTS", mkey}});
    if (!exists) return tl::unexpected(exists.error());
    if (exists->front().type != Reply::Type::integer)
        return tl::unexpected(reply_error(mserver, exists->front(), "EXISTS"));
    if (exists->front().integer == 1) {
        if (auto s = add_to_job(); !s) return tl::unexpected(s.error());
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
        auto have = exec(*server, probes);
        if (!have) return tl::unexpected(have.error());
        for (std::size_t i = 0; i < digests.size(); ++i) {
            const Reply& r = (*have)[i];
            if (r.type != Reply::Type::integer)
                return tl::unexpected(reply_error(*server, r, "EXISTS"));
            if (r.integer == 1) continue;
            if (auto s = upload_blob(*server, digests[i], blobs.at(digests[i])); !s)
                return tl::unexpected(s.error());
        }
    }
    // Every blob is acknowledged: now the manifest, first writer wins.
    auto set = exec(mserver, {{"SET", mkey, proto::encode(m), "NX"}});
    if (!set) return tl::unexpected(set.error());
    const Reply& r = set->front();
    if (r.is_ok()) {
        m_counts.uploads.fetch_add(1);
        result.outcome = Outcome::uploaded;
    } else if (r.type == Reply::Type::nil) {
        m_counts.upload_skipped.fetch_add(1);
        result.outcome = Outcome::already_remote;
    } else {
        return tl::unexpected(reply_error(mserver, r, "manifest"));
    }
    if (auto s = add_to_job(); !s) return tl::unexpected(s.error());
    return result;
}

Result<std::string> Remote::fetch_blob(Server& server, const core::Digest& digest,
                                       std::uint64_t size, EntryResult& result) {
    const std::string bkey = proto::blob_key(m_options.ns, digest);
    auto dangling = [&](std::string why) -> Result<std::string> {
        result.outcome = Outcome::dangling;
        result.detail = fmt::format("blob {} {}", digest.hex(), why);
        return std::string();
    };
    auto corrupt = [&](std::string why) -> Result<std::string> {
        result.outcome = Outcome::corrupt;
        result.detail = fmt::format("blob {}: {}", digest.hex(), why);
        if (!m_options.read_only) {  // dropped, so that the next push uploads it again
            Command del{"DEL", bkey};
            for (std::uint32_t i = 0; i < proto::chunk_count(size); ++i)
                del.push_back(proto::chunk_key(m_options.ns, digest, i));
            (void)exec(server, {del});  // best effort: a failure is counted by exec
        }
        return std::string();
    };
    auto header_reply = exec(server, {{"GET", bkey}});
    if (!header_reply) return tl::unexpected(header_reply.error());
    const Reply& hr = header_reply->front();
    if (hr.type == Reply::Type::nil) return dangling("is gone");
    if (hr.type != Reply::Type::string) return tl::unexpected(reply_error(server, hr, "GET"));
    auto header = proto::decode_blob_header(hr.str);
    if (!header) return corrupt(header.error().message);
    if (header->raw_size != size) return corrupt("its size differs from the manifest's");
    std::string content;
    content.reserve(size);
    for (std::uint32_t first = 0; first < header->chunks; first += kChunksPerRoundTrip) {
        std::vector<Command> batch;
        const std::uint32_t end =
            std::min<std::uint32_t>(header->chunks, first + kChunksPerRoundTrip);
        for (std::uint32_t i = first; i < end; ++i)
            batch.push_back({"GET", proto::chunk_key(m_options.ns, digest, i)});
        auto replies = exec(server, batch);
        if (!replies) return tl::unexpected(replies.error());
        for (std::uint32_t i = first; i < end; ++i) {
            const Reply& r = (*replies)[i - first];
            if (r.type == Reply::Type::nil) return dangling(fmt::format("has lost chunk {}", i));
            if (r.type != Reply::Type::string) return tl::unexpected(reply_error(server, r, "GET"));
            const std::size_t raw = std::min<std::uint64_t>(
                proto::kChunkBytes, size - std::uint64_t{i} * proto::kChunkBytes);
            if (auto s = proto::decode_chunk(r.str, raw, content); !s)
                return corrupt(fmt::format("chunk {}: {}", i, s.error().message));
        }
    }
    if (!(core::digest_of(content) == digest)) return corrupt("content does not match its digest");
    return content;
}

Result<EntryResult> Remote::pull(core::Store& store, std::string_view name) {
    EntryResult result;
    {
        auto txn = store.read();
        if (!txn) return tl::unexpected(txn.error());
        auto local = txn->find_entry(name);
        if (local && local->files > 0) {
            result.outcome = Outcome::already_local;
            result.files = local->files;
            result.bytes = local->bytes;
            return result;
        }
        if (!local && local.error().code != ENOENT) return tl::unexpected(local.error());
    }
    const std::string mkey = proto::manifest_key(m_options.ns, name);
    Server& mserver = shard(mkey);
    auto got = exec(mserver, {{"GET", mkey}});
    if (!got) return tl::unexpected(got.error());
    const Reply& mr = got->front();
    if (mr.type == Reply::Type::nil) {
        m_counts.misses.fetch_add(1);
        result.outcome = Outcome::miss;
        return result;
    }
    if (mr.type != Reply::Type::string) return tl::unexpected(reply_error(mserver, mr, "GET"));
    auto manifest = proto::decode_manifest(mr.str);
    Status checked =
        manifest ? check_manifest(*manifest, name) : Status(tl::unexpected(manifest.error()));
    if (!checked) {
        // A manifest that fails its checksum or names anything it must not is dropped
        // like a corrupt blob; SET NX would otherwise keep it there for good.
        m_counts.corrupt.fetch_add(1);
        if (!m_options.read_only) (void)exec(mserver, {{"DEL", mkey}});
        result.outcome = Outcome::corrupt;
        result.detail = "manifest: " + checked.error().message;
        return result;
    }
    std::map<core::Digest, std::string, DigestLess> blobs;
    for (const proto::Node& n : manifest->nodes) {
        if (n.type != core::FileType::regular) continue;
        ++result.files;
        result.bytes += n.size;
        if (n.inlined || n.size == 0 || blobs.count(n.digest)) continue;
        // A blob the db already holds (another entry's file, an earlier version) is
        // copied from it, not fetched: a short snapshot per blob, none held across I/O.
        if (auto local = local_blob(store, n.digest, n.size)) {
            blobs.emplace(n.digest, std::move(*local));
            continue;
        }
        auto content =
            fetch_blob(shard(proto::blob_key(m_options.ns, n.digest)), n.digest, n.size, result);
        if (!content) return tl::unexpected(content.error());
        if (result.outcome == Outcome::dangling) {
            m_counts.dangling.fetch_add(1);
            m_counts.misses.fetch_add(1);
            // Useless without its blob, and SET NX would keep a fresh copy out: dropped,
            // so the next push of the entry uploads it whole.
            if (!m_options.read_only) (void)exec(mserver, {{"DEL", mkey}});
            return result;
        }
        if (result.outcome == Outcome::corrupt) {
            m_counts.corrupt.fetch_add(1);
            return result;
        }
        blobs.emplace(n.digest, std::move(*content));
    }
    // Everything is here and verified: one transaction, nothing of it on any failure.
    auto txn = store.write();
    if (!txn) return tl::unexpected(txn.error());
    if (auto local = txn->find_entry(name); local && local->files > 0) {  // pulled meanwhile
        result.outcome = Outcome::already_local;
        return result;
    }
    if (auto s = write_entry(*txn, *manifest, blobs); !s)
        return tl::unexpected(core::with_context(s.error(), std::string(name)));
    if (auto s = txn->commit(); !s) return tl::unexpected(s.error());
    m_counts.hits.fetch_add(1);
    result.outcome = Outcome::pulled;
    return result;
}

Result<std::vector<std::string>> Remote::job_entries(std::string_view job_tag) {
    if (auto s = validate_job_tag(job_tag); !s) return tl::unexpected(s.error());
    const std::string jkey = proto::job_key(m_options.ns, job_tag);
    Server& server = shard(jkey);
    auto r = exec(server, {{"SMEMBERS", jkey}});
    if (!r) return tl::unexpected(r.error());
    const Reply& set = r->front();
    if (set.type != Reply::Type::array) return tl::unexpected(reply_error(server, set, "SMEMBERS"));
    std::vector<std::string> names;
    for (const Reply& e : set.elements) {
        if (e.type == Reply::Type::string) names.push_back(e.str);
    }
    std::sort(names.begin(), names.end());
    return names;
}

PullSummary Remote::pull_entries(core::Store& store, const std::vector<std::string>& entries,
                                 const PullProgress& progress) {
    PullSummary summary;
    for (const std::string& name : entries) {
        auto result = pull(store, name);
        if (!result) {
            ++summary.failed;
        } else if (result->outcome == Outcome::pulled) {
            ++summary.pulled;
            summary.pulled_bytes += result->bytes;
        } else if (result->outcome == Outcome::already_local) {
            ++summary.already_local;
        } else {
            ++summary.missing;
        }
        if (progress && !progress(name, result)) break;
    }
    return summary;
}

Result<PullSummary> Remote::pull_job(core::Store& store, std::string_view job_tag,
                                     const PullProgress& progress) {
    auto names = job_entries(job_tag);
    if (!names) return tl::unexpected(names.error());
    return pull_entries(store, *names, progress);
}

Result<bool> Remote::acquire_lease(std::string_view entry, std::string_view owner,
                                   std::int64_t ttl_ms) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): no lease");
    Server& server = shard(proto::manifest_key(m_options.ns, entry));
    auto replies = exec(server, {{"SET", proto::lease_key(m_options.ns, entry), std::string(owner),
                                  "NX", "PX", std::to_string(std::max<std::int64_t>(ttl_ms, 1))}});
    if (!replies) return tl::unexpected(replies.error());
    const Reply& r = replies->front();
    if (r.is_ok()) return true;
    if (r.type == Reply::Type::nil) return false;  // held by another
    return tl::unexpected(reply_error(server, r, "lease"));
}

Status Remote::release_lease(std::string_view entry, std::string_view owner) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): no lease");
    Server& server = shard(proto::manifest_key(m_options.ns, entry));
    // Compare and delete in one step: a lease that expired and was taken by another
    // node meanwhile is theirs.
    static const char* const kScript =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
        "else return 0 end";
    auto replies =
        exec(server,
             {{"EVAL", kScript, "1", proto::lease_key(m_options.ns, entry), std::string(owner)}});
    if (!replies) return tl::unexpected(replies.error());
    const Reply& r = replies->front();
    if (r.type != Reply::Type::integer) return tl::unexpected(reply_error(server, r, "lease"));
    return {};
}

Result<bool> Remote::lease_held(std::string_view entry) {
    Server& server = shard(proto::manifest_key(m_options.ns, entry));
    auto replies = exec(server, {{"EXISTS", proto::lease_key(m_options.ns, entry)}});
    if (!replies) return tl::unexpected(replies.error());
    const Reply& r = replies->front();
    if (r.type != Reply::Type::integer) return tl::unexpected(reply_error(server, r, "lease"));
    return r.integer > 0;
}

}  // namespace kcache::remote
