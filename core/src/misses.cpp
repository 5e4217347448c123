// Misses explained (misses.hpp): families per layout, the comparison of two entries of
// one family, the background classifier and its tables.
#include "kcache/core/misses.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kcache/core/layout.hpp"
#include "kcache/core/roles.hpp"
#include "store_impl.hpp"

namespace kcache::core {
namespace {

using records::Writer;

// Format 2 adds the node and namespace of a member compared across nodes; format 1
// records (written before) still decode, with neither.
constexpr std::uint8_t kMissFormat = 2;
constexpr std::uint8_t kEvictionFormat = 1;
// Metadata and IR files larger than this are compared by digest only.
constexpr std::uint64_t kMaxTextBytes = 4 << 20;
constexpr std::size_t kMaxCompared = 8;            // the newest entries of a family looked at
constexpr std::size_t kCandidates = 2;             // of them, the closest compared in full
constexpr std::size_t kMaxDistanceEvents = 20000;  // events read for one stack distance
// A batch's comparisons stop after this long (after one event at least); the next call
// goes on. They run from a snapshot: LMDB's writer lock is held only for the batch's
// writes afterwards, a short transaction.
constexpr std::int64_t kBatchBudgetNs = 5'000'000;

std::string cut(std::string_view s) {
    if (s.size() <= kMaxLineBytes) return std::string(s);
    return std::string(s.substr(0, kMaxLineBytes - 3)) + "...";
}

// The part of an entry's name its compiler's key gave it: a node entry's directory
// name, a stem entry's stem. File names holding it are compared with "{key}" in its place.
std::string entry_key(const EntryInfo& e) {
    if (e.kind == EntryKind::stem) return e.stem;
    const auto slash = e.name.rfind('/');
    return slash == std::string::npos ? e.name : e.name.substr(slash + 1);
}

std::string normalized(std::string_view path, const std::string& key) {
    std::string out(path);
    if (key.size() < 8) return out;  // a short name says nothing about a key
    for (auto at = out.find(key); at != std::string::npos; at = out.find(key, at + 5)) {
        out.replace(at, key.size(), "{key}");
    }
    return out;
}

std::string_view base_name(std::string_view path) {
    const auto slash = path.rfind('/');
    return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// What a file is to the comparison.
enum class Kind { metadata, text, binary, skip };

Kind kind_of(const EntryFile& f) {
    const std::string_view name = base_name(f.path);
    // Triton's group file holds the entry's absolute paths; JAX's -atime its last use.
    if (name.starts_with("__grp__") || name.ends_with("-atime")) return Kind::skip;
    if (f.role == Role::signature) return Kind::metadata;
    if (f.role == Role::ir) return Kind::text;
    if (name.ends_with(".py") || name.ends_with(".cpp") || name.ends_with(".h") ||
        name.ends_with(".txt")) {
        return Kind::text;
    }
    return Kind::binary;  // binaries and what no role describes: compared by content
}

struct File {
    EntryFile info;
    Kind kind = Kind::binary;
    // A family member's file: what it holds of the content (nullopt: a local file,
    // read from the transaction), and whether that is the whole file.
    std::optional<std::string> held;
    bool whole = true;
};

// One side of a comparison: a local entry's regular files, by their path with the key
// normalized, read from `txn`; or a family member's (no txn: what each file holds).
struct Side {
    const Txn* txn = nullptr;
    std::map<std::string, File> files;
};

// The regular files of an entry, by their path with the key normalized.
Result<Side> files_of(const Txn& txn, const EntryInfo& entry) {
    Side out;
    out.txn = &txn;
    const std::string key = entry_key(entry);
    KCACHE_TRY(txn.for_each_entry_file(entry, [&](const EntryFile& f) {
        if (!f.attr.is_regular() || f.attr.bookkeeping) return true;
        out.files[normalized(f.path, key)] = File{f, kind_of(f), std::nullopt, true};
        return true;
    }));
    return out;
}

// Whether the comparison has `f`'s text (all of it, or a member's first lines).
bool has_text(const File& f) {
    if (f.held) return !f.held->empty() || (f.whole && f.info.attr.size == 0);
    return f.info.attr.size <= kMaxTextBytes;
}

Result<std::string> content_of(const Side& side, const File& f) {
    if (f.held) return *f.held;
    if (!side.txn || f.info.attr.size > kMaxTextBytes) return std::string();
    auto c = KCACHE_TRY(side.txn->read(f.info.attr.ino));
    return std::string(c.bytes());
}

// The first `n` lines of `s` (each with its newline).
std::string_view first_lines(std::string_view s, std::size_t n) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < n && at < s.size(); ++i) {
        const auto nl = s.find('\n', at);
        at = nl == std::string_view::npos ? s.size() : nl + 1;
    }
    return s.substr(0, at);
}

std::size_t line_count(std::string_view s) {
    return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

// A JSON object's top-level fields as text; nullopt when the bytes are not one.
std::optional<std::map<std::string, std::string>> json_fields(std::string_view bytes) {
    auto doc = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) return std::nullopt;
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : doc.items()) {
        out[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
    return out;
}

// The first line where `a` and `b` differ (1-based), with both lines; nullopt if equal.
std::optional<LineDiff> first_line_diff(std::string_view a, std::string_view b) {
    std::uint32_t line = 1;
    while (!a.empty() || !b.empty()) {
        const auto ea = a.find('\n');
        const auto eb = b.find('\n');
        const std::string_view la = a.substr(0, ea);
        const std::string_view lb = b.substr(0, eb);
        if (la != lb || (a.empty() != b.empty())) {
            return LineDiff{{},
                            line,
                            cut(a.empty() ? "(end of file)" : la),
                            cut(b.empty() ? "(end of file)" : lb)};
        }
        a = ea == std::string_view::npos ? std::string_view{} : a.substr(ea + 1);
        b = eb == std::string_view::npos ? std::string_view{} : b.substr(eb + 1);
        ++line;
    }
    return std::nullopt;
}

// How many lines differ, position by position (and the lines one has beyond the other):
// a measure of how far apart two versions of a file are, to pick the closest entry.
std::size_t differing_lines(std::string_view a, std::string_view b) {
    std::size_t n = 0;
    while (!a.empty() || !b.empty()) {
        const auto ea = a.find('\n');
        const auto eb = b.find('\n');
        n += a.substr(0, ea) != b.substr(0, eb) || a.empty() != b.empty();
        a = ea == std::string_view::npos ? std::string_view{} : a.substr(ea + 1);
        b = eb == std::string_view::npos ? std::string_view{} : b.substr(eb + 1);
    }
    return n;
}

// How far another entry is from a missed one, to pick the closest: the metadata fields
// that differ first (the key's inputs as the compiler wrote them), then the IR lines
// that differ (which follow from those inputs). Not their sum: one field apart must win
// over none apart with a line or two more (a different block size at the same warps
// against the same block size at other warps, with IR a few lines apart).
struct Distance {
    std::size_t fields = 0;
    std::size_t lines = 0;
    auto operator<=>(const Distance&) const = default;
};

Status compare_impl(const Side& mine, const Side& theirs, Miss& out, Distance* distance);

// IR files in the order a compile produces them, so the first difference named is the
// one nearest the key's inputs: source, then Triton's stages, then anything else.
int ir_rank(std::string_view path) {
    constexpr std::string_view kOrder[] = {".source", ".py",   ".ttir", ".ttgir",
                                           ".mlir",   ".llir", ".ll",   ".ptx"};
    for (std::size_t i = 0; i < std::size(kOrder); ++i) {
        if (path.ends_with(kOrder[i])) return static_cast<int>(i);
    }
    return static_cast<int>(std::size(kOrder));
}

// ---- families -----------------------------------------------------------------------

// JAX names an entry <prefix>-<hash>: jit_<function>, pmap_<function>, ...
std::string jax_family(const EntryInfo& e) {
    const auto dash = e.stem.rfind('-');
    if (dash == std::string::npos || dash == 0) return {};
    if (!looks_like_hash(std::string_view(e.stem).substr(dash + 1))) return {};
    return "jax:" + e.stem.substr(0, dash);
}

Result<std::string> family_from_files(const Side& side) {
    for (const auto& [path, f] : side.files) {
        if (f.kind != Kind::metadata || !path.ends_with(".json")) continue;
        const std::string_view name = base_name(path);
        auto bytes = KCACHE_TRY(content_of(side, f));
        auto fields = json_fields(bytes);
        if (!fields) continue;
        auto field = [&](const char* k) -> std::string {
            auto it = fields->find(k);
            return it == fields->end() ? std::string() : it->second;
        };
        // Triton (and Inductor's Triton kernels): <name>.json, the compile's metadata.
        if (!field("name").empty() &&
            (fields->count("triton_version") || fields->count("num_warps"))) {
            return "triton:" + field("name");
        }
        // Wave: <hash>.kernel_info.json.
        if (name.ends_with(".kernel_info.json") && !field("func_name").empty()) {
            return "wave:" + field("func_name");
        }
        // kcache's own layout: kernel.json, the signature (docs/signature.md).
        if (name == "kernel.json" && !field("kernel").empty()) return "kcache:" + field("kernel");
    }
    return std::string();
}

// LMDB keys hold at most 511 bytes; names and families up to kMaxKeyText bytes are
// their own key, longer ones are keyed by their digest ("#" + 32 hex digits).
constexpr std::size_t kMaxKeyText = 400;
std::string text_key(std::string_view text) {
    if (text.size() <= kMaxKeyText && !text.starts_with('#') &&
        text.find('\0') == std::string_view::npos) {
        return std::string(text);
    }
    return "#" + digest_of(text).hex();
}

std::string family_prefix(std::string_view family) {
    std::string key = text_key(family);
    key.push_back('\0');
    return key;
}

std::string family_key(std::string_view family, Ino entry) {
    return family_prefix(family) + records::u64_key(entry);
}

// ---- records --------------------------------------------------------------------------

std::string encode_miss(const Miss& m) {
    std::string out;
    Writer w(out);
    w.u8(kMissFormat);
    w.i64(m.time_ns);
    w.u64(m.entry);
    w.str16(m.name.substr(0, kMaxPathLength));
    w.u8(static_cast<std::uint8_t>(m.producer));
    w.str16(m.family.substr(0, 1000));
    w.u8(static_cast<std::uint8_t>(m.cause));
    w.u64(m.stored_bytes);
    w.u64(m.compared);
    w.str16(m.compared_name.substr(0, kMaxPathLength));
    w.u16(static_cast<std::uint16_t>(m.fields.size()));
    for (const FieldDiff& f : m.fields) {
        w.str16(cut(f.file));
        w.str16(cut(f.field));
        w.str16(cut(f.before));
        w.str16(cut(f.after));
    }
    w.u16(static_cast<std::uint16_t>(m.lines.size()));
    for (const LineDiff& l : m.lines) {
        w.str16(cut(l.file));
        w.u32(l.line);
        w.str16(cut(l.before));
        w.str16(cut(l.after));
    }
    w.str16(cut(m.same_binary));
    w.i64(m.gone_ns);
    w.str16(cut(m.gone_why));
    w.u64(m.stack_distance);
    w.str16(cut(m.note));
    w.str16(cut(m.compared_host));
    w.str16(cut(m.compared_namespace));
    return out;
}

Status read_str(ByteReader& r, std::string& out) {
    auto s = KCACHE_TRY(r.str16());
    out.assign(s);
    return {};
}

Result<Miss> decode_miss(std::uint64_t seq, std::string_view bytes) {
    ByteReader r(bytes, "miss");
    Miss m;
    m.seq = seq;
    std::uint8_t version = 0, producer = 0, cause = 0;
    std::uint16_t n = 0;
    auto corrupt = [&](const std::optional<Error>& why) {
        return fail(EIO, fmt::format("corrupt miss record {}{}", seq,
                                     why ? ": " + why->message : std::string()));
    };
    Status s = r.read(version, m.time_ns, m.entry);
    if (s) s = read_str(r, m.name);
    if (s) s = r.read(producer);
    if (s) s = read_str(r, m.family);
    if (s) s = r.read(cause, m.stored_bytes, m.compared);
    if (s) s = read_str(r, m.compared_name);
    if (s) s = r.read(n);
    for (std::uint16_t i = 0; s && i < n; ++i) {
        FieldDiff f;
        s = read_str(r, f.file);
        if (s) s = read_str(r, f.field);
        if (s) s = read_str(r, f.before);
        if (s) s = read_str(r, f.after);
        m.fields.push_back(std::move(f));
    }
    if (s) s = r.read(n);
    for (std::uint16_t i = 0; s && i < n; ++i) {
        LineDiff l;
        s = read_str(r, l.file);
        if (s) s = r.read(l.line);
        if (s) s = read_str(r, l.before);
        if (s) s = read_str(r, l.after);
        m.lines.push_back(std::move(l));
    }
    if (s) s = read_str(r, m.same_binary);
    if (s) s = r.read(m.gone_ns);
    if (s) s = read_str(r, m.gone_why);
    if (s) s = r.read(m.stack_distance);
    if (s) s = read_str(r, m.note);
    if (s && version >= 2) s = read_str(r, m.compared_host);
    if (s && version >= 2) s = read_str(r, m.compared_namespace);
    if (s) s = r.expect_end();
    if (!s) return corrupt(s.error());
    if (version < 1 || version > kMissFormat || cause < 1 || cause > 4)
        return corrupt(std::nullopt);
    m.producer = static_cast<Producer>(producer);
    m.cause = static_cast<MissCause>(cause);
    return m;
}

struct Eviction {
    std::uint64_t seq = 0;
    std::int64_t time_ns = 0;
    Ino entry = 0;
    EventKind why = EventKind::evict;
};

std::string encode_eviction(const Eviction& e) {
    std::string out;
    Writer w(out);
    w.u8(kEvictionFormat);
    w.u64(e.seq);
    w.i64(e.time_ns);
    w.u64(e.entry);
    w.u8(static_cast<std::uint8_t>(e.why));
    return out;
}

Result<Eviction> decode_eviction(std::string_view bytes) {
    ByteReader r(bytes, "eviction");
    Eviction e;
    std::uint8_t version = 0, why = 0;
    Status s = r.read(version, e.seq, e.time_ns, e.entry, why);
    if (s) s = r.expect_end();
    if (!s || version != kEvictionFormat) return fail(EIO, "corrupt eviction record");
    e.why = static_cast<EventKind>(why);
    return e;
}

std::string_view gone_why(EventKind k) {
    return k == EventKind::evict ? "evicted (the size bound, kcache evict or clear)"
                                 : "removed (unlinked or replaced by a process)";
}

// ---- the classifier -------------------------------------------------------------------

// The stored bytes of the distinct entries used (populated, hit, written) between the
// last use of `old` and its eviction at `evicted_seq`, plus `own`: the LRU stack
// distance. Entries gone since count as the average entry.
Result<std::uint64_t> stack_distance(const Txn& txn, Ino old, std::uint64_t evicted_seq,
                                     std::uint64_t own) {
    // Backwards from the eviction to the entry's last use, at most kMaxDistanceEvents
    // events (the write transaction this runs in holds LMDB's writer lock): beyond
    // them the distance counts what was seen, a lower bound.
    const Tx tx = TxnAccess::tx(txn);
    std::unordered_set<Ino> used;
    lmdb::Cursor cursor;
    if (const int rc = cursor.open(tx.txn, tx.db.events); rc != 0) {
        return tl::unexpected(lmdb::error(rc, "events: cursor"));
    }
    const std::string from = records::u64_key(evicted_seq);
    MDB_val k = lmdb::val(from), v{};
    int rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_SET_RANGE);
    rc = rc == MDB_NOTFOUND ? mdb_cursor_get(cursor.get(), &k, &v, MDB_LAST) : rc;
    for (std::size_t n = 0; rc == 0 && n < kMaxDistanceEvents; ++n) {
        const std::uint64_t seq = records::u64_from_key(lmdb::view(k));
        if (seq < evicted_seq) {
            auto e = KCACHE_TRY(records::decode_event(seq, lmdb::view(v)));
            if (e.kind == EventKind::populate || e.kind == EventKind::hit ||
                e.kind == EventKind::update) {
                if (e.entry == old) break;  // its last use
                if (e.entry != 0) used.insert(e.entry);
            }
        }
        rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_PREV);
    }
    if (rc != 0 && rc != MDB_NOTFOUND) return tl::unexpected(lmdb::error(rc, "events: scan"));
    const auto entries = KCACHE_TRY(txn.counter(Counter::entries));
    const auto stored = KCACHE_TRY(txn.counter(Counter::stored_bytes));
    const std::uint64_t average = entries ? stored / entries : own;
    std::uint64_t total = own;
    for (Ino ino : used) {
        auto e = txn.entry(ino);
        if (e) {
            total += e->stored_bytes;
        } else if (e.error().code == ENOENT) {
            total += average;
        } else {
            return tl::unexpected(e.error());
        }
    }
    return total;
}

// Whether the entry of populate event `e` has settled: the compiler published its last
// file a while ago (or it is gone, or it has waited long enough).
Result<bool> settled(const Txn& txn, const Event& e, std::int64_t now) {
    if (now - e.time_ns >= kMaxWaitNs) return true;
    auto entry = txn.entry(e.entry);
    if (!entry) {
        if (entry.error().code == ENOENT) return true;
        return tl::unexpected(entry.error());
    }
    if (now - entry->last_access_ns < kSettleNs) return false;
    return !KCACHE_TRY(txn.in_flight(entry->ino));
}

// The fields of an entry's JSON metadata files, by file; the key's own "hash" left out.
using Metadata = std::map<std::string, std::map<std::string, std::string>>;
Result<Metadata> metadata_of(const Side& side) {
    Metadata out;
    for (const auto& [path, f] : side.files) {
        if (f.kind != Kind::metadata || !has_text(f) || !f.whole) continue;
        auto bytes = KCACHE_TRY(content_of(side, f));
        if (auto fields = json_fields(bytes)) {
            fields->erase("hash");
            out[path] = std::move(*fields);
        }
    }
    return out;
}

std::size_t differing_fields(const Metadata& a, const Metadata& b) {
    std::size_t n = 0;
    for (const auto& [file, fa] : a) {
        auto it = b.find(file);
        if (it == b.end()) {
            n += fa.size();
            continue;
        }
        for (const auto& [k, v] : fa) {
            auto jt = it->second.find(k);
            n += jt == it->second.end() || jt->second != v;
        }
        for (const auto& [k, v] : it->second) n += !fa.count(k);
    }
    return n;
}

// How close two entries' files are, by digests alone: (0, n) when a binary of `mine`
// is one of `theirs` (unstable), else (1, n); n the files that differ or are missing.
std::pair<int, std::size_t> closeness(const std::map<std::string, File>& mine,
                                      const std::map<std::string, File>& theirs) {
    bool shared = false;
    std::size_t differ = 0;
    for (const auto& [path, f] : mine) {
        if (f.kind == Kind::skip) continue;
        auto it = theirs.find(path);
        if (it == theirs.end() || it->second.info.attr.digest != f.info.attr.digest) ++differ;
        if (f.kind != Kind::binary || f.info.attr.digest.empty()) continue;
        for (const auto& [their_path, g] : theirs) {
            shared = shared || (g.kind == Kind::binary && g.info.attr.digest == f.info.attr.digest);
        }
    }
    for (const auto& [path, g] : theirs) differ += g.kind != Kind::skip && !mine.count(path);
    return {shared ? 0 : 1, differ};
}

// An entry of the family to compare with: a local one (ino) or another node's member.
struct Other {
    Side side;
    Ino ino = 0;
    std::string name;
};

// The closest of `others` (newest first) to `mine`, compared in full, on top of `base`:
// by digests and metadata fields, one that holds this entry's binary (unstable) first,
// else the fewest differing fields, then files, the newest on a tie; the best
// kCandidates of them are compared in full and the closest by Distance is kept. nullopt when
// `others` is empty.
Result<std::optional<Miss>> closest(const Side& mine, const std::vector<Other>& others,
                                    const Miss& base) {
    const auto my_metadata = KCACHE_TRY(metadata_of(mine));
    struct Candidate {
        std::tuple<int, std::size_t, std::size_t> score;  // unstable, fields, files
        std::size_t order;                                // 0: the newest
    };
    std::vector<Candidate> candidates;
    for (std::size_t i = 0; i < others.size(); ++i) {
        const auto [shared, files] = closeness(mine.files, others[i].side.files);
        const auto fields = differing_fields(my_metadata, KCACHE_TRY(metadata_of(others[i].side)));
        candidates.push_back({std::make_tuple(shared, fields, files), i});
    }
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
        return std::tie(a.score, a.order) < std::tie(b.score, b.order);
    });
    std::optional<Miss> best;
    Distance best_distance;
    for (std::size_t i = 0; i < candidates.size() && i < kCandidates; ++i) {
        if (std::get<0>(candidates[i].score) != std::get<0>(candidates[0].score))
            break;  // unstable wins
        const Other& other = others[candidates[i].order];
        Miss candidate = base;
        candidate.compared = other.ino;
        candidate.compared_name = other.name;
        Distance distance;
        KCACHE_TRY(compare_impl(mine, other.side, candidate, &distance));
        if (!best || distance < best_distance) {
            best = std::move(candidate);
            best_distance = distance;
        }
    }
    return best;
}

// What a batch decided from its snapshot, written afterwards in one short write
// transaction (classify_pending): LMDB's writer lock is held for the writes only.
struct Plan {
    std::uint64_t to = 0;                                       // the position after it
    std::vector<std::pair<std::uint64_t, std::string>> misses;  // seq, record
    std::vector<Counter> counted;
    // By text key: the record to put, or nullopt to delete (capacity: consumed).
    std::map<std::string, std::optional<std::string>> evictions;
    std::map<std::string, bool> family_rows;        // family_key -> put (true) / delete
    std::map<std::string, std::vector<Ino>> added;  // family -> members added by it
};

// The eviction record of `name`: what the batch decided, else the table's.
Result<std::optional<std::string>> eviction_of(const Tx& tx, const Plan& plan,
                                               const std::string& key) {
    if (auto it = plan.evictions.find(key); it != plan.evictions.end()) return it->second;
    auto got = KCACHE_TRY(tx.get(tx.db.evictions, key));
    if (!got) return std::optional<std::string>();
    return std::optional<std::string>(std::string(*got));
}

// Classifies the populate event `e` of `entry` (nullopt: gone since) from the snapshot
// `txn`, deciding its writes in `plan`.
Result<Miss> classify(const Txn& txn, const Tx& tx, const Event& e,
                      const std::optional<EntryInfo>& entry, Plan& plan) {
    Miss m;
    m.seq = e.seq;
    m.time_ns = e.time_ns;
    m.entry = e.entry;
    if (entry) {
        m.name = entry->name;
        m.producer = entry->producer;
        m.stored_bytes = entry->stored_bytes;
    } else {
        auto dir = tx.path_of(e.parent);
        m.name = dir ? (dir->empty() ? e.name : *dir + "/" + e.name) : e.name;
        m.note = "the entry was gone before it was classified";
    }
    // Capacity: this very entry went before.
    if (auto gone = KCACHE_TRY(eviction_of(tx, plan, text_key(m.name))); gone) {
        auto ev = KCACHE_TRY(decode_eviction(*gone));
        if (ev.seq < e.seq) {
            m.cause = MissCause::capacity;
            m.gone_ns = ev.time_ns;
            m.gone_why = gone_why(ev.why);
            if (ev.why == EventKind::evict) {
                m.stack_distance =
                    KCACHE_TRY(stack_distance(txn, ev.entry, ev.seq, m.stored_bytes));
            }
            plan.evictions[text_key(m.name)] = std::nullopt;
        }
    }
    if (!entry) return m;
    m.family = KCACHE_TRY(family_of(txn, *entry));
    if (m.family.empty()) {
        if (m.cause != MissCause::capacity && entry->by_rule && m.producer != Producer::unknown)
            m.note = fmt::format("{}'s files name no kernel: no family to compare with",
                                 producer_name(m.producer));
        return m;
    }
    // The family's other entries in the cache, newest first.
    std::vector<Ino> members, gone;
    const std::string prefix = family_prefix(m.family);
    KCACHE_TRY(tx.scan(tx.db.families, prefix, prefix, [&](std::string_view key, std::string_view) {
        members.push_back(records::u64_from_key(key.substr(prefix.size())));
        return true;
    }));
    if (auto it = plan.added.find(m.family); it != plan.added.end())  // this batch's
        members.insert(members.end(), it->second.begin(), it->second.end());
    std::sort(members.begin(), members.end(), std::greater<>());  // inos grow: newest first
    members.erase(std::unique(members.begin(), members.end()), members.end());
    const auto mine = KCACHE_TRY(files_of(txn, *entry));
    std::vector<Other> others;
    for (Ino ino : members) {
        if (ino == entry->ino) continue;
        auto other = txn.entry(ino);
        if (!other && other.error().code == ENOENT) {
            gone.push_back(ino);
            continue;
        }
        if (!other) return tl::unexpected(other.error());
        if (!other->populated || others.size() >= kMaxCompared) continue;
        others.push_back({KCACHE_TRY(files_of(txn, *other)), other->ino, other->name});
    }
    std::optional<Miss> best = KCACHE_TRY(closest(mine, others, m));
    for (Ino ino : gone) plan.family_rows[family_key(m.family, ino)] = false;
    plan.family_rows[family_key(m.family, entry->ino)] = true;
    plan.added[m.family].push_back(entry->ino);
    if (!best) return m;
    if (m.cause == MissCause::capacity) {  // the cause stands; the family member is evidence
        best->cause = MissCause::capacity;
        best->note.clear();
    }
    return std::move(*best);
}

// Keeps the misses table at Config::max_events records, dropping the oldest.
Status trim_misses(Tx& tx) {
    MDB_stat st{};
    if (const int rc = mdb_stat(tx.txn, tx.db.misses, &st); rc != 0) {
        return tl::unexpected(lmdb::error(rc, "misses: stat"));
    }
    if (st.ms_entries <= tx.config.max_events) return {};
    std::size_t extra = st.ms_entries - tx.config.max_events;
    std::vector<std::string> old;
    KCACHE_TRY(tx.scan(tx.db.misses, {}, {}, [&](std::string_view key, std::string_view) {
        old.emplace_back(key);
        return old.size() < extra;
    }));
    for (const auto& k : old) KCACHE_TRY(tx.del(tx.db.misses, k));
    return {};
}

// Rows of the families table whose entry is gone are dropped when a miss of their
// family is classified; a family that never misses again keeps them, so once the table
// holds far more rows than there are entries, one pass drops every gone one.
Status trim_families(Tx& tx) {
    MDB_stat st{};
    if (const int rc = mdb_stat(tx.txn, tx.db.families, &st); rc != 0) {
        return tl::unexpected(lmdb::error(rc, "families: stat"));
    }
    const auto entries = KCACHE_TRY(tx.counter(Counter::entries));
    if (st.ms_entries <= 2 * entries + 1024) return {};
    std::vector<std::string> gone;
    KCACHE_TRY(tx.scan_checked(
        tx.db.families, {}, {}, [&](std::string_view key, std::string_view) -> Result<bool> {
            if (key.size() < 8) return true;
            const Ino ino = records::u64_from_key(key.substr(key.size() - 8));
            if (!KCACHE_TRY(tx.find_entry_record(ino))) gone.emplace_back(key);
            return true;
        }));
    for (const auto& k : gone) KCACHE_TRY(tx.del(tx.db.families, k));
    return {};
}

Status trim_evictions(Tx& tx) {
    MDB_stat st{};
    if (const int rc = mdb_stat(tx.txn, tx.db.evictions, &st); rc != 0) {
        return tl::unexpected(lmdb::error(rc, "evictions: stat"));
    }
    if (st.ms_entries <= tx.config.max_events) return {};
    // Rare (only past max_events evicted names that never came back): drop the older half.
    std::vector<std::pair<std::uint64_t, std::string>> all;
    KCACHE_TRY(tx.scan_checked(tx.db.evictions, {}, {},
                               [&](std::string_view key, std::string_view value) -> Result<bool> {
                                   auto e = KCACHE_TRY(decode_eviction(value));
                                   all.emplace_back(e.seq, std::string(key));
                                   return true;
                               }));
    std::sort(all.begin(), all.end());
    for (std::size_t i = 0; i < all.size() / 2; ++i) {
        KCACHE_TRY(tx.del(tx.db.evictions, all[i].second));
    }
    return {};
}

}  // namespace

// ---- public -------------------------------------------------------------------------

std::string_view miss_cause_name(MissCause cause) {
    switch (cause) {
        case MissCause::first:
            return "first";
        case MissCause::capacity:
            return "capacity";
        case MissCause::changed_key:
            return "changed_key";
        case MissCause::unstable_key:
            return "unstable_key";
    }
    return "unknown";
}

std::optional<MissCause> parse_miss_cause(std::string_view name) {
    for (MissCause c :
         {MissCause::first, MissCause::capacity, MissCause::changed_key, MissCause::unstable_key}) {
        if (name == miss_cause_name(c)) return c;
    }
    if (name == "changed") return MissCause::changed_key;
    if (name == "unstable") return MissCause::unstable_key;
    return std::nullopt;
}

Counter miss_cause_counter(MissCause cause) {
    switch (cause) {
        case MissCause::capacity:
            return Counter::misses_capacity;
        case MissCause::changed_key:
            return Counter::misses_changed_key;
        case MissCause::unstable_key:
            return Counter::misses_unstable_key;
        case MissCause::first:
            break;
    }
    return Counter::misses_first;
}

Result<std::string> family_of(const Txn& txn, const EntryInfo& entry) {
    if (entry.kind == EntryKind::stem) {
        if (entry.producer == Producer::jax || entry.stem.starts_with("jit_") ||
            entry.stem.starts_with("pmap_")) {
            return jax_family(entry);
        }
        return std::string();  // Inductor's modules, ccache, CuTe DSL, Helion: opaque
    }
    return family_from_files(KCACHE_TRY(files_of(txn, entry)));
}

Status compare_entries(const Txn& txn, const EntryInfo& missed, const EntryInfo& other, Miss& out) {
    out.compared = other.ino;
    out.compared_name = other.name;
    return compare_impl(KCACHE_TRY(files_of(txn, missed)), KCACHE_TRY(files_of(txn, other)), out,
                        nullptr);
}

namespace {

Status compare_impl(const Side& mine_side, const Side& their_side, Miss& out, Distance* distance) {
    std::size_t differing = 0;
    out.fields.clear();
    out.lines.clear();
    out.same_binary.clear();
    const auto& mine = mine_side.files;
    const auto& theirs = their_side.files;
    std::vector<std::pair<int, LineDiff>> lines;
    for (const auto& [path, f] : mine) {
        if (f.kind == Kind::skip) continue;
        auto it = theirs.find(path);
        if (f.kind == Kind::binary && out.same_binary.empty()) {
            // Unstable: this binary is held by the other entry, under any of its names.
            for (const auto& [their_path, g] : theirs) {
                if (g.kind == Kind::binary && !f.info.attr.digest.empty() &&
                    g.info.attr.digest == f.info.attr.digest) {
                    out.same_binary = path;
                }
            }
        }
        if (it == theirs.end()) {
            lines.push_back({ir_rank(path), LineDiff{path, 0, "(no such file)",
                                                     fmt::format("{} bytes", f.info.attr.size)}});
            continue;
        }
        const File& g = it->second;
        if (g.info.attr.digest == f.info.attr.digest) continue;
        const bool texts = has_text(f) && has_text(g);
        const bool whole = f.whole && g.whole;
        if (f.kind == Kind::metadata && texts && whole) {
            auto a = KCACHE_TRY(content_of(their_side, g));
            auto b = KCACHE_TRY(content_of(mine_side, f));
            auto fa = json_fields(a);
            auto fb = json_fields(b);
            if (fa && fb) {
                std::set<std::string> keys;
                for (const auto& kv : *fa) keys.insert(kv.first);
                for (const auto& kv : *fb) keys.insert(kv.first);
                for (const auto& k : keys) {
                    if (k == "hash") continue;  // Triton's key itself: differs by definition
                    const auto va = fa->count(k) ? fa->at(k) : std::string();
                    const auto vb = fb->count(k) ? fb->at(k) : std::string();
                    if (va != vb && out.fields.size() < kMaxFields) {
                        out.fields.push_back({path, k, cut(va), cut(vb)});
                    }
                }
                continue;
            }
        }
        if ((f.kind == Kind::metadata || f.kind == Kind::text) && texts) {
            auto a = KCACHE_TRY(content_of(their_side, g));
            auto b = KCACHE_TRY(content_of(mine_side, f));
            if (!whole) {
                // A member holds the first whole lines only: compare the lines both hold.
                const std::size_t n = std::min(line_count(a), line_count(b));
                a = std::string(first_lines(a, n));
                b = std::string(first_lines(b, n));
            }
            differing += differing_lines(a, b);
            if (auto d = first_line_diff(a, b)) {
                d->file = path;
                lines.push_back({ir_rank(path), std::move(*d)});
            } else if (!whole) {
                lines.push_back(
                    {ir_rank(path), LineDiff{path, 0, fmt::format("{} bytes", g.info.attr.size),
                                             fmt::format("{} bytes, the first {} lines the same",
                                                         f.info.attr.size, line_count(a))}});
            }
            continue;
        }
        // Binary, or too big for lines: the sizes and the first differing byte (local
        // entries; a member holds no binary).
        std::string where;
        if (texts && !f.held && !g.held) {
            auto a = KCACHE_TRY(content_of(their_side, g));
            auto b = KCACHE_TRY(content_of(mine_side, f));
            const auto n = std::min(a.size(), b.size());
            std::size_t at = 0;
            while (at < n && a[at] == b[at]) ++at;
            where = fmt::format(", first difference at byte {}", at);
        }
        lines.push_back(
            {100 + ir_rank(path), LineDiff{path, 0, fmt::format("{} bytes", g.info.attr.size),
                                           fmt::format("{} bytes{}", f.info.attr.size, where)}});
    }
    for (const auto& [path, g] : theirs) {
        if (g.kind != Kind::skip && !mine.count(path)) {
            lines.push_back(
                {ir_rank(path),
                 LineDiff{path, 0, fmt::format("{} bytes", g.info.attr.size), "(no such file)"}});
        }
    }
    std::stable_sort(lines.begin(), lines.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [rank, l] : lines) {
        if (out.lines.size() >= kMaxLineFiles) break;
        out.lines.push_back(std::move(l));
    }
    if (distance) *distance = {out.fields.size(), differing};
    out.cause = out.same_binary.empty() ? MissCause::changed_key : MissCause::unstable_key;
    if (out.cause == MissCause::unstable_key && out.fields.empty() && out.lines.empty()) {
        out.note =
            "the stored files differ in the key only: what changed it is not stored (a "
            "comment, a path, a field the compiler hashes but does not write)";
    }
    return {};
}

}  // namespace

Result<std::size_t> classify_pending(Store& store, std::size_t max_events) {
    if (store.read_only() || !TxnAccess::impl(store).has_misses) return 0;
    {
        // Nothing to classify: no write transaction (a commit may sync). Events the
        // classifier ignores (hits, pins) are passed over with the next batch, or once
        // enough of them pile up.
        auto txn = KCACHE_TRY(store.read());
        const Tx tx = TxnAccess::tx(txn);
        auto at = KCACHE_TRY(tx.get(tx.db.meta, kMetaMissesSeq));
        const std::uint64_t pos = at ? KCACHE_TRY(records::decode_u64(*at, "misses_seq")) : 0;
        std::optional<Event> first;
        std::size_t seen = 0;
        KCACHE_TRY(txn.for_each_event(pos, [&](const Event& e) {
            if (e.kind == EventKind::populate || e.kind == EventKind::evict ||
                e.kind == EventKind::remove || ++seen >= max_events) {
                first = e;
            }
            return !first;
        }));
        if (!first) return 0;
        if (first->kind == EventKind::populate && !KCACHE_TRY(settled(txn, *first, store.now_ns())))
            return 0;
    }
    // The comparisons, from snapshots: no writer lock held, so stores go on meanwhile.
    // One short snapshot per event: a reader keeps LMDB from reusing the pages that
    // commits free while it lives, so a snapshot held across a batch (longer still when
    // this low-priority thread is preempted in it) grows the db that stores then write.
    Plan plan;
    std::uint64_t from = 0;
    std::vector<Event> events;
    {
        auto txn = KCACHE_TRY(store.read());
        const Tx tx = TxnAccess::tx(txn);
        auto at = KCACHE_TRY(tx.get(tx.db.meta, kMetaMissesSeq));
        from = at ? KCACHE_TRY(records::decode_u64(*at, "misses_seq")) : 0;
        KCACHE_TRY(txn.for_each_event(from, [&](const Event& e) {
            events.push_back(e);
            return events.size() < max_events;
        }));
    }
    plan.to = from;
    const std::int64_t now = store.now_ns();
    const std::int64_t started = steady_ns();
    for (const Event& e : events) {
        if (e.kind == EventKind::evict || e.kind == EventKind::remove) {
            auto txn = KCACHE_TRY(store.read());
            auto dir = TxnAccess::tx(txn).path_of(e.parent);
            if (dir && !e.name.empty()) {
                const std::string name = dir->empty() ? e.name : *dir + "/" + e.name;
                plan.evictions[text_key(name)] =
                    encode_eviction({e.seq, e.time_ns, e.entry, e.kind});
            }
        } else if (e.kind == EventKind::populate) {
            auto txn = KCACHE_TRY(store.read());
            const Tx tx = TxnAccess::tx(txn);
            std::optional<EntryInfo> entry;
            if (auto found = txn.entry(e.entry); found) {
                entry = std::move(*found);
            } else if (found.error().code != ENOENT) {
                return tl::unexpected(found.error());
            }
            if (entry && !KCACHE_TRY(settled(txn, e, now))) break;
            Miss m = KCACHE_TRY(classify(txn, tx, e, entry, plan));
            plan.misses.emplace_back(e.seq, encode_miss(m));
            plan.counted.push_back(miss_cause_counter(m.cause));
        }
        plan.to = e.seq;
        if (steady_ns() - started >= kBatchBudgetNs) break;  // the next call goes on
    }
    if (plan.to == from) return 0;
    // The writes: short. Another process may have classified these meanwhile (its batch
    // moved the position): then this plan is dropped and the next call goes on from there.
    std::size_t classified = 0;
    KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
        Tx tx = TxnAccess::tx(txn);
        auto at = KCACHE_TRY(tx.get(tx.db.meta, kMetaMissesSeq));
        const std::uint64_t pos = at ? KCACHE_TRY(records::decode_u64(*at, "misses_seq")) : 0;
        if (pos != from) return {};
        for (const auto& [key, record] : plan.evictions) {
            if (record) {
                KCACHE_TRY(tx.put(tx.db.evictions, key, *record));
            } else {
                KCACHE_TRY(tx.del(tx.db.evictions, key));
            }
        }
        for (const auto& [key, put] : plan.family_rows) {
            if (put) {
                KCACHE_TRY(tx.put(tx.db.families, key, {}));
            } else {
                KCACHE_TRY(tx.del(tx.db.families, key));
            }
        }
        for (const auto& [seq, record] : plan.misses)
            KCACHE_TRY(tx.put(tx.db.misses, records::u64_key(seq), record));
        for (Counter c : plan.counted) KCACHE_TRY(tx.add(c, 1));
        classified = plan.misses.size();
        KCACHE_TRY(tx.put(tx.db.meta, kMetaMissesSeq, records::encode_u64(plan.to)));
        KCACHE_TRY(trim_misses(tx));
        KCACHE_TRY(trim_families(tx));
        return trim_evictions(tx);
    }));
    return classified;
}

Status for_each_miss(const Txn& txn, std::int64_t since_ns,
                     const std::function<bool(const Miss&)>& fn) {
    const Tx tx = TxnAccess::tx(txn);
    if (!tx.db.has_misses) return {};
    lmdb::Cursor cursor;
    if (const int rc = cursor.open(tx.txn, tx.db.misses); rc != 0) {
        return tl::unexpected(lmdb::error(rc, "misses: cursor"));
    }
    MDB_val k{}, v{};
    int rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_LAST);
    while (rc == 0) {
        auto m = KCACHE_TRY(decode_miss(records::u64_from_key(lmdb::view(k)), lmdb::view(v)));
        if (m.time_ns < since_ns) break;
        if (!fn(m)) return {};
        rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_PREV);
    }
    if (rc != 0 && rc != MDB_NOTFOUND) return tl::unexpected(lmdb::error(rc, "misses: scan"));
    return {};
}

Result<std::optional<Miss>> find_miss(const Txn& txn, std::string_view name) {
    std::optional<Miss> found;
    KCACHE_TRY(for_each_miss(txn, 0, [&](const Miss& m) {
        if (m.name != name) return true;
        found = m;
        return false;
    }));
    return found;
}

Result<std::uint64_t> pending_misses(const Txn& txn) {
    const Tx tx = TxnAccess::tx(txn);
    if (!tx.db.has_misses) return 0;
    auto at = KCACHE_TRY(tx.get(tx.db.meta, kMetaMissesSeq));
    const std::uint64_t pos = at ? KCACHE_TRY(records::decode_u64(*at, "misses_seq")) : 0;
    std::uint64_t n = 0;
    KCACHE_TRY(txn.for_each_event(pos, [&](const Event& e) {
        n += e.kind == EventKind::populate ? 1 : 0;
        return true;
    }));
    return n;
}

Result<MissTables> miss_tables(const Txn& txn) {
    const Tx tx = TxnAccess::tx(txn);
    MissTables out;
    if (!tx.db.has_misses) return out;
    for (auto [dbi, field] : {std::pair{tx.db.misses, &MissTables::misses},
                              std::pair{tx.db.evictions, &MissTables::evictions},
                              std::pair{tx.db.families, &MissTables::families}}) {
        MDB_stat st{};
        if (const int rc = mdb_stat(tx.txn, dbi, &st); rc != 0) {
            return tl::unexpected(lmdb::error(rc, "misses: stat"));
        }
        out.*field = st.ms_entries;
    }
    return out;
}

Result<Sizing> capacity_sizing(const Txn& txn, std::int64_t since_ns) {
    Sizing out;
    out.bound = txn.config().max_bytes;
    std::vector<std::uint64_t> distances;
    KCACHE_TRY(for_each_miss(txn, since_ns, [&](const Miss& m) {
        ++out.misses;
        if (m.cause == MissCause::capacity) {
            ++out.capacity;
            if (m.stack_distance) distances.push_back(m.stack_distance);
        }
        return true;
    }));
    if (!distances.empty()) out.avoid_all = *std::max_element(distances.begin(), distances.end());
    std::vector<std::uint64_t> sizes;
    if (out.bound) {
        for (double f : {1.0, 1.5, 2.0, 4.0}) {
            sizes.push_back(static_cast<std::uint64_t>(static_cast<double>(out.bound) * f));
        }
    }
    if (out.avoid_all) {
        for (std::uint64_t div : {4, 2, 1}) sizes.push_back(out.avoid_all / div);
    }
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    const std::uint64_t unknown = out.capacity - distances.size();  // removed: no distance
    for (std::uint64_t size : sizes) {
        SizingPoint p{size, unknown};
        for (std::uint64_t d : distances) p.capacity_misses += d > size ? 1 : 0;
        out.curve.push_back(p);
    }
    return out;
}

// ---- across nodes ---------------------------------------------------------------------

namespace {

// Member files in the order they earn their room: metadata (the fields), binaries (the
// unstable check: a digest each), then source and IR as a compile produces them.
int member_rank(const std::string& path, Kind kind) {
    if (kind == Kind::metadata) return 0;
    if (kind == Kind::binary) return 1;
    return 2 + ir_rank(path);
}

Side side_of(const FamilyMember& m) {
    Side out;
    for (const MemberFile& f : m.files) {
        File file;
        file.info.path = f.path;
        file.info.attr.size = f.size;
        file.info.attr.digest = f.digest;
        file.kind = f.kind == MemberKind::metadata ? Kind::metadata
                    : f.kind == MemberKind::text   ? Kind::text
                                                   : Kind::binary;
        file.held = f.text;
        file.whole = f.whole;
        out.files[f.path] = std::move(file);
    }
    return out;
}

}  // namespace

Result<std::optional<FamilyMember>> family_member(const Txn& txn, const EntryInfo& entry) {
    std::string family = KCACHE_TRY(family_of(txn, entry));
    if (family.empty()) return std::optional<FamilyMember>();
    const Side side = KCACHE_TRY(files_of(txn, entry));
    std::vector<std::tuple<int, std::string, const File*>> order;
    for (const auto& [path, f] : side.files) {
        if (f.kind != Kind::skip) order.emplace_back(member_rank(path, f.kind), path, &f);
    }
    std::sort(order.begin(), order.end());
    FamilyMember out;
    out.entry = entry.name;
    out.family = std::move(family);
    std::size_t budget = kMemberMaxBytes;
    for (const auto& [rank, path, f] : order) {
        if (out.files.size() >= kMemberMaxFiles) break;
        MemberFile m;
        m.path = path;
        m.kind = f->kind == Kind::metadata ? MemberKind::metadata
                 : f->kind == Kind::text   ? MemberKind::text
                                           : MemberKind::binary;
        m.size = f->info.attr.size;
        m.digest = f->info.attr.digest;
        if (f->kind == Kind::metadata && m.size <= kMemberMetadataBytes && m.size <= budget) {
            m.text = KCACHE_TRY(content_of(side, *f));
            m.whole = m.text.size() == m.size;
        } else if (f->kind == Kind::text && m.size <= kMaxTextBytes) {
            std::string text = KCACHE_TRY(content_of(side, *f));
            if (text.size() <= kMemberTextBytes) {
                m.whole = text.size() == m.size;
            } else {  // the first whole lines that fit
                const auto nl = std::string_view(text).substr(0, kMemberTextBytes).rfind('\n');
                text.resize(nl == std::string_view::npos ? 0 : nl + 1);
            }
            if (text.size() <= budget)
                m.text = std::move(text);
            else
                m.whole = false;
        }
        budget -= m.text.size();
        out.files.push_back(std::move(m));
    }
    return std::optional<FamilyMember>(std::move(out));
}

Result<std::vector<Miss>> first_misses(const Txn& txn, std::uint64_t after_seq, std::size_t max) {
    std::vector<Miss> out;
    const Tx tx = TxnAccess::tx(txn);
    if (!tx.db.has_misses || max == 0) return out;
    KCACHE_TRY(tx.scan_checked(tx.db.misses, {}, records::u64_key(after_seq + 1),
                               [&](std::string_view key, std::string_view value) -> Result<bool> {
                                   auto m =
                                       KCACHE_TRY(decode_miss(records::u64_from_key(key), value));
                                   if (m.cause == MissCause::first && !m.family.empty())
                                       out.push_back(std::move(m));
                                   return out.size() < max;
                               }));
    return out;
}

Result<bool> explain_with_members(Store& store, std::uint64_t seq,
                                  const std::vector<FamilyMember>& members, std::string_view ns) {
    if (store.read_only() || !TxnAccess::impl(store).has_misses) return false;
    std::optional<Miss> best;
    {  // the comparison, from a snapshot: no writer lock held
        auto txn = KCACHE_TRY(store.read());
        const Tx tx = TxnAccess::tx(txn);
        auto record = KCACHE_TRY(tx.get(tx.db.misses, records::u64_key(seq)));
        if (!record) return false;
        const Miss m = KCACHE_TRY(decode_miss(seq, *record));
        if (m.cause != MissCause::first || m.family.empty()) return false;
        auto entry = txn.entry(m.entry);
        if (!entry) {
            if (entry.error().code == ENOENT) return false;
            return tl::unexpected(entry.error());
        }
        if (entry->name != m.name) return false;
        const auto mine = KCACHE_TRY(family_member(txn, *entry));
        if (!mine || mine->family != m.family) return false;
        // Newest first, as local members are; one per name (a hash field is one).
        std::vector<const FamilyMember*> sorted;
        for (const FamilyMember& f : members) {
            if (f.family == m.family && f.entry != m.name) sorted.push_back(&f);
        }
        std::stable_sort(
            sorted.begin(), sorted.end(),
            [](const FamilyMember* a, const FamilyMember* b) { return a->time_ns > b->time_ns; });
        std::vector<Other> others;
        std::vector<const FamilyMember*> owners;
        for (const FamilyMember* f : sorted) {
            others.push_back({side_of(*f), 0, f->entry});
            owners.push_back(f);
        }
        best = KCACHE_TRY(closest(side_of(*mine), others, m));
        if (!best) return false;
        for (std::size_t i = 0; i < others.size(); ++i) {
            if (others[i].name == best->compared_name) best->compared_host = owners[i]->host;
        }
        best->compared_namespace = std::string(ns);
        if (best->cause == MissCause::changed_key && best->fields.empty() && best->lines.empty())
            return false;  // nothing told apart from what a member holds: not evidence
    }
    bool changed = false;
    KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
        Tx tx = TxnAccess::tx(txn);
        auto record = KCACHE_TRY(tx.get(tx.db.misses, records::u64_key(seq)));
        if (!record) return {};  // trimmed meanwhile
        const Miss now = KCACHE_TRY(decode_miss(seq, *record));
        if (now.cause != MissCause::first) return {};  // another pass explained it
        KCACHE_TRY(tx.put(tx.db.misses, records::u64_key(seq), encode_miss(*best)));
        KCACHE_TRY(tx.add(Counter::misses_first, -1));
        KCACHE_TRY(tx.add(miss_cause_counter(best->cause), 1));
        changed = true;
        return {};
    }));
    return changed;
}

}  // namespace kcache::core
