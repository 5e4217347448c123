// The background classifier (misses.hpp, classify_pending): follows the events log,
// classifies each populate event's miss from a snapshot, and writes what a batch
// decided in one short write transaction.
#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>

#include "kcache/core/roles.hpp"
#include "misses/misses_impl.hpp"
#include "records.hpp"

namespace kcache::core {
namespace misses {
namespace {

constexpr std::size_t kMaxCompared = 8;            // the newest entries of a family looked at
constexpr std::size_t kMaxDistanceEvents = 20000;  // events read for one stack distance
// A batch's comparisons stop after this long (after one event at least); the next call
// goes on. They run from a snapshot: LMDB's writer lock is held only for the batch's
// writes afterwards, a short transaction.
constexpr std::int64_t kBatchBudgetNs = 5'000'000;

std::string_view gone_why(EventKind k) {
    return k == EventKind::evict ? "evicted (the size bound, kcache evict or clear)"
                                 : "removed (unlinked or replaced by a process)";
}

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

// What a batch decided from its snapshot, written afterwards in one short write
// transaction (classify_pending): LMDB's writer lock is held for the writes only.
struct Plan {
    std::uint64_t from = 0;                                     // the position before it
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

// Capacity: this very entry (`m.name`) went before event `e`. Its eviction record
// becomes the miss's evidence, and is consumed.
Status capacity_evidence(const Txn& txn, const Tx& tx, const Event& e, Plan& plan, Miss& m) {
    auto gone = KCACHE_TRY(eviction_of(tx, plan, text_key(m.name)));
    if (!gone) return {};
    auto ev = KCACHE_TRY(records::decode_eviction(*gone));
    if (ev.seq >= e.seq) return {};
    m.cause = MissCause::capacity;
    m.gone_ns = ev.time_ns;
    m.gone_why = gone_why(ev.why);
    if (ev.why == EventKind::evict) {
        m.stack_distance = KCACHE_TRY(stack_distance(txn, ev.entry, ev.seq, m.stored_bytes));
    }
    plan.evictions[text_key(m.name)] = std::nullopt;
    return {};
}

// The other entries of `family` in the cache to compare `entry` with: the families
// table's and this batch's, newest first, the first kMaxCompared populated ones. Those
// gone since go to `gone`.
Result<std::vector<Other>> family_others(const Txn& txn, const Tx& tx, const EntryInfo& entry,
                                         const std::string& family, const Plan& plan,
                                         std::vector<Ino>& gone) {
    std::vector<Ino> members;
    const std::string prefix = family_prefix(family);
    KCACHE_TRY(tx.scan(tx.db.families, prefix, prefix, [&](std::string_view key, std::string_view) {
        members.push_back(records::u64_from_key(key.substr(prefix.size())));
        return true;
    }));
    if (auto it = plan.added.find(family); it != plan.added.end())  // this batch's
        members.insert(members.end(), it->second.begin(), it->second.end());
    std::sort(members.begin(), members.end(), std::greater<>());  // inos grow: newest first
    members.erase(std::unique(members.begin(), members.end()), members.end());
    std::vector<Other> others;
    for (Ino ino : members) {
        if (ino == entry.ino) continue;
        auto other = txn.entry(ino);
        if (!other && other.error().code == ENOENT) {
            gone.push_back(ino);
            continue;
        }
        if (!other) return tl::unexpected(other.error());
        if (!other->populated || others.size() >= kMaxCompared) continue;
        others.push_back({KCACHE_TRY(files_of(txn, *other)), other->ino, other->name});
    }
    return others;
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
    KCACHE_TRY(capacity_evidence(txn, tx, e, plan, m));
    if (!entry) return m;
    m.family = KCACHE_TRY(family_of(txn, *entry));
    if (m.family.empty()) {
        if (m.cause != MissCause::capacity && entry->by_rule && m.producer != Producer::unknown)
            m.note = fmt::format("{}'s files name no kernel: no family to compare with",
                                 producer_name(m.producer));
        return m;
    }
    std::vector<Ino> gone;
    const auto others = KCACHE_TRY(family_others(txn, tx, *entry, m.family, plan, gone));
    const auto mine = KCACHE_TRY(files_of(txn, *entry));
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
    const std::uint64_t rows = KCACHE_TRY(records_in(tx, tx.db.misses, "misses"));
    if (rows <= tx.config.max_events) return {};
    std::size_t extra = rows - tx.config.max_events;
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
    const std::uint64_t rows = KCACHE_TRY(records_in(tx, tx.db.families, "families"));
    const auto entries = KCACHE_TRY(tx.counter(Counter::entries));
    if (rows <= 2 * entries + 1024) return {};
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
    const std::uint64_t rows = KCACHE_TRY(records_in(tx, tx.db.evictions, "evictions"));
    if (rows <= tx.config.max_events) return {};
    // Rare (only past max_events evicted names that never came back): drop the older half.
    std::vector<std::pair<std::uint64_t, std::string>> all;
    KCACHE_TRY(tx.scan_checked(tx.db.evictions, {}, {},
                               [&](std::string_view key, std::string_view value) -> Result<bool> {
                                   auto e = KCACHE_TRY(records::decode_eviction(value));
                                   all.emplace_back(e.seq, std::string(key));
                                   return true;
                               }));
    std::sort(all.begin(), all.end());
    for (std::size_t i = 0; i < all.size() / 2; ++i) {
        KCACHE_TRY(tx.del(tx.db.evictions, all[i].second));
    }
    return {};
}

// Whether a batch has anything to do: nothing to classify takes no write transaction (a
// commit may sync). Events the classifier ignores (hits, pins) are passed over with the
// next batch, or once `max_events` of them pile up.
Result<bool> worth_a_batch(Store& store, std::size_t max_events) {
    auto txn = KCACHE_TRY(store.read());
    const Tx tx = TxnAccess::tx(txn);
    const std::uint64_t pos = KCACHE_TRY(classified_up_to(tx));
    std::optional<Event> first;
    std::size_t seen = 0;
    KCACHE_TRY(txn.for_each_event(pos, [&](const Event& e) {
        if (e.kind == EventKind::populate || e.kind == EventKind::evict ||
            e.kind == EventKind::remove || ++seen >= max_events) {
            first = e;
        }
        return !first;
    }));
    if (!first) return false;
    if (first->kind == EventKind::populate && !KCACHE_TRY(settled(txn, *first, store.now_ns())))
        return false;
    return true;
}

// The next batch's events (at most `max_events`) from the classifier's position, which
// goes to `plan.from`.
Result<std::vector<Event>> next_events(Store& store, std::size_t max_events, Plan& plan) {
    std::vector<Event> events;
    auto txn = KCACHE_TRY(store.read());
    const Tx tx = TxnAccess::tx(txn);
    plan.from = KCACHE_TRY(classified_up_to(tx));
    KCACHE_TRY(txn.for_each_event(plan.from, [&](const Event& e) {
        events.push_back(e);
        return events.size() < max_events;
    }));
    return events;
}

// Decides what event `e` writes, from a snapshot of its own; false when it is a miss
// whose entry has not settled (the batch stops before it).
Result<bool> plan_event(Store& store, const Event& e, std::int64_t now, Plan& plan) {
    if (e.kind == EventKind::evict || e.kind == EventKind::remove) {
        auto txn = KCACHE_TRY(store.read());
        auto dir = TxnAccess::tx(txn).path_of(e.parent);
        if (dir && !e.name.empty()) {
            const std::string name = dir->empty() ? e.name : *dir + "/" + e.name;
            plan.evictions[text_key(name)] =
                records::encode(records::Eviction{e.seq, e.time_ns, e.entry, e.kind});
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
        if (entry && !KCACHE_TRY(settled(txn, e, now))) return false;
        Miss m = KCACHE_TRY(classify(txn, tx, e, entry, plan));
        plan.misses.emplace_back(e.seq, records::encode(m));
        plan.counted.push_back(miss_cause_counter(m.cause));
    }
    return true;
}

// The batch's writes: short. Another process may have classified these meanwhile (its
// batch moved the position): then this plan is dropped and the next call goes on from
// there. How many misses it wrote.
Result<std::size_t> write_plan(Store& store, const Plan& plan) {
    std::size_t classified = 0;
    KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
        Tx tx = TxnAccess::tx(txn);
        if (KCACHE_TRY(classified_up_to(tx)) != plan.from) return {};
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

}  // namespace

}  // namespace misses

Result<std::size_t> classify_pending(Store& store, std::size_t max_events) {
    using namespace misses;
    if (store.read_only() || !TxnAccess::impl(store).has_misses) return 0;
    if (!KCACHE_TRY(worth_a_batch(store, max_events))) return 0;
    // The comparisons, from snapshots: no writer lock held, so stores go on meanwhile.
    // One short snapshot per event: a reader keeps LMDB from reusing the pages that
    // commits free while it lives, so a snapshot held across a batch (longer still when
    // this low-priority thread is preempted in it) grows the db that stores then write.
    Plan plan;
    const std::vector<Event> events = KCACHE_TRY(next_events(store, max_events, plan));
    plan.to = plan.from;
    const std::int64_t now = store.now_ns();
    const std::int64_t started = steady_ns();
    for (const Event& e : events) {
        if (!KCACHE_TRY(plan_event(store, e, now, plan))) break;
        plan.to = e.seq;
        if (steady_ns() - started >= kBatchBudgetNs) break;  // the next call goes on
    }
    if (plan.to == plan.from) return 0;
    return write_plan(store, plan);
}

}  // namespace kcache::core
