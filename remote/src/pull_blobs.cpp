// A pull's blobs: fetched from their shards in pipelines of about 8 MiB (a blob's header
// with its first chunks, then its other chunks), each checked against its digest; a
// frame's dictionary found (this db, else the backend) and the frame's content checked.
#include <algorithm>
#include <map>

#include <fmt/core.h>

#include "kcache/core/frames.hpp"
#include "pull.hpp"

namespace kcache::remote {

namespace {

constexpr std::uint64_t kBytesPerRoundTrip = std::uint64_t{8} << 20;  // one pipeline's chunks

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

// One shard's blobs, fetched in pipelines; each reply checked as it comes.
struct Remote::BlobFetch {
    using Asked = std::vector<std::pair<Wanted*, std::int64_t>>;  // blob, chunk (-1: header)
    Remote& remote;
    Shard& shard;
    std::vector<Wanted*>& wanted;
    std::vector<Command> dels;  // corrupt blobs, dropped so that the next push sends them
    std::size_t first = 0;      // the first blob not fully asked for

    void run();
    // The next pipeline: each blob's header with its first chunks, up to about 8 MiB.
    void next(std::vector<Command>& batch, Asked& asked);
    void take_header(Wanted& w, const Reply& r);
    void take_chunk(Wanted& w, std::uint32_t i, const Reply& r);
    // `w` is dangling or corrupt (a corrupt one is dropped from the backend).
    void finished(Wanted& w, Wanted::State state, std::string detail);
};

void Remote::fetch_blobs(std::vector<Wanted*>& blobs) {
    std::map<Shard*, std::vector<Wanted*>> by_shard;
    for (Wanted* w : blobs) by_shard[w->shard].push_back(w);
    for (auto& [shard, wanted] : by_shard) BlobFetch{*this, *shard, wanted}.run();
}

void Remote::BlobFetch::run() {
    for (;;) {
        std::vector<Command> batch;
        Asked asked;
        next(batch, asked);
        if (batch.empty()) break;
        auto replies = remote.exec(shard, batch);
        if (!replies) {
            for (Wanted* w : wanted) {
                if (w->state != Wanted::State::fetching) continue;
                w->state = Wanted::State::failed;
                w->error = replies.error();
            }
            break;
        }
        for (std::size_t k = 0; k < asked.size(); ++k) {
            auto [w, chunk] = asked[k];
            if (w->state != Wanted::State::fetching) continue;
            if (chunk < 0) {
                take_header(*w, (*replies)[k]);
            } else {
                take_chunk(*w, static_cast<std::uint32_t>(chunk), (*replies)[k]);
            }
        }
    }
    if (!dels.empty()) (void)remote.exec(shard, dels);  // best effort: a failure is counted
}

void Remote::BlobFetch::next(std::vector<Command>& batch, Asked& asked) {
    const std::string& ns = remote.m_options.ns;
    std::uint64_t bytes = 0;
    for (std::size_t i = first; i < wanted.size() && bytes < kBytesPerRoundTrip; ++i) {
        Wanted& w = *wanted[i];
        if (w.state != Wanted::State::fetching) {
            if (i == first) ++first;
            continue;
        }
        if (!w.header_seen && w.next_chunk == 0) {
            batch.push_back({"GET", proto::blob_key(ns, w.digest)});
            asked.emplace_back(&w, -1);
        }
        while (w.next_chunk < w.chunks && bytes < kBytesPerRoundTrip) {
            batch.push_back({"GET", proto::chunk_key(ns, w.digest, w.next_chunk)});
            asked.emplace_back(&w, w.next_chunk);
            bytes += std::min<std::uint64_t>(
                proto::kChunkBytes, w.size - std::uint64_t{w.next_chunk} * proto::kChunkBytes);
            ++w.next_chunk;
        }
        if (w.next_chunk == w.chunks && i == first) ++first;
    }
}

void Remote::BlobFetch::take_header(Wanted& w, const Reply& r) {
    if (r.type == Reply::Type::nil) {
        finished(w, Wanted::State::dangling, fmt::format("blob {} is gone", w.digest.hex()));
        return;
    }
    if (r.type != Reply::Type::string) {
        w.state = Wanted::State::failed;
        w.error = remote.reply_error(shard, r, "GET");
        return;
    }
    if (proto::is_frame(r.str)) {
        auto frame = proto::decode_frame(r.str);
        if (!frame || frame->raw_size != w.size) {
            w.drop_manifest = true;
            w.chunks = 0;
            finished(w, Wanted::State::corrupt,
                     fmt::format(
                         "blob {}: {}", w.digest.hex(),
                         frame ? "its size differs from the manifest's" : frame.error().message));
            return;
        }
        w.frame.assign(frame->frame);
        w.dictionary = frame->dictionary;
        w.chunks = 0;  // the chunk asked with it is not there
        w.header_seen = true;
        w.state = Wanted::State::framed;
        return;
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
        finished(w, Wanted::State::corrupt, fmt::format("blob {}: {}", w.digest.hex(), why));
        return;
    }
    w.header_seen = true;
    w.content.reserve(w.size);
}

void Remote::BlobFetch::take_chunk(Wanted& w, std::uint32_t i, const Reply& r) {
    if (r.type == Reply::Type::nil) {
        finished(w, Wanted::State::dangling,
                 fmt::format("blob {} has lost chunk {}", w.digest.hex(), i));
        return;
    }
    if (r.type != Reply::Type::string) {
        w.state = Wanted::State::failed;
        w.error = remote.reply_error(shard, r, "GET");
        return;
    }
    const std::size_t raw =
        std::min<std::uint64_t>(proto::kChunkBytes, w.size - std::uint64_t{i} * proto::kChunkBytes);
    if (auto s = proto::decode_chunk(r.str, raw, w.content); !s) {
        finished(w, Wanted::State::corrupt,
                 fmt::format("blob {}: chunk {}: {}", w.digest.hex(), i, s.error().message));
        return;
    }
    w.next_reply = i + 1;
    if (w.next_reply != w.chunks) return;
    if (core::digest_of(w.content) == w.digest) {
        w.state = Wanted::State::ok;
    } else {
        finished(w, Wanted::State::corrupt,
                 fmt::format("blob {}: content does not match its digest", w.digest.hex()));
    }
}

void Remote::BlobFetch::finished(Wanted& w, Wanted::State state, std::string detail) {
    w.state = state;
    w.detail = std::move(detail);
    w.content.clear();
    w.content.shrink_to_fit();
    if (state == Wanted::State::corrupt && !remote.m_options.read_only) {
        const std::string& ns = remote.m_options.ns;
        Command del{"DEL", proto::blob_key(ns, w.digest)};
        for (std::uint32_t i = 0; i < w.chunks; ++i)
            del.push_back(proto::chunk_key(ns, w.digest, i));
        dels.push_back(std::move(del));
    }
}

void Remote::resolve_frames(core::Store& store, std::vector<Wanted*>& blobs,
                            FrameDictionaries& dictionaries) {
    if (std::none_of(blobs.begin(), blobs.end(),
                     [](const Wanted* w) { return w->state == Wanted::State::framed; }))
        return;
    dictionaries.find(*this, store, blobs);
    dictionaries.check_frames(*this, blobs);
}

void Remote::FrameDictionaries::find(Remote& remote, core::Store& store,
                                     const std::vector<Wanted*>& blobs) {
    for (const Wanted* w : blobs) {
        if (w->state == Wanted::State::framed && !w->dictionary.empty())
            by_digest.emplace(w->dictionary, std::nullopt);
    }
    if (by_digest.empty()) return;
    if (auto txn = store.read()) {
        if (auto ids = core::dictionary_ids(*txn)) {
            for (const auto& [digest, id] : *ids) {
                auto it = by_digest.find(digest);
                if (it == by_digest.end() || it->second) continue;
                if (auto bytes = core::read_dictionary(*txn, id)) it->second = std::move(*bytes);
            }
        }
    }
    std::map<Shard*, Digests> by_shard;
    for (const auto& [digest, bytes] : by_digest) {
        if (!bytes)
            by_shard[&remote.shard(proto::dictionary_key(remote.m_options.ns, digest))].push_back(
                digest);
    }
    for (const auto& [shard, digests] : by_shard) fetch(remote, *shard, digests);
}

void Remote::FrameDictionaries::fetch(Remote& remote, Shard& shard, const Digests& digests) {
    const std::string& ns = remote.m_options.ns;
    std::vector<Command> gets;
    for (const core::Digest& d : digests) gets.push_back({"GET", proto::dictionary_key(ns, d)});
    auto replies = remote.exec(shard, gets);
    std::vector<Command> dels;  // dictionaries that fail their digest
    for (std::size_t i = 0; i < digests.size(); ++i) {
        if (!replies) {
            failed.emplace(digests[i], replies.error());
            continue;
        }
        const Reply& r = (*replies)[i];
        if (r.type == Reply::Type::nil) continue;  // gone (evicted): a clean miss
        if (r.type != Reply::Type::string) {
            failed.emplace(digests[i], remote.reply_error(shard, r, "GET"));
            continue;
        }
        auto bytes = proto::decode_dictionary(r.str, digests[i]);
        if (!bytes) {
            bad.emplace(digests[i], bytes.error().message);
            dels.push_back({"DEL", proto::dictionary_key(ns, digests[i])});
            continue;
        }
        by_digest[digests[i]] = std::string(*bytes);
    }
    if (!dels.empty() && !remote.m_options.read_only) (void)remote.exec(shard, dels);
}

void Remote::FrameDictionaries::check_frames(Remote& remote, std::vector<Wanted*>& blobs) const {
    std::map<Shard*, std::vector<Command>> dels;
    for (Wanted* wp : blobs) {
        Wanted& w = *wp;
        if (w.state != Wanted::State::framed) continue;
        auto fault = [&](Wanted::State state, std::string detail) {
            w.state = state;
            w.detail = std::move(detail);
            w.drop_manifest = true;
            w.frame.clear();
            dels[w.shard].push_back({"DEL", proto::blob_key(remote.m_options.ns, w.digest)});
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
            const auto& bytes = by_digest.at(w.dictionary);
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
    if (remote.m_options.read_only) return;
    for (const auto& [shard, commands] : dels) (void)remote.exec(*shard, commands);
}

}  // namespace kcache::remote
