// A pull's state between its steps (internal to kcache_remote): the entries of a batch,
// the blobs they need, the dictionaries of the frames among those. pull.cpp runs the
// batch (manifests, then groups of entries: blobs, checks, writes); pull_blobs.cpp
// fetches the blobs and resolves the frames.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend.hpp"
#include "kcache/remote/remote.hpp"
#include "protocol.hpp"

namespace kcache::remote {

// Blob contents by digest: local copies, or the fetched ones.
using BlobContents = std::map<core::Digest, const std::string*, proto::DigestLess>;

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
    Shard* shard = nullptr;  // where its keys live
    std::string content;     // the raw bytes, as they arrive (a frame's: once checked)
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

// The dictionaries the frames of a group need, by digest, and how each was found:
// resolve_frames' steps (pull_blobs.cpp).
struct Remote::FrameDictionaries {
    using Digests = std::vector<core::Digest>;
    std::map<core::Digest, std::optional<std::string>, proto::DigestLess>
        by_digest;                                               // nullopt: gone
    std::map<core::Digest, std::string, proto::DigestLess> bad;  // why, for corrupt ones
    std::map<core::Digest, core::Error, proto::DigestLess> failed;

    // The dictionaries the framed blobs among `blobs` name; this db's own when it has
    // them (by digest), else from the backend, one pipeline per shard, each checked
    // against its digest (one that fails it is dropped there unless read-only).
    void find(Remote& remote, core::Store& store, const std::vector<Wanted*>& blobs);
    void fetch(Remote& remote, Shard& shard, const Digests& digests);
    // Every frame checked against its blob's digest with its dictionary: ok, or a fault
    // that drops the frame from the backend (and its manifests: the group settles them).
    void check_frames(Remote& remote, std::vector<Wanted*>& blobs) const;
};

}  // namespace kcache::remote
