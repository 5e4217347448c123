// Pulling entries in batches: the manifests of a batch in one pipeline per server, the
// blobs they lack (header and chunks together) in pipelines of about 8 MiB, every digest
// checked, then whole entries written a few to a transaction (about 8 MiB). pull() is a
// batch of one.
//
// No LMDB write transaction is ever open while waiting on Redis: a batch fetches and
// checks everything first; the local db is read from short snapshots.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>
#include <unordered_map>

#include <fmt/core.h>

#include "client.hpp"
#include "kcache/core/entry_image.hpp"
#include "kcache/core/frames.hpp"
#include "kcache/remote/remote.hpp"
#include "protocol.hpp"
#include "server.hpp"
#include "signing.hpp"

namespace kcache::remote {

// One entry of a batch on its way.
struct Remote::PullItem {
    std::string name;
    std::optional<Result<EntryResult>> done;  // set once the entry's outcome is known
    EntryResult result;
    std::optional<proto::Manifest> manifest;
    std::uint64_t blob_bytes = 0;  // of its files that are not inlined
};

// A blob that a batch's entries need and the local db lacks.
struct Remote::Wanted {
    core::Digest digest;
    std::uint64_t size = 0;
    Server* server = nullptr;
    std::string content;  // the raw bytes, as they arrive (a frame's: once checked)
    // A blob sent as its pusher's stored frame (proto::FrameValue): the frame, and the
    // digest of the dictionary it needs (empty: none). Its content is checked, and the
    // frame then stored as it is (core::offer_frame).
    std::string frame;
    core::Digest dictionary;
    enum class State : std::uint8_t {
        fetching,
        framed,  // a frame came: its dictionary and content are checked next
        ok,
        dangling,
        corrupt,
        failed
    } state = State::fetching;
    std::string detail;                // dangling, corrupt
    std::optional<core::Error> error;  // failed
    bool header_seen = false;
    std::uint32_t chunks = 0;      // chunk_count(size)
    std::uint32_t next_chunk = 0;  // the first chunk not asked for yet
    std::uint32_t next_reply = 0;  // the first chunk not received yet
    bool drop_manifest = false;    // a frame's fault: its manifests go with it
};

namespace {

constexpr std::uint64_t kBytesPerRoundTrip = std::uint64_t{8} << 20;  // one pipeline's chunks
// Blob bytes that one group of a batch holds in memory before it is written (at least one
// entry's, whatever its size).
constexpr std::uint64_t kBytesPerGroup = std::uint64_t{64} << 20;
// Entries' bytes that one write transaction takes, at most (at least one entry): bounds
// how long a pull holds the db's write lock against the daemon's own writers.
constexpr std::uint64_t kBytesPerTransaction = std::uint64_t{8} << 20;

// Blob contents by digest: local copies, or the fetched ones.
using BlobContents = std::map<core::Digest, const std::string*, proto::DigestLess>;

// Everything a hostile manifest could get wrong about names, checked before any blob is
// fetched: the image's rules (core::check_image, those of a bundle too), and the
// protocol's own: the entry asked for, with files.
Status check_manifest(const proto::Manifest& m, std::string_view asked) {
    if (m.name != asked)
        return core::fail(EINVAL, fmt::format("the manifest names another entry, '{}'", m.name));
    if (m.files.empty()) return core::fail(EINVAL, "the manifest has no files");
    return core::check_image(m);
}

// A checked manifest's modes as a pull writes them: set-uid, set-gid and sticky bits
// dropped (a pulled file runs as whoever runs it).
void drop_special_bits(proto::Manifest& m) {
    m.dir_mode &= 0777;
    for (core::ImageFile& f : m.files) f.mode &= 0777;
}

// The writer an entry records (Origin::fleet): the manifest's host, and for a signed
// entry '#' and its signer's key id (what `kcache show` names and `kcache evict --signer`
// finds). A '#' in the host is replaced, so that no writer can name a signer it is not:
// the host is cut so that the id always fits (Origin::fleet keeps 48 bytes).
std::string recorded_writer(const proto::Manifest& m, std::string_view signer) {
    std::string host = m.writer.substr(0, signer.empty() ? m.writer.size() : 31);
    std::replace(host.begin(), host.end(), '#', '?');
    if (signer.empty()) return host;
    return host + "#" + std::string(signer);
}

// Writes the checked manifest's files with their verified contents (core::write_image).
// The caller commits or drops the transaction.
Status write_entry(core::WriteTxn& txn, const proto::Manifest& m, const BlobContents& blobs,
                   std::string_view signer) {
    core::ImageWrite how;
    // compiled there: a hit of the fleet here
    how.origin = core::Origin::fleet(recorded_writer(m, signer));
    how.content = [&](const core::ImageFile& f) -> std::optional<std::string_view> {
        auto it = blobs.find(f.digest);
        if (it == blobs.end()) return std::nullopt;
        return std::string_view(*it->second);
    };
    return core::write_image(txn, m, how);
}

}  // namespace

// signing.hpp
Rejection check_signature(const proto::Manifest& m, std::string_view ns, const TrustFile* trust,
                          std::string& detail, std::string& signer) {
    if (!m.signature) {
        if (!trust) return Rejection::none;
        detail = "the entry is not signed, and only signed entries are trusted here";
        return Rejection::unsigned_entry;
    }
    PublicKey key;
    std::copy(m.signature->key.begin(), m.signature->key.end(), key.raw.begin());
    if (trust) {
        const TrustedKey* known = trust->find(key);
        if (!known) {
            detail = fmt::format("signed by key {}, which the trust file does not name", key.id());
            return Rejection::untrusted;
        }
        if (known->revoked) {
            detail = fmt::format("signed by key {}{}, which the trust file revokes", key.id(),
                                 known->name.empty() ? "" : " (" + known->name + ")");
            return Rejection::revoked;
        }
    }
    auto statement = proto::signed_statement(ns, m);
    if (!statement || !verify_signature(key, *statement, m.signature->signature)) {
        detail = fmt::format(
            "the signature of key {} does not hold for entry '{}' in namespace {} (altered "
            "after signing, or signed for another name or namespace)",
            key.id(), m.name, ns);
        return Rejection::bad;
    }
    signer = key.id();
    return Rejection::none;
}

namespace {

// Every regular file of a signed manifest against its signed SHA-256, with the bytes
// about to be written (carried, fetched or local): empty when all match, else which.
std::string check_contents(const proto::Manifest& m, const BlobContents& blobs) {
    if (!m.signature) return {};
    std::size_t k = 0;
    for (const proto::Node& n : m.files) {
        if (n.type != core::FileType::regular) continue;
        std::string_view bytes;
        if (n.has_content) {
            bytes = n.content;
        } else if (n.size != 0) {
            auto it = blobs.find(n.digest);
            if (it == blobs.end()) return fmt::format("file {} has no content", n.path);
            bytes = *it->second;
        }
        if (sha256(bytes) != m.signature->sha256[k++]) {
            return fmt::format(
                "file {} differs from its signed SHA-256 (swapped under a valid "
                "manifest)",
                n.path);
        }
    }
    return {};
}

}  // namespace

void Remote::reject(PullItem& item, Rejection why, std::string detail) {
    m_counts.misses.fetch_add(1);
    switch (why) {
        case Rejection::unsigned_entry:
            m_counts.rejected_unsigned.fetch_add(1);
            break;
        case Rejection::untrusted:
            m_counts.rejected_untrusted.fetch_add(1);
            break;
        case Rejection::revoked:
            m_counts.rejected_revoked.fetch_add(1);
            break;
        case Rejection::bad:
        case Rejection::none:
            m_counts.rejected_bad.fetch_add(1);
            break;
    }
    item.result.outcome = Outcome::rejected;
    item.result.rejection = why;
    item.result.detail = fmt::format("{}: {}", rejection_name(why), detail);
    item.done = item.result;
}

void Remote::fetch_blobs(std::vector<Wanted*>& blobs) {
    std::map<Server*, std::vector<Wanted*>> by_server;
    for (Wanted* w : blobs) by_server[w->server].push_back(w);
    for (auto& [server, wanted] : by_server) {
        std::vector<Command> dels;  // corrupt blobs, dropped so that the next push sends them
        auto finished = [&](Wanted& w, Wanted::State state, std::string detail) {
            w.state = state;
            w.detail = std::move(detail);
            w.content.clear();
            w.content.shrink_to_fit();
            if (state == Wanted::State::corrupt && !m_options.read_only) {
                Command del{"DEL", proto::blob_key(m_options.ns, w.digest)};
                for (std::uint32_t i = 0; i < w.chunks; ++i)
                    del.push_back(proto::chunk_key(m_options.ns, w.digest, i));
                dels.push_back(std::move(del));
            }
        };
        std::size_t first = 0;  // the first blob not fully asked for
        while (first < wanted.size()) {
            // One pipeline: each blob's header with its first chunks, up to about 8 MiB.
            std::vector<Command> batch;
            std::vector<std::pair<Wanted*, std::int64_t>> asked;  // blob, chunk (-1: header)
            std::uint64_t bytes = 0;
            for (std::size_t i = first; i < wanted.size() && bytes < kBytesPerRoundTrip; ++i) {
                Wanted& w = *wanted[i];
                if (w.state != Wanted::State::fetching) {
                    if (i == first) ++first;
                    continue;
                }
                if (!w.header_seen && w.next_chunk == 0) {
                    batch.push_back({"GET", proto::blob_key(m_options.ns, w.digest)});
                    asked.emplace_back(&w, -1);
                }
                while (w.next_chunk < w.chunks && bytes < kBytesPerRoundTrip) {
                    batch.push_back(
                        {"GET", proto::chunk_key(m_options.ns, w.digest, w.next_chunk)});
                    asked.emplace_back(&w, w.next_chunk);
                    bytes += std::min<std::uint64_t>(
                        proto::kChunkBytes,
                        w.size - std::uint64_t{w.next_chunk} * proto::kChunkBytes);
                    ++w.next_chunk;
                }
                if (w.next_chunk == w.chunks && i == first) ++first;
            }
            if (batch.empty()) break;
            auto replies = exec(*server, batch);
            if (!replies) {
                for (Wanted* w : wanted) {
                    if (w->state != Wanted::State::fetching) continue;
                    w->state = Wanted::State::failed;
                    w->error = replies.error();
                }
                break;
            }
            for (std::size_t k = 0; k < asked.size(); ++k) {
                auto [wp, chunk] = asked[k];
                Wanted& w = *wp;
                const Reply& r = (*replies)[k];
                if (w.state != Wanted::State::fetching) continue;
                if (chunk < 0) {
                    if (r.type == Reply::Type::nil) {
                        finished(w, Wanted::State::dangling,
                                 fmt::format("blob {} is gone", w.digest.hex()));
                        continue;
                    }
                    if (r.type != Reply::Type::string) {
                        w.state = Wanted::State::failed;
                        w.error = reply_error(*server, r, "GET");
                        continue;
                    }
                    if (proto::is_frame(r.str)) {
                        auto frame = proto::decode_frame(r.str);
                        if (!frame || frame->raw_size != w.size) {
                            w.drop_manifest = true;
                            w.chunks = 0;
                            finished(w, Wanted::State::corrupt,
                                     fmt::format("blob {}: {}", w.digest.hex(),
                                                 frame ? "its size differs from the manifest's"
                                                       : frame.error().message));
                            continue;
                        }
                        w.frame.assign(frame->frame);
                        w.dictionary = frame->dictionary;
                        w.chunks = 0;  // the chunk asked with it is not there
                        w.header_seen = true;
                        w.state = Wanted::State::framed;
                        continue;
                    }
                    auto header = proto::decode_blob_header(r.str);
                    std::string why;
                    if (!header) {
                        why = header.error().message;
                    } else if (header->raw_size != w.size) {
                        why = "its size differs from the manifest's";
                    } else if (header->chunks != w.chunks) {
                        why = "its chunk count differs from its size's";
                    }
                    if (!why.empty()) {
                        finished(w, Wanted::State::corrupt,
                                 fmt::format("blob {}: {}", w.digest.hex(), why));
                        continue;
                    }
                    w.header_seen = true;
                    w.content.reserve(w.size);
                    continue;
                }
                const auto i = static_cast<std::uint32_t>(chunk);
                if (r.type == Reply::Type::nil) {
                    finished(w, Wanted::State::dangling,
                             fmt::format("blob {} has lost chunk {}", w.digest.hex(), i));
                    continue;
                }
                if (r.type != Reply::Type::string) {
                    w.state = Wanted::State::failed;
                    w.error = reply_error(*server, r, "GET");
                    continue;
                }
                const std::size_t raw = std::min<std::uint64_t>(
                    proto::kChunkBytes, w.size - std::uint64_t{i} * proto::kChunkBytes);
                if (auto s = proto::decode_chunk(r.str, raw, w.content); !s) {
                    finished(
                        w, Wanted::State::corrupt,
                        fmt::format("blob {}: chunk {}: {}", w.digest.hex(), i, s.error().message));
                    continue;
                }
                w.next_reply = i + 1;
                if (w.next_reply == w.chunks) {
                    if (core::digest_of(w.content) == w.digest) {
                        w.state = Wanted::State::ok;
                    } else {
                        finished(w, Wanted::State::corrupt,
                                 fmt::format("blob {}: content does not match its digest",
                                             w.digest.hex()));
                    }
                }
            }
        }
        if (!dels.empty()) (void)exec(*server, dels);  // best effort: a failure is counted by exec
    }
}

namespace {

// Dictionary `bytes` (with whatever id it carries) decompressing `w`'s frame, which names
// its pusher's id: the frame is given the dictionary's id first. The content, or why not.
Result<std::string> content_of_frame(const std::string& frame, std::string_view dictionary,
                                     std::uint64_t size) {
    if (dictionary.size() < 8) return core::decompress_frame(frame, dictionary, size);
    std::uint32_t id = 0;
    for (std::size_t i = 0; i < 4; ++i)
        id |= std::uint32_t{static_cast<unsigned char>(dictionary[4 + i])} << (8 * i);
    const std::string named = KCACHE_TRY(core::with_frame_dictionary(frame, id));
    return core::decompress_frame(named, dictionary, size);
}

}  // namespace

struct Remote::FrameDictionaries {
    std::map<core::Digest, std::string, proto::DigestLess> by_digest;
};

void Remote::resolve_frames(core::Store& store, std::vector<Wanted*>& blobs,
                            FrameDictionaries& dictionaries) {
    // The dictionaries the frames need: this db's own when it has them (by digest), else
    // from Redis, one pipeline per server.
    std::map<core::Digest, std::optional<std::string>, proto::DigestLess> needed;  // nullopt: gone
    std::map<core::Digest, std::string, proto::DigestLess> bad;  // why, for corrupt ones
    std::map<core::Digest, core::Error, proto::DigestLess> failed;
    for (const Wanted* w : blobs) {
        if (w->state == Wanted::State::framed && !w->dictionary.empty())
            needed.emplace(w->dictionary, std::nullopt);
    }
    if (needed.empty() && std::none_of(blobs.begin(), blobs.end(), [](const Wanted* w) {
            return w->state == Wanted::State::framed;
        }))
        return;
    if (!needed.empty()) {
        if (auto txn = store.read()) {
            if (auto ids = core::dictionary_ids(*txn)) {
                for (const auto& [digest, id] : *ids) {
                    auto it = needed.find(digest);
                    if (it == needed.end() || it->second) continue;
                    if (auto bytes = core::read_dictionary(*txn, id))
                        it->second = std::move(*bytes);
                }
            }
        }
    }
    std::map<Server*, std::vector<core::Digest>> by_server;
    for (const auto& [digest, bytes] : needed) {
        if (!bytes)
            by_server[&shard(proto::dictionary_key(m_options.ns, digest))].push_back(digest);
    }
    for (const auto& [server, digests] : by_server) {
        std::vector<Command> gets;
        for (const core::Digest& d : digests)
            gets.push_back({"GET", proto::dictionary_key(m_options.ns, d)});
        auto replies = exec(*server, gets);
        std::vector<Command> dels;  // dictionaries that fail their digest
        for (std::size_t i = 0; i < digests.size(); ++i) {
            if (!replies) {
                failed.emplace(digests[i], replies.error());
                continue;
            }
            const Reply& r = (*replies)[i];
            if (r.type == Reply::Type::nil) continue;  // gone (evicted): a clean miss
            if (r.type != Reply::Type::string) {
                failed.emplace(digests[i], reply_error(*server, r, "GET"));
                continue;
            }
            auto bytes = proto::decode_dictionary(r.str, digests[i]);
            if (!bytes) {
                bad.emplace(digests[i], bytes.error().message);
                dels.push_back({"DEL", proto::dictionary_key(m_options.ns, digests[i])});
                continue;
            }
            needed[digests[i]] = std::string(*bytes);
        }
        if (!dels.empty() && !m_options.read_only) (void)exec(*server, dels);
    }

    // Every frame checked against its blob's digest; a fault drops the frame from Redis
    // (and its manifests, pull_group), so that the next push sends both again.
    std::map<Server*, std::vector<Command>> dels;
    for (Wanted* wp : blobs) {
        Wanted& w = *wp;
        if (w.state != Wanted::State::framed) continue;
        auto fault = [&](Wanted::State state, std::string detail) {
            w.state = state;
            w.detail = std::move(detail);
            w.drop_manifest = true;
            w.frame.clear();
            dels[w.server].push_back({"DEL", proto::blob_key(m_options.ns, w.digest)});
        };
        std::string_view dictionary;
        if (!w.dictionary.empty()) {
            if (auto f = failed.find(w.dictionary); f != failed.end()) {
                w.state = Wanted::State::failed;
                w.error = f->second;
                continue;
            }
            if (auto b = bad.find(w.dictionary); b != bad.end()) {
                fault(Wanted::State::corrupt,
                      fmt::format("blob {}: {}", w.digest.hex(), b->second));
                continue;
            }
            const auto& bytes = needed.at(w.dictionary);
            if (!bytes) {
                fault(Wanted::State::dangling, fmt::format("blob {}: its dictionary {} is gone",
                                                           w.digest.hex(), w.dictionary.hex()));
                continue;
            }
            dictionary = *bytes;
        }
        auto content = content_of_frame(w.frame, dictionary, w.size);
        if (!content || !(core::digest_of(*content) == w.digest)) {
            fault(Wanted::State::corrupt, fmt::format("blob {}: {}", w.digest.hex(),
                                                      content ? "content does not match its digest"
                                                              : content.error().message));
            continue;
        }
        w.content = std::move(*content);
        w.state = Wanted::State::ok;
    }
    if (!m_options.read_only) {
        for (const auto& [server, commands] : dels) (void)exec(*server, commands);
    }
    for (auto& [digest, bytes] : needed) {
        if (bytes) dictionaries.by_digest.emplace(digest, std::move(*bytes));
    }
}

// Marks the batch's entries the db has already: they are not asked for.
void Remote::mark_local(core::Store& store, std::vector<PullItem>& items) {
    auto txn = store.read();
    for (PullItem& item : items) {
        if (!txn) {
            item.done = tl::unexpected(txn.error());
            continue;
        }
        auto local = txn->find_entry(item.name);
        if (local && local->files > 0) {
            item.result.outcome = Outcome::already_local;
            item.result.files = local->files;
            item.result.bytes = local->bytes;
            item.done = item.result;
        } else if (!local && local.error().code != ENOENT) {
            item.done = tl::unexpected(local.error());
        }
    }
}

// Fetches the manifests of the entries not done yet, one pipeline per server, each
// decoded and checked (check_manifest) before any blob is fetched; a manifest that fails
// is dropped from Redis and its entry is done (corrupt), a missing one a miss.
void Remote::fetch_manifests(std::vector<PullItem>& items, const LeaseAsk* lease) {
    // With a lease asked for: after each GET, a script on the same node (the manifest and
    // the lease share the entry's hash tag) that takes the lease only while the manifest
    // is absent: 1 taken, 0 held by another, -1 the manifest is there (nothing taken).
    static const char* const kLeaseIfMissing =
        "if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end "
        "if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end "
        "return 0";
    if (lease && m_options.read_only) lease = nullptr;
    const std::size_t per_item = lease ? 2 : 1;
    std::map<Server*, std::vector<PullItem*>> by_server;
    for (PullItem& item : items) {
        if (!item.done)
            by_server[&shard(proto::manifest_key(m_options.ns, item.name))].push_back(&item);
    }
    for (auto& [server, asked] : by_server) {
        std::vector<Command> gets;
        for (const PullItem* item : asked) {
            const std::string mkey = proto::manifest_key(m_options.ns, item->name);
            gets.push_back({"GET", mkey});
            if (lease) {
                gets.push_back({"EVAL", kLeaseIfMissing, "2", mkey,
                                proto::lease_key(m_options.ns, item->name), lease->owner,
                                std::to_string(std::max<std::int64_t>(lease->ttl_ms, 1))});
            }
        }
        auto replies = exec(*server, gets);
        if (!replies) {
            for (PullItem* item : asked) item->done = tl::unexpected(replies.error());
            continue;
        }
        std::vector<Command> dels;  // manifests that failed their checks
        for (std::size_t k = 0; k < asked.size(); ++k) {
            PullItem& item = *asked[k];
            const Reply& mr = (*replies)[k * per_item];
            if (mr.type == Reply::Type::nil) {
                m_counts.misses.fetch_add(1);
                item.result.outcome = Outcome::miss;
                if (lease) {  // a failed script leaves it undecided: a plain miss
                    const Reply& lr = (*replies)[k * per_item + 1];
                    if (lr.type == Reply::Type::integer && lr.integer >= 0)
                        item.result.lease_taken = lr.integer == 1;
                }
                item.done = item.result;
                continue;
            }
            if (mr.type != Reply::Type::string) {
                item.done = tl::unexpected(reply_error(*server, mr, "GET"));
                continue;
            }
            auto manifest = proto::decode_manifest(mr.str);
            Status checked = manifest ? check_manifest(*manifest, item.name)
                                      : Status(tl::unexpected(manifest.error()));
            if (!checked) {
                // A manifest that fails its checksum or names anything it must not is
                // dropped like a corrupt blob; SET NX would otherwise keep it for good.
                m_counts.corrupt.fetch_add(1);
                dels.push_back({"DEL", proto::manifest_key(m_options.ns, item.name)});
                item.result.outcome = Outcome::corrupt;
                item.result.detail = "manifest: " + checked.error().message;
                item.done = item.result;
                continue;
            }
            {
                std::string detail, signer;
                const Rejection why = check_signature(
                    *manifest, m_options.ns, m_trust ? &*m_trust : nullptr, detail, signer);
                if (why != Rejection::none) {
                    // Left in Redis: another node may trust what this one refuses.
                    reject(item, why, std::move(detail));
                    continue;
                }
                item.result.signer = std::move(signer);
            }
            for (const proto::Node& n : manifest->files) {
                if (n.type != core::FileType::regular) continue;
                ++item.result.files;
                item.result.bytes += n.size;
                if (!n.has_content) item.blob_bytes += n.size;
            }
            drop_special_bits(*manifest);
            item.manifest = std::move(*manifest);
        }
        if (!dels.empty() && !m_options.read_only) (void)exec(*server, dels);
    }
}

// Fetches the blobs of items [first, last) that the db lacks (a blob it holds is copied
// from it), then writes the verified entries, a few to a transaction; each entry is
// reported through `report_through` once written or failed. False: stopped.
bool Remote::pull_group(core::Store& store, std::vector<PullItem>& items, std::size_t first,
                        std::size_t last, const std::function<bool(std::size_t)>& report_through) {
    std::map<core::Digest, Wanted, proto::DigestLess> wanted;
    std::map<core::Digest, std::string, proto::DigestLess> local;
    {
        // A blob the db already holds (another entry's file, an earlier version)
        // is copied from it, not fetched (if it cannot be read, it is fetched).
        auto txn = store.read();
        for (std::size_t i = first; i < last; ++i) {
            if (items[i].done) continue;
            for (const proto::Node& n : items[i].manifest->files) {
                if (n.type != core::FileType::regular || n.has_content || n.size == 0 ||
                    local.count(n.digest) || wanted.count(n.digest))
                    continue;
                if (txn) {
                    auto present = txn->has_blob(n.digest);
                    if (present && *present) {
                        if (auto content = txn->read_blob(n.digest, n.size)) {
                            local.emplace(n.digest, std::string(content->bytes()));
                            continue;
                        }
                    }
                }
                Wanted& w = wanted[n.digest];
                w.digest = n.digest;
                w.size = n.size;
                w.chunks = proto::chunk_count(n.size);
                w.server = &shard(proto::blob_key(m_options.ns, n.digest));
            }
        }
    }
    std::vector<Wanted*> fetch;
    for (auto& [digest, w] : wanted) fetch.push_back(&w);
    fetch_blobs(fetch);
    FrameDictionaries dictionaries;  // the frames' dictionaries
    resolve_frames(store, fetch, dictionaries);

    std::map<Server*, std::vector<Command>> dels;  // dangling manifests
    std::vector<std::size_t> ready;                // verified, to be written
    std::vector<BlobContents> contents(last - first);
    for (std::size_t i = first; i < last; ++i) {
        PullItem& item = items[i];
        if (item.done) continue;
        const Wanted* bad = nullptr;
        for (const proto::Node& n : item.manifest->files) {
            if (n.type != core::FileType::regular || n.has_content || n.size == 0) continue;
            if (auto l = local.find(n.digest); l != local.end()) {
                contents[i - first][n.digest] = &l->second;
                continue;
            }
            const Wanted& w = wanted.at(n.digest);
            if (w.state != Wanted::State::ok) {
                bad = &w;
                break;
            }
            contents[i - first][n.digest] = &w.content;
        }
        if (!bad) {
            // Signed: every file's bytes against the SHA-256 the key signed, before any
            // byte of the entry is written.
            if (std::string fault = check_contents(*item.manifest, contents[i - first]);
                !fault.empty()) {
                reject(item, Rejection::bad, std::move(fault));
                continue;
            }
            ready.push_back(i);
        } else if (bad->state == Wanted::State::failed) {
            item.done = tl::unexpected(*bad->error);
        } else {
            item.result.detail = bad->detail;
            if (bad->state == Wanted::State::dangling) {
                m_counts.dangling.fetch_add(1);
                m_counts.misses.fetch_add(1);
                item.result.outcome = Outcome::dangling;
            } else {
                m_counts.corrupt.fetch_add(1);
                item.result.outcome = Outcome::corrupt;
            }
            if (bad->state == Wanted::State::dangling || bad->drop_manifest) {
                // Useless without its blob, and SET NX would keep a fresh copy out:
                // dropped, so the next push of the entry uploads it whole.
                const std::string mkey = proto::manifest_key(m_options.ns, item.name);
                dels[&shard(mkey)].push_back({"DEL", mkey});
            }
            item.done = item.result;
        }
    }
    if (!m_options.read_only) {
        for (const auto& [server, commands] : dels) (void)exec(*server, commands);
    }

    // Everything is here and verified: whole entries, a few to a transaction (one
    // commit, one sync, one hold of the write lock of at most kBytesPerTransaction),
    // nothing of an entry on any failure. An entry whose write fails undoes its
    // transaction: those entries are then written one per transaction.
    auto write = [&](std::size_t i, core::WriteTxn& txn, core::DictionaryIds& ids) -> Status {
        PullItem& item = items[i];
        if (auto had = txn.find_entry(item.name); had && had->files > 0) {
            item.result.outcome = Outcome::already_local;  // pulled meanwhile
            return {};
        }
        // Frames are stored as they came (their dictionary's id made this db's), each
        // taken by its file's write just below, in this transaction.
        for (const proto::Node& n : item.manifest->files) {
            if (n.type != core::FileType::regular || n.has_content || n.size == 0) continue;
            auto w = wanted.find(n.digest);
            if (w == wanted.end() || w->second.frame.empty()) continue;
            core::PulledFrame pulled;
            pulled.digest = n.digest;
            pulled.raw_size = n.size;
            pulled.frame = w->second.frame;
            if (!w->second.dictionary.empty())
                pulled.dictionary = dictionaries.by_digest.at(w->second.dictionary);
            pulled.name = std::string_view(n.path).substr(n.path.rfind('/') + 1);
            pulled.producer = item.manifest->producer;
            if (auto s = core::offer_frame(txn, pulled, ids); !s)
                return tl::unexpected(core::with_context(s.error(), item.name));
        }
        if (auto s = write_entry(txn, *item.manifest, contents[i - first], item.result.signer); !s)
            return tl::unexpected(core::with_context(s.error(), item.name));
        item.result.outcome = Outcome::pulled;
        return {};
    };
    auto write_together = [&](std::size_t from, std::size_t to) -> Status {
        auto txn = KCACHE_TRY(store.write());
        auto ids = KCACHE_TRY(core::dictionary_ids(txn));  // this transaction's
        for (std::size_t k = from; k < to; ++k) {
            if (auto s = write(ready[k], txn, ids); !s) return s;
        }
        return txn.commit();
    };
    for (std::size_t from = 0; from < ready.size();) {
        std::size_t to = from;
        std::uint64_t bytes = 0;
        while (to < ready.size() && (to == from || bytes < kBytesPerTransaction))
            bytes += items[ready[to++]].result.bytes;
        Status together = write_together(from, to);
        for (std::size_t k = from; k < to; ++k) {
            PullItem& item = items[ready[k]];
            Status alone = together;
            if (!together && to - from > 1) alone = write_together(k, k + 1);
            if (!alone) {
                item.done = tl::unexpected(alone.error());
                continue;
            }
            if (item.result.outcome == Outcome::pulled) m_counts.hits.fetch_add(1);
            item.done = item.result;
        }
        if (!report_through(to == ready.size() ? last - 1 : ready[to - 1])) return false;
        from = to;
    }
    return report_through(last - 1);
}

bool Remote::pull_batches(core::Store& store, const std::vector<std::string>& names,
                          const std::function<bool(std::size_t, Result<EntryResult>)>& each,
                          const LeaseAsk* lease) {
    for (std::size_t base = 0; base < names.size(); base += kPullBatch) {
        const std::size_t end = std::min(names.size(), base + kPullBatch);
        std::vector<PullItem> items(end - base);
        for (std::size_t i = 0; i < items.size(); ++i) items[i].name = names[base + i];
        mark_local(store, items);
        fetch_manifests(items, lease);
        // The blobs, a group of entries at a time (bounded memory), then their writes; each
        // entry is reported once it is written (or failed), in order. False: stopped, after
        // the entries written so far were all reported.
        std::size_t reported = 0;
        bool going = true;
        auto report_through = [&](std::size_t i) {
            for (; reported <= i; ++reported) {
                const auto& done = *items[reported].done;
                if (done && done->outcome == Outcome::rejected) {
                    // For `kcache why`: the entry was there, and refused.
                    record_rejection(store.path(),
                                     {store.now_ns(), items[reported].name,
                                      std::string(rejection_name(done->rejection)), done->detail});
                }
                if (!each(base + reported, std::move(*items[reported].done))) going = false;
            }
            return going;
        };
        for (std::size_t first = 0; first < items.size();) {
            std::size_t last = first;  // the group is [first, last)
            std::uint64_t group_bytes = 0;
            while (last < items.size() && (last == first || group_bytes < kBytesPerGroup)) {
                if (!items[last].done) group_bytes += items[last].blob_bytes;
                ++last;
            }
            if (!pull_group(store, items, first, last, report_through)) return false;
            first = last;
        }
    }
    return true;
}

Result<EntryResult> Remote::pull(core::Store& store, std::string_view name, const LeaseAsk* lease) {
    std::optional<Result<EntryResult>> out;
    (void)pull_batches(
        store, {std::string(name)},
        [&](std::size_t, Result<EntryResult> r) {
            out = std::move(r);
            return true;
        },
        lease);
    return std::move(*out);
}

Result<std::vector<std::string>> Remote::job_entries(std::string_view job_tag) {
    KCACHE_TRY(validate_job_tag(job_tag));
    const std::string jkey = proto::job_key(m_options.ns, job_tag);
    Server& server = shard(jkey);
    auto r = KCACHE_TRY(exec(server, {{"SMEMBERS", jkey}}));
    const Reply& set = r.front();
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
    (void)pull_batches(store, entries, [&](std::size_t i, Result<EntryResult> result) {
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
        return !progress || progress(entries[i], result);
    });
    return summary;
}

Result<PullSummary> Remote::pull_job(core::Store& store, std::string_view job_tag,
                                     const PullProgress& progress) {
    auto names = KCACHE_TRY(job_entries(job_tag));
    return pull_entries(store, names, progress);
}

}  // namespace kcache::remote
