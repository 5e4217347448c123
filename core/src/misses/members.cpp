// Misses explained across nodes (misses.hpp, "across nodes"): an entry as a family
// member small enough to travel, and a "first" miss compared with other nodes' members.
#include <algorithm>
#include <tuple>

#include "misses/misses_impl.hpp"
#include "records.hpp"

namespace kcache::core {
namespace misses {
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

// The member file of `f`, holding what fits of its text in `budget` (which it uses).
Result<MemberFile> member_file(const Side& side, const std::string& path, const File& f,
                               std::size_t& budget) {
    MemberFile m;
    m.path = path;
    m.kind = f.kind == Kind::metadata ? MemberKind::metadata
             : f.kind == Kind::text   ? MemberKind::text
                                      : MemberKind::binary;
    m.size = f.info.attr.size;
    m.digest = f.info.attr.digest;
    if (f.kind == Kind::metadata && m.size <= kMemberMetadataBytes && m.size <= budget) {
        m.text = KCACHE_TRY(content_of(side, f));
        m.whole = m.text.size() == m.size;
    } else if (f.kind == Kind::text && m.size <= kMaxTextBytes) {
        std::string text = KCACHE_TRY(content_of(side, f));
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
    return m;
}

// Miss `seq` compared with the closest of `members` from a snapshot: nullopt when it is
// not a first miss of a family any more, its entry is gone, or no member tells it apart.
Result<std::optional<Miss>> explained(Store& store, std::uint64_t seq,
                                      const std::vector<FamilyMember>& members,
                                      std::string_view ns) {
    const std::optional<Miss> none;
    auto txn = KCACHE_TRY(store.read());
    const Tx tx = TxnAccess::tx(txn);
    auto record = KCACHE_TRY(tx.get(tx.db.misses, records::u64_key(seq)));
    if (!record) return none;
    const Miss m = KCACHE_TRY(records::decode_miss(seq, *record));
    if (m.cause != MissCause::first || m.family.empty()) return none;
    auto entry = txn.entry(m.entry);
    if (!entry) {
        if (entry.error().code == ENOENT) return none;
        return tl::unexpected(entry.error());
    }
    if (entry->name != m.name) return none;
    const auto mine = KCACHE_TRY(family_member(txn, *entry));
    if (!mine || mine->family != m.family) return none;
    // Newest first, as local members are; one per name (a hash field is one).
    std::vector<const FamilyMember*> sorted;
    for (const FamilyMember& f : members) {
        if (f.family == m.family && f.entry != m.name) sorted.push_back(&f);
    }
    std::stable_sort(
        sorted.begin(), sorted.end(),
        [](const FamilyMember* a, const FamilyMember* b) { return a->time_ns > b->time_ns; });
    std::vector<Other> others;
    for (const FamilyMember* f : sorted) others.push_back({side_of(*f), 0, f->entry});
    auto best = KCACHE_TRY(closest(side_of(*mine), others, m));
    if (!best) return none;
    for (std::size_t i = 0; i < others.size(); ++i) {
        if (others[i].name == best->compared_name) best->compared_host = sorted[i]->host;
    }
    best->compared_namespace = std::string(ns);
    if (best->cause == MissCause::changed_key && best->fields.empty() && best->lines.empty())
        return none;  // nothing told apart from what a member holds: not evidence
    return best;
}

}  // namespace
}  // namespace misses

Result<std::optional<FamilyMember>> family_member(const Txn& txn, const EntryInfo& entry) {
    using namespace misses;
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
        out.files.push_back(KCACHE_TRY(member_file(side, path, *f, budget)));
    }
    return std::optional<FamilyMember>(std::move(out));
}

Result<std::vector<Miss>> first_misses(const Txn& txn, std::uint64_t after_seq, std::size_t max) {
    std::vector<Miss> out;
    const Tx tx = TxnAccess::tx(txn);
    if (!tx.db.has_misses || max == 0) return out;
    KCACHE_TRY(tx.scan_checked(tx.db.misses, {}, records::u64_key(after_seq + 1),
                               [&](std::string_view key, std::string_view value) -> Result<bool> {
                                   auto m = KCACHE_TRY(
                                       records::decode_miss(records::u64_from_key(key), value));
                                   if (m.cause == MissCause::first && !m.family.empty())
                                       out.push_back(std::move(m));
                                   return out.size() < max;
                               }));
    return out;
}

Result<bool> explain_with_members(Store& store, std::uint64_t seq,
                                  const std::vector<FamilyMember>& members, std::string_view ns) {
    if (store.read_only() || !TxnAccess::impl(store).has_misses) return false;
    // The comparison, from a snapshot: no writer lock held.
    const std::optional<Miss> best = KCACHE_TRY(misses::explained(store, seq, members, ns));
    if (!best) return false;
    bool changed = false;
    KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
        Tx tx = TxnAccess::tx(txn);
        auto record = KCACHE_TRY(tx.get(tx.db.misses, records::u64_key(seq)));
        if (!record) return {};  // trimmed meanwhile
        const Miss now = KCACHE_TRY(records::decode_miss(seq, *record));
        if (now.cause != MissCause::first) return {};  // another pass explained it
        KCACHE_TRY(tx.put(tx.db.misses, records::u64_key(seq), records::encode(*best)));
        KCACHE_TRY(tx.add(Counter::misses_first, -1));
        KCACHE_TRY(tx.add(miss_cause_counter(best->cause), 1));
        changed = true;
        return {};
    }));
    return changed;
}

}  // namespace kcache::core
