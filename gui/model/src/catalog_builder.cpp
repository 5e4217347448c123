#include "catalog_builder.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <limits>

#include <fmt/core.h>

namespace kcache::gui {
namespace {

constexpr std::size_t kTimelineBuckets = 120;
// More new events than this since the last look: reloading is cheaper than applying.
constexpr std::size_t kMaxIncrementalEvents = 20000;
}  // namespace

core::Result<CatalogBuilder::Update> CatalogBuilder::load() {
    auto txn = KCACHE_TRY(m_store.get().read());
    return load_all(txn);
}

core::Result<CatalogBuilder::Update> CatalogBuilder::load_all(const core::Txn& txn) {
    const auto t0 = std::chrono::steady_clock::now();
    auto c = std::make_shared<Catalog>();
    auto stats = KCACHE_TRY(txn.stats());
    c->stats = std::move(stats);
    c->data_file_bytes = m_store.get().data_file_bytes();

    const std::uint64_t expected = c->stats.get(core::Counter::entries);
    c->rows.reserve(expected + expected / 8);
    c->keys.reserve((expected + expected / 8) * 34);  // hash-named entries: 32 hex digits
    bool moved = false;
    KCACHE_TRY(txn.for_each_entry([&](const core::EntryInfo& info) {
        upsert(*c, info, moved);
        return true;
    }));
    if (c->keys.size() > std::numeric_limits<std::uint32_t>::max()) {
        return core::fail(
            EFBIG, fmt::format("db {}: the entry keys take more than 4 GiB", m_store.get().path()));
    }

    m_events.clear();
    m_cursor = core::EventCursor();
    KCACHE_TRY(m_cursor.read(txn, [&](const core::Event& event) {
        append_event(event);
        return true;
    }));

    c->txn_id = txn.id();
    c->full_loads = ++m_full_loads;
    rebuild_derived(*c);
    c->last_load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Update update;
    update.full = true;
    update.catalog = c;
    m_current = std::move(c);
    return update;
}

core::Result<std::optional<CatalogBuilder::Update>> CatalogBuilder::follow() {
    auto txn = KCACHE_TRY(m_store.get().read());
    if (m_current && txn.id() == m_current->txn_id) return std::nullopt;
    if (!m_current) return load_all(txn);

    // Copy on write: the published catalog may be on screen right now.
    auto c = std::make_shared<Catalog>(*m_current);
    const auto saved_cursor = m_cursor;
    const auto saved_events = m_events.size();
    Update update;
    auto incremental = apply_changes(txn, *c, update);
    if (!incremental) {
        m_cursor = saved_cursor;  // leave the builder as it was, for the next try
        m_events.resize(saved_events);
        return tl::unexpected(incremental.error());
    }
    if (!*incremental) return load_all(txn);
    c->txn_id = txn.id();
    update.catalog = c;
    m_current = std::move(c);
    return update;
}

core::Result<bool> CatalogBuilder::apply_changes(const core::Txn& txn, Catalog& c, Update& update) {
    std::vector<core::Ino> touched;
    bool need_reload = false;
    std::size_t count = 0;
    const auto lost = KCACHE_TRY(m_cursor.read(txn, [&](const core::Event& event) {
        if (++count > kMaxIncrementalEvents) {
            need_reload = true;
            return false;
        }
        append_event(event);
        if (event.entry != 0) touched.push_back(event.entry);
        return true;
    }));
    // Lost events (the log was trimmed past what we saw): changes we cannot apply.
    if (need_reload || lost != 0) return false;

    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());

    for (core::Ino ino : touched) {
        auto info = txn.entry(ino);
        if (info) {
            upsert(c, *info, update.rows_moved);
        } else if (info.error().code == ENOENT) {
            mark_gone(c, ino);
        } else {
            return tl::unexpected(info.error());
        }
    }
    if (c.keys.size() > std::numeric_limits<std::uint32_t>::max()) return false;

    auto stats = KCACHE_TRY(txn.stats());
    c.stats = std::move(stats);
    c.data_file_bytes = m_store.get().data_file_bytes();

    for (core::Ino ino : touched) {
        if (const EntryRow* r = c.find(ino)) {
            update.changed.push_back(static_cast<std::uint32_t>(r - c.rows.data()));
        }
    }
    std::sort(update.changed.begin(), update.changed.end());
    rebuild_derived(c);
    return true;
}

void CatalogBuilder::upsert(Catalog& c, const core::EntryInfo& info, bool& moved) {
    // A full load visits entries in ino order: each one goes at the end.
    auto it = !c.rows.empty() && c.rows.back().ino < info.ino
                  ? c.rows.end()
                  : std::lower_bound(c.rows.begin(), c.rows.end(), info.ino,
                                     [](const EntryRow& row, core::Ino i) { return row.ino < i; });
    if (it == c.rows.end() || it->ino != info.ino) {
        // New inos are the largest: an append. Anything else moves the rows after it,
        // and the view's row indices with them.
        if (it != c.rows.end()) moved = true;
        it = c.rows.insert(it, EntryRow{});
        it->ino = info.ino;
        it->flags = EntryRow::kRowGone;  // counted as live below
    }
    EntryRow& row = *it;
    if (row.gone()) {
        ++c.live;
    } else {
        c.total_bytes -= row.bytes;
        c.total_stored -= row.stored_bytes;
    }
    if (row.key_length == 0 || c.key(row) != info.name) {
        row.key_offset = static_cast<std::uint32_t>(c.keys.size());
        row.key_length = static_cast<std::uint16_t>(info.name.size());
        c.keys += info.name;
    }
    row.bytes = info.bytes;
    row.stored_bytes = info.stored_bytes;
    row.hits = info.hits;
    row.created_ns = info.created_ns;
    row.last_access_ns = info.last_access_ns;
    row.files = static_cast<std::uint32_t>(std::min<std::uint64_t>(info.files, UINT32_MAX));
    row.producer = info.producer;
    row.flags = info.pinned ? EntryRow::kRowPinned : 0;
    c.total_bytes += row.bytes;
    c.total_stored += row.stored_bytes;
}

void CatalogBuilder::mark_gone(Catalog& c, core::Ino ino) {
    auto* row = const_cast<EntryRow*>(c.find(ino));  // c is ours: not published yet
    if (!row || row->gone()) return;
    row->flags = EntryRow::kRowGone;
    --c.live;
    c.total_bytes -= row->bytes;
    c.total_stored -= row->stored_bytes;
}

void CatalogBuilder::append_event(const core::Event& event) {
    switch (event.kind) {
        case core::EventKind::hit:
        case core::EventKind::populate:
        case core::EventKind::evict:
            m_events.push_back({event.time_ns, event.kind});
            break;
        default:
            break;
    }
}

void CatalogBuilder::rebuild_derived(Catalog& c) {
    c.event_count = m_events.size();
    // Top entries: one pass keeping the best kTopCount, O(entries), per catalog only.
    auto top = [&](auto value) {
        std::vector<std::uint32_t> best;
        auto worse = [&](std::uint32_t a, std::uint32_t b) {
            return value(c.rows[a]) != value(c.rows[b]) ? value(c.rows[a]) > value(c.rows[b])
                                                        : c.rows[a].ino < c.rows[b].ino;
        };
        for (std::size_t i = 0; i < c.rows.size(); ++i) {
            const EntryRow& row = c.rows[i];
            if (row.gone() || value(row) == 0) continue;
            const auto index = static_cast<std::uint32_t>(i);
            if (best.size() < Catalog::kTopCount) {
                best.push_back(index);
                std::push_heap(best.begin(), best.end(), worse);
            } else if (worse(index, best.front())) {
                std::pop_heap(best.begin(), best.end(), worse);
                best.back() = index;
                std::push_heap(best.begin(), best.end(), worse);
            }
        }
        std::sort_heap(best.begin(), best.end(), worse);
        return best;
    };
    c.top_hits = top([](const EntryRow& r) { return r.hits; });
    c.top_size = top([](const EntryRow& r) { return r.bytes; });

    std::array<ProducerTotal, 256> totals{};
    for (const EntryRow& row : c.rows) {
        if (row.gone()) continue;
        ProducerTotal& t = totals[static_cast<std::uint8_t>(row.producer)];
        t.entries += 1;
        t.bytes += row.bytes;
        t.stored_bytes += row.stored_bytes;
    }
    c.by_producer.clear();
    for (std::size_t p = 0; p < totals.size(); ++p) {
        if (totals[p].entries == 0) continue;
        totals[p].producer = static_cast<core::Producer>(p);
        c.by_producer.push_back(totals[p]);
    }
    std::sort(c.by_producer.begin(), c.by_producer.end(),
              [](const ProducerTotal& a, const ProducerTotal& b) { return a.bytes > b.bytes; });

    c.timeline = Timeline{};
    if (m_events.empty()) return;
    const std::int64_t start = m_events.front().time_ns;
    const std::int64_t end = std::max(m_store.get().now_ns(), m_events.back().time_ns) + 1;
    const auto buckets = static_cast<std::int64_t>(kTimelineBuckets);
    Timeline& t = c.timeline;
    t.start_ns = start;
    t.bucket_ns = std::max<std::int64_t>(1'000'000'000, (end - start + buckets - 1) / buckets);
    const auto n = static_cast<std::size_t>((end - start + t.bucket_ns - 1) / t.bucket_ns);
    t.hits.assign(n, 0);
    t.populates.assign(n, 0);
    t.evictions.assign(n, 0);
    for (const EventPoint& e : m_events) {
        const auto i = static_cast<std::size_t>(std::clamp<std::int64_t>(
            (e.time_ns - start) / t.bucket_ns, 0, static_cast<std::int64_t>(n) - 1));
        if (e.kind == core::EventKind::hit) ++t.hits[i];
        if (e.kind == core::EventKind::populate) ++t.populates[i];
        if (e.kind == core::EventKind::evict) ++t.evictions[i];
    }
}

}  // namespace kcache::gui
