// Pulling entries in batches: the manifests of a batch in one pipeline per shard, then
// groups of entries (about 64 MiB of blobs): their blobs (pull_blobs.cpp), checked, and
// whole entries written a few to a transaction (about 8 MiB). pull() is a batch of one.
//
// No LMDB write transaction is ever open while waiting on the backend: a group fetches
// and checks everything first; the local db is read from short snapshots.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>

#include <fmt/core.h>

#include "kcache/core/entry_image.hpp"
#include "kcache/core/frames.hpp"
#include "pull.hpp"
#include "signing.hpp"

namespace kcache::remote {

namespace {

// Blob bytes that one group of a batch holds in memory before it is written (at least one
// entry's, whatever its size).
constexpr std::uint64_t kBytesPerGroup = std::uint64_t{64} << 20;
// Entries' bytes that one write transaction takes, at most (at least one entry): bounds
// how long a pull holds the db's write lock against the daemon's own writers.
constexpr std::uint64_t kBytesPerTransaction = std::uint64_t{8} << 20;

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

namespace {

// With a lease asked for: after each GET, a script on the same shard (the manifest and
// the lease share the entry's hash tag) that takes the lease only while the manifest is
// absent: 1 taken, 0 held by another, -1 the manifest is there (nothing taken).
const char* const kLeaseIfMissing =
    "if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end "
    "if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end "
    "return 0";

}  // namespace

// Fetches the manifests of the entries not done yet, one pipeline per shard, each
// decoded and checked (take_manifest) before any blob is fetched.
void Remote::fetch_manifests(std::vector<PullItem>& items, const LeaseAsk* lease) {
    if (lease && m_options.read_only) lease = nullptr;
    const std::size_t per_item = lease ? 2 : 1;
    std::map<Shard*, std::vector<PullItem*>> by_shard;
    for (PullItem& item : items) {
        if (!item.done)
            by_shard[&shard(proto::manifest_key(m_options.ns, item.name))].push_back(&item);
    }
    for (auto& [holder, asked] : by_shard) {
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
        auto replies = exec(*holder, gets);
        if (!replies) {
            for (PullItem* item : asked) item->done = tl::unexpected(replies.error());
            continue;
        }
        std::vector<Command> dels;  // manifests that failed their checks
        for (std::size_t k = 0; k < asked.size(); ++k) {
            const Reply* lease_reply = lease ? &(*replies)[k * per_item + 1] : nullptr;
            take_manifest(*holder, *asked[k], (*replies)[k * per_item], lease_reply, dels);
        }
        if (!dels.empty() && !m_options.read_only) (void)exec(*holder, dels);
    }
}

void Remote::take_manifest(Shard& holder, PullItem& item, const Reply& reply,
                           const Reply* lease_reply, std::vector<Command>& dels) {
    if (reply.type == Reply::Type::nil) {
        m_counts.misses.fetch_add(1);
        item.result.outcome = Outcome::miss;
        // A failed script leaves it undecided: a plain miss.
        if (lease_reply && lease_reply->type == Reply::Type::integer && lease_reply->integer >= 0)
            item.result.lease_taken = lease_reply->integer == 1;
        item.done = item.result;
        return;
    }
    if (reply.type != Reply::Type::string) {
        item.done = tl::unexpected(reply_error(holder, reply, "GET"));
        return;
    }
    auto manifest = proto::decode_manifest(reply.str);
    Status checked =
        manifest ? check_manifest(*manifest, item.name) : Status(tl::unexpected(manifest.error()));
    if (!checked) {
        // A manifest that fails its checksum or names anything it must not is dropped
        // like a corrupt blob; SET NX would otherwise keep it for good.
        m_counts.corrupt.fetch_add(1);
        dels.push_back({"DEL", proto::manifest_key(m_options.ns, item.name)});
        item.result.outcome = Outcome::corrupt;
        item.result.detail = "manifest: " + checked.error().message;
        item.done = item.result;
        return;
    }
    std::string detail, signer;
    const Rejection why =
        check_signature(*manifest, m_options.ns, m_trust ? &*m_trust : nullptr, detail, signer);
    if (why != Rejection::none) {
        // Left in the backend: another node may trust what this one refuses.
        reject(item, why, std::move(detail));
        return;
    }
    item.result.signer = std::move(signer);
    for (const proto::Node& n : manifest->files) {
        if (n.type != core::FileType::regular) continue;
        ++item.result.files;
        item.result.bytes += n.size;
        if (!n.has_content) item.blob_bytes += n.size;
    }
    drop_special_bits(*manifest);
    item.manifest = std::move(*manifest);
}

// A group of a batch's entries, [first, last): the blobs they lack, checked, then the
// entries written.
struct Remote::PullGroup {
    using Dels = std::map<Shard*, std::vector<Command>>;
    Remote& remote;
    std::vector<PullItem>& items;
    std::size_t first = 0, last = 0;
    std::map<core::Digest, Wanted, proto::DigestLess> wanted;      // fetched
    std::map<core::Digest, std::string, proto::DigestLess> local;  // copied from the db
    FrameDictionaries dictionaries;                                // the frames'
    std::vector<BlobContents> contents;  // each entry's file contents (index - first)
    std::vector<std::size_t> ready;      // entries verified, to be written

    // The blobs the entries need: copied from the db when it holds them, else wanted.
    void collect(core::Store& store);
    // Each entry with all its blobs verified is ready (signed: its files against their
    // SHA-256s); the others are done (dangling, corrupt or failed).
    void settle();
    void fail(PullItem& item, const Wanted& bad, Dels& dels);
    // The ready entries, a few to a transaction; false: stopped by `report_through`.
    bool write(core::Store& store, const std::function<bool(std::size_t)>& report_through);
    Status write_together(core::Store& store, std::size_t from, std::size_t to);
    Status write_one(std::size_t i, core::WriteTxn& txn, core::DictionaryIds& ids);
};

// Fetches the blobs of items [first, last) that the db lacks (a blob it holds is copied
// from it), then writes the verified entries, a few to a transaction; each entry is
// reported through `report_through` once written or failed. False: stopped.
bool Remote::pull_group(core::Store& store, std::vector<PullItem>& items, std::size_t first,
                        std::size_t last, const std::function<bool(std::size_t)>& report_through) {
    PullGroup group{*this, items, first, last};
    group.collect(store);
    std::vector<Wanted*> fetch;
    for (auto& [digest, w] : group.wanted) fetch.push_back(&w);
    fetch_blobs(fetch);
    resolve_frames(store, fetch, group.dictionaries);
    group.settle();
    return group.write(store, report_through);
}

void Remote::PullGroup::collect(core::Store& store) {
    // A blob the db already holds (another entry's file, an earlier version) is copied
    // from it, not fetched (if it cannot be read, it is fetched).
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
            w.shard = &remote.shard(proto::blob_key(remote.m_options.ns, n.digest));
        }
    }
}

void Remote::PullGroup::settle() {
    Dels dels;  // dangling manifests
    contents.resize(last - first);
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
        if (bad) {
            fail(item, *bad, dels);
            continue;
        }
        // Signed: every file's bytes against the SHA-256 the key signed, before any byte
        // of the entry is written.
        if (std::string fault = check_contents(*item.manifest, contents[i - first]);
            !fault.empty()) {
            remote.reject(item, Rejection::bad, std::move(fault));
            continue;
        }
        ready.push_back(i);
    }
    if (remote.m_options.read_only) return;
    for (const auto& [holder, commands] : dels) (void)remote.exec(*holder, commands);
}

void Remote::PullGroup::fail(PullItem& item, const Wanted& bad, Dels& dels) {
    if (bad.state == Wanted::State::failed) {
        item.done = tl::unexpected(*bad.error);
        return;
    }
    item.result.detail = bad.detail;
    if (bad.state == Wanted::State::dangling) {
        remote.m_counts.dangling.fetch_add(1);
        remote.m_counts.misses.fetch_add(1);
        item.result.outcome = Outcome::dangling;
    } else {
        remote.m_counts.corrupt.fetch_add(1);
        item.result.outcome = Outcome::corrupt;
    }
    if (bad.state == Wanted::State::dangling || bad.drop_manifest) {
        // Useless without its blob, and SET NX would keep a fresh copy out: dropped, so
        // the next push of the entry uploads it whole.
        const std::string mkey = proto::manifest_key(remote.m_options.ns, item.name);
        dels[&remote.shard(mkey)].push_back({"DEL", mkey});
    }
    item.done = item.result;
}

// Everything is here and verified: whole entries, a few to a transaction (one commit,
// one sync, one hold of the write lock of at most kBytesPerTransaction), nothing of an
// entry on any failure. An entry whose write fails undoes its transaction: those
// entries are then written one per transaction.
bool Remote::PullGroup::write(core::Store& store,
                              const std::function<bool(std::size_t)>& report_through) {
    for (std::size_t from = 0; from < ready.size();) {
        std::size_t to = from;
        std::uint64_t bytes = 0;
        while (to < ready.size() && (to == from || bytes < kBytesPerTransaction))
            bytes += items[ready[to++]].result.bytes;
        Status together = write_together(store, from, to);
        for (std::size_t k = from; k < to; ++k) {
            PullItem& item = items[ready[k]];
            Status alone = together;
            if (!together && to - from > 1) alone = write_together(store, k, k + 1);
            if (!alone) {
                item.done = tl::unexpected(alone.error());
                continue;
            }
            if (item.result.outcome == Outcome::pulled) remote.m_counts.hits.fetch_add(1);
            item.done = item.result;
        }
        if (!report_through(to == ready.size() ? last - 1 : ready[to - 1])) return false;
        from = to;
    }
    return report_through(last - 1);
}

Status Remote::PullGroup::write_together(core::Store& store, std::size_t from, std::size_t to) {
    auto txn = KCACHE_TRY(store.write());
    auto ids = KCACHE_TRY(core::dictionary_ids(txn));  // this transaction's
    for (std::size_t k = from; k < to; ++k) {
        if (auto s = write_one(ready[k], txn, ids); !s) return s;
    }
    return txn.commit();
}

Status Remote::PullGroup::write_one(std::size_t i, core::WriteTxn& txn, core::DictionaryIds& ids) {
    PullItem& item = items[i];
    if (auto had = txn.find_entry(item.name); had && had->files > 0) {
        item.result.outcome = Outcome::already_local;  // pulled meanwhile
        return {};
    }
    // Frames are stored as they came (their dictionary's id made this db's), each taken by
    // its file's write just below, in this transaction.
    for (const proto::Node& n : item.manifest->files) {
        if (n.type != core::FileType::regular || n.has_content || n.size == 0) continue;
        auto w = wanted.find(n.digest);
        if (w == wanted.end() || w->second.frame.empty()) continue;
        core::PulledFrame pulled;
        pulled.digest = n.digest;
        pulled.raw_size = n.size;
        pulled.frame = w->second.frame;
        if (!w->second.dictionary.empty())
            pulled.dictionary = *dictionaries.by_digest.at(w->second.dictionary);
        pulled.name = std::string_view(n.path).substr(n.path.rfind('/') + 1);
        pulled.producer = item.manifest->producer;
        if (auto s = core::offer_frame(txn, pulled, ids); !s)
            return tl::unexpected(core::with_context(s.error(), item.name));
    }
    if (auto s = write_entry(txn, *item.manifest, contents[i - first], item.result.signer); !s)
        return tl::unexpected(core::with_context(s.error(), item.name));
    item.result.outcome = Outcome::pulled;
    return {};
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
    Shard& server = shard(jkey);
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
