// The comparison of two entries of one family (misses.hpp): the metadata fields and the
// first lines that differ, a binary both hold (unstable key); and the choice of the
// closest of several.
#include <algorithm>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "misses/misses_impl.hpp"
#include "records.hpp"

namespace kcache::core {
namespace misses {
namespace {

constexpr std::size_t kCandidates = 2;  // of the family's entries, the closest compared in full

using records::cut_line;

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
                            cut_line(a.empty() ? "(end of file)" : la),
                            cut_line(b.empty() ? "(end of file)" : lb)};
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

// One comparison under way: its two sides, what it found (in `out`, and the files'
// lines by rank, sorted at the end) and how many text lines differ.
struct Comparison {
    const Side& mine;
    const Side& theirs;
    Miss& out;
    std::vector<std::pair<int, LineDiff>> lines;
    std::size_t differing = 0;
};

// Unstable: `f`, a binary of mine, is held by the other entry under any of its names.
void find_same_binary(Comparison& c, const std::string& path, const File& f) {
    if (f.kind != Kind::binary || !c.out.same_binary.empty()) return;
    for (const auto& [their_path, g] : c.theirs.files) {
        if (g.kind == Kind::binary && !f.info.attr.digest.empty() &&
            g.info.attr.digest == f.info.attr.digest) {
            c.out.same_binary = path;
        }
    }
}

// Two JSON metadata files, field by field; false when either is not a JSON object.
Result<bool> compare_fields(Comparison& c, const std::string& path, const File& f, const File& g) {
    auto a = KCACHE_TRY(content_of(c.theirs, g));
    auto b = KCACHE_TRY(content_of(c.mine, f));
    auto fa = json_fields(a);
    auto fb = json_fields(b);
    if (!fa || !fb) return false;
    std::set<std::string> keys;
    for (const auto& kv : *fa) keys.insert(kv.first);
    for (const auto& kv : *fb) keys.insert(kv.first);
    for (const auto& k : keys) {
        if (k == "hash") continue;  // Triton's key itself: differs by definition
        const auto va = fa->count(k) ? fa->at(k) : std::string();
        const auto vb = fb->count(k) ? fb->at(k) : std::string();
        if (va != vb && c.out.fields.size() < kMaxFields) {
            c.out.fields.push_back({path, k, cut_line(va), cut_line(vb)});
        }
    }
    return true;
}

// Two texts, line by line (a member's first lines only, when one is not whole).
Status compare_lines(Comparison& c, const std::string& path, const File& f, const File& g,
                     bool whole) {
    auto a = KCACHE_TRY(content_of(c.theirs, g));
    auto b = KCACHE_TRY(content_of(c.mine, f));
    if (!whole) {
        // A member holds the first whole lines only: compare the lines both hold.
        const std::size_t n = std::min(line_count(a), line_count(b));
        a = std::string(first_lines(a, n));
        b = std::string(first_lines(b, n));
    }
    c.differing += differing_lines(a, b);
    if (auto d = first_line_diff(a, b)) {
        d->file = path;
        c.lines.push_back({ir_rank(path), std::move(*d)});
    } else if (!whole) {
        c.lines.push_back(
            {ir_rank(path), LineDiff{path, 0, fmt::format("{} bytes", g.info.attr.size),
                                     fmt::format("{} bytes, the first {} lines the same",
                                                 f.info.attr.size, line_count(a))}});
    }
    return {};
}

// Binary, or too big for lines: the sizes and the first differing byte (local entries;
// a member holds no binary).
Status compare_bytes(Comparison& c, const std::string& path, const File& f, const File& g,
                     bool texts) {
    std::string where;
    if (texts && !f.held && !g.held) {
        auto a = KCACHE_TRY(content_of(c.theirs, g));
        auto b = KCACHE_TRY(content_of(c.mine, f));
        const auto n = std::min(a.size(), b.size());
        std::size_t at = 0;
        while (at < n && a[at] == b[at]) ++at;
        where = fmt::format(", first difference at byte {}", at);
    }
    c.lines.push_back(
        {100 + ir_rank(path), LineDiff{path, 0, fmt::format("{} bytes", g.info.attr.size),
                                       fmt::format("{} bytes{}", f.info.attr.size, where)}});
    return {};
}

// My file `f` at `path` against theirs of that path.
Status compare_file(Comparison& c, const std::string& path, const File& f) {
    find_same_binary(c, path, f);
    auto it = c.theirs.files.find(path);
    if (it == c.theirs.files.end()) {
        c.lines.push_back({ir_rank(path), LineDiff{path, 0, "(no such file)",
                                                   fmt::format("{} bytes", f.info.attr.size)}});
        return {};
    }
    const File& g = it->second;
    if (g.info.attr.digest == f.info.attr.digest) return {};
    const bool texts = has_text(f) && has_text(g);
    const bool whole = f.whole && g.whole;
    if (f.kind == Kind::metadata && texts && whole) {
        if (KCACHE_TRY(compare_fields(c, path, f, g))) return {};
    }
    if ((f.kind == Kind::metadata || f.kind == Kind::text) && texts)
        return compare_lines(c, path, f, g, whole);
    return compare_bytes(c, path, f, g, texts);
}

Status compare_sides(const Side& mine, const Side& theirs, Miss& out, Distance* distance) {
    out.fields.clear();
    out.lines.clear();
    out.same_binary.clear();
    Comparison c{mine, theirs, out, {}, 0};
    for (const auto& [path, f] : mine.files) {
        if (f.kind != Kind::skip) KCACHE_TRY(compare_file(c, path, f));
    }
    for (const auto& [path, g] : theirs.files) {
        if (g.kind != Kind::skip && !mine.files.count(path)) {
            c.lines.push_back(
                {ir_rank(path),
                 LineDiff{path, 0, fmt::format("{} bytes", g.info.attr.size), "(no such file)"}});
        }
    }
    std::stable_sort(c.lines.begin(), c.lines.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [rank, l] : c.lines) {
        if (out.lines.size() >= kMaxLineFiles) break;
        out.lines.push_back(std::move(l));
    }
    if (distance) *distance = {out.fields.size(), c.differing};
    out.cause = out.same_binary.empty() ? MissCause::changed_key : MissCause::unstable_key;
    if (out.cause == MissCause::unstable_key && out.fields.empty() && out.lines.empty()) {
        out.note =
            "the stored files differ in the key only: what changed it is not stored (a "
            "comment, a path, a field the compiler hashes but does not write)";
    }
    return {};
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

}  // namespace

int ir_rank(std::string_view path) {
    constexpr std::string_view kOrder[] = {".source", ".py",   ".ttir", ".ttgir",
                                           ".mlir",   ".llir", ".ll",   ".ptx"};
    for (std::size_t i = 0; i < std::size(kOrder); ++i) {
        if (path.ends_with(kOrder[i])) return static_cast<int>(i);
    }
    return static_cast<int>(std::size(kOrder));
}

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
        KCACHE_TRY(compare_sides(mine, other.side, candidate, &distance));
        if (!best || distance < best_distance) {
            best = std::move(candidate);
            best_distance = distance;
        }
    }
    return best;
}

}  // namespace misses

Status compare_entries(const Txn& txn, const EntryInfo& missed, const EntryInfo& other, Miss& out) {
    out.compared = other.ino;
    out.compared_name = other.name;
    return misses::compare_sides(KCACHE_TRY(misses::files_of(txn, missed)),
                                 KCACHE_TRY(misses::files_of(txn, other)), out, nullptr);
}

}  // namespace kcache::core
