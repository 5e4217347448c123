// The small public helpers of types.hpp and store.hpp: digests, names of counters
// and events, Content, Origin, the default db path.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <new>

#include <fmt/format.h>
#include <xxhash.h>

#include "store_impl.hpp"

namespace kcache::core {
// ---- small public helpers -------------------------------------------------------

std::int64_t system_clock_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::int64_t steady_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string Digest::hex() const {
    return fmt::format("{:016x}{:016x}", high, low);
}

namespace {
Digest from_xxh(XXH128_hash_t h) {
    Digest d{h.high64, h.low64};
    if (d.empty()) d.low = 1;  // all-zero is reserved for empty content
    return d;
}
// Separates segment-list digests from flat ones: a small file that holds some big
// file's segment list does not share its digest (and so its blob).
constexpr XXH64_hash_t kSegmentListSeed = 0x6b63616368655347;  // "kcacheSG"
// Alternative addresses (store_impl.hpp): the seed of probe k is the base + k, for
// flat blobs and lists apart, so no two domains share a seed.
constexpr XXH64_hash_t kAlternativeSeed = 0x6b63616368654100;      // "kcacheA\0"
constexpr XXH64_hash_t kAlternativeListSeed = 0x6b63616368654c00;  // "kcacheL\0"

std::string list_bytes(const std::vector<Digest>& segments) {
    std::string list;
    list.reserve(segments.size() * 16);
    for (const Digest& d : segments) list += records::digest_key(d);
    return list;
}

// XXH3-128 of `pieces` (in order) under `seed` (0: none), as from_xxh keeps it.
Digest digest_of_pieces(const std::vector<std::string_view>& pieces, XXH64_hash_t seed) {
    if (pieces.size() == 1)
        return from_xxh(XXH3_128bits_withSeed(pieces.front().data(), pieces.front().size(), seed));
    XXH3_state_t* state = XXH3_createState();
    if (!state) throw std::bad_alloc();
    XXH3_128bits_reset_withSeed(state, seed);
    for (const std::string_view piece : pieces)
        XXH3_128bits_update(state, piece.data(), piece.size());
    const XXH128_hash_t h = XXH3_128bits_digest(state);
    XXH3_freeState(state);
    return from_xxh(h);
}
}  // namespace

Digest flat_digest_of(std::string_view bytes) {
    if (bytes.empty()) return {};
    return from_xxh(XXH3_128bits(bytes.data(), bytes.size()));
}

Digest digest_of_segments(const std::vector<Digest>& segments) {
    const std::string list = list_bytes(segments);
    return from_xxh(XXH3_128bits_withSeed(list.data(), list.size(), kSegmentListSeed));
}

namespace ops {

Digest alternative_address(std::string_view bytes, std::uint32_t probe) {
    return from_xxh(XXH3_128bits_withSeed(bytes.data(), bytes.size(), kAlternativeSeed + probe));
}

Digest alternative_list_address(const std::vector<Digest>& segments, std::uint32_t probe) {
    const std::string list = list_bytes(segments);
    return from_xxh(XXH3_128bits_withSeed(list.data(), list.size(), kAlternativeListSeed + probe));
}

bool is_flat_address(const Digest& address, const std::vector<std::string_view>& pieces) {
    if (digest_of_pieces(pieces, 0) == address) return true;
    for (std::uint32_t probe = 1; probe <= kMaxProbes; ++probe) {
        if (digest_of_pieces(pieces, kAlternativeSeed + probe) == address) return true;
    }
    return false;
}

bool is_list_address(const Digest& address, const std::vector<Digest>& segments) {
    const std::string list = list_bytes(segments);
    const std::vector<std::string_view> pieces{list};
    if (digest_of_pieces(pieces, kSegmentListSeed) == address) return true;
    for (std::uint32_t probe = 1; probe <= kMaxProbes; ++probe) {
        if (digest_of_pieces(pieces, kAlternativeListSeed + probe) == address) return true;
    }
    return false;
}

}  // namespace ops

Digest digest_of(std::string_view bytes) {
    if (bytes.size() < kSegmentedSize) return flat_digest_of(bytes);
    std::vector<Digest> segments;
    segments.reserve(segment_count(bytes.size()));
    for (std::uint64_t at = 0; at < bytes.size(); at += kSegmentSize) {
        segments.push_back(flat_digest_of(bytes.substr(at, kSegmentSize)));
    }
    return digest_of_segments(segments);
}

FileType Attr::type() const {
    return file_type_of(mode);
}

FileType file_type_of(std::uint32_t mode) {
    switch (mode & S_IFMT) {
        case S_IFDIR:
            return FileType::directory;
        case S_IFLNK:
            return FileType::symlink;
        case S_IFIFO:
        case S_IFSOCK:
        case S_IFCHR:
        case S_IFBLK:
            return FileType::special;
        default:
            return FileType::regular;
    }
}

std::string_view event_kind_name(EventKind k) {
    switch (k) {
        case EventKind::populate:
            return "populate";
        case EventKind::hit:
            return "hit";
        case EventKind::evict:
            return "evict";
        case EventKind::pin:
            return "pin";
        case EventKind::unpin:
            return "unpin";
        case EventKind::remove:
            return "remove";
        case EventKind::rename:
            return "rename";
        case EventKind::import:
            return "import";
        case EventKind::reset:
            return "reset";
        case EventKind::member:
            return "member";
        case EventKind::update:
            return "update";
    }
    return "unknown";
}

std::uint64_t Stats::get(Counter c) const {
    auto it = values.find(c);
    return it == values.end() ? 0 : it->second;
}

Content Content::view(std::string_view bytes) {
    Content c;
    c.m_view = bytes;
    return c;
}

Content Content::owned(std::string bytes) {
    Content c;
    c.m_is_owned = true;
    c.m_owned = std::move(bytes);
    return c;
}

std::string Content::release() && {
    return m_is_owned ? std::move(m_owned) : std::string(m_view);
}

Origin Origin::current() {
    Origin o;
    o.pid = static_cast<std::uint32_t>(getpid());
    std::ifstream comm("/proc/self/comm");
    std::getline(comm, o.name);
    return o;
}

Origin Origin::fleet(std::string_view writer) {
    Origin o;
    o.fetched = true;
    o.name = std::string(kFleetOrigin);
    for (const char c : writer.substr(0, 48)) o.name += (c > ' ' && c < 0x7f) ? c : '?';
    return o;
}

std::string default_db_path() {
    if (const char* db = std::getenv("KCACHE_DB"); db && *db) return db;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
        return std::string(xdg) + "/kcache/db";
    }
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.cache/kcache/db";
}

}  // namespace kcache::core
