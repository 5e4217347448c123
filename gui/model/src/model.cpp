#include "kcache/gui/model.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <limits>
#include <system_error>

#include <fmt/core.h>

#include "kcache/core/roles.hpp"
#include "kcache/core/units.hpp"
#include "kcache/gui/text.hpp"

namespace kcache::gui {
namespace {

constexpr std::size_t kTimelineBuckets = 120;
// More new events than this since the last look: reloading is cheaper than applying.
constexpr std::size_t kMaxIncrementalEvents = 20000;
// How long a populated entry is re-read at every refresh (its files keep arriving).
constexpr std::int64_t kRecentNs = 30'000'000'000;
constexpr std::int64_t kMaxPollIntervalNs = 5'000'000'000;

std::int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Producers ordered by name, for sorting the producer column alphabetically.
std::array<std::uint8_t, 256> producer_ranks() {
    std::vector<std::pair<std::string_view, int>> names;
    for (int p = 0; p < 256; ++p) {
        names.emplace_back(core::producer_name(static_cast<core::Producer>(p)), p);
    }
    std::stable_sort(names.begin(), names.end());
    std::array<std::uint8_t, 256> rank{};
    for (std::size_t i = 0; i < names.size(); ++i) {
        rank[static_cast<std::size_t>(names[i].second)] = static_cast<std::uint8_t>(i);
    }
    return rank;
}

std::int64_t signed_diff(std::uint64_t gauge, std::uint64_t total) {
    return static_cast<std::int64_t>(gauge) - static_cast<std::int64_t>(total);
}

}  // namespace

std::string_view column_name(Column c) {
    switch (c) {
        case Column::key:
            return "Key";
        case Column::producer:
            return "Producer";
        case Column::files:
            return "Files";
        case Column::bytes:
            return "Bytes";
        case Column::stored_bytes:
            return "Stored";
        case Column::hits:
            return "Hits";
        case Column::created:
            return "Created";
        case Column::last_access:
            return "Last access";
        case Column::pinned:
            return "Pinned";
    }
    return "?";
}

float Timeline::hit_rate(std::size_t i) const {
    const std::uint32_t total = hits[i] + populates[i];
    return total == 0 ? -1.0f : static_cast<float>(hits[i]) / static_cast<float>(total);
}

std::string format_bytes(std::uint64_t bytes) {
    return core::format_size(bytes);
}

std::string format_ago(std::int64_t now_ns, std::int64_t time_ns) {
    if (time_ns == 0) return "-";
    return core::format_age(std::max<std::int64_t>(0, now_ns - time_ns)) + " ago";
}

Result<std::unique_ptr<Model>> Model::open(const Options& options) {
    // Never create a db: a wrong --db should say so, not show an empty cache.
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::path(options.db_path) / "data.mdb", ec) && !ec) {
        return core::fail(ENOENT, fmt::format("no db at {} (no data.mdb there; create one "
                                              "with `kcache init --db {}` or give --db DIR)",
                                              options.db_path, options.db_path));
    }
    core::OpenOptions open_options;
    open_options.path = options.db_path;
    open_options.create = false;
    open_options.read_only = options.read_only;
    open_options.clock = options.clock;
    auto store = core::Store::open(open_options);
    if (!store && !options.read_only &&
        (store.error().code == EROFS || store.error().code == EACCES)) {
        open_options.read_only = true;  // still worth looking at; actions will say why not
        store = core::Store::open(open_options);
    }
    if (!store) return tl::unexpected(store.error());

    std::unique_ptr<Model> model(new Model());
    model->m_store = std::move(*store);
    model->m_poll_interval_ns = options.poll_interval_ns;
    if (auto status = model->reload(); !status) return tl::unexpected(status.error());
    return model;
}

Status Model::reload() {
    auto txn = m_store->read();
    if (!txn) return tl::unexpected(txn.error());
    if (auto status = load_all(*txn); !status) return status;
    m_next_poll_ns = steady_ns() + m_poll_interval_ns;
    return {};
}

Status Model::load_all(const core::Txn& txn) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<core::Ino> selected = selected_inos();

    auto stats = txn.stats();
    if (!stats) return tl::unexpected(stats.error());
    m_stats = std::move(*stats);
    m_data_file_bytes = m_store->data_file_bytes();

    m_rows.clear();
    m_rows_shifted = false;
    m_keys.clear();
    m_live = 0;
    m_selected = 0;
    m_total_bytes = 0;
    m_total_stored = 0;
    const std::uint64_t expected = m_stats.get(core::Counter::entries);
    m_rows.reserve(expected + expected / 8);
    m_keys.reserve((expected + expected / 8) * 34);  // hash-named entries: 32 hex digits
    core::Status status;
    status = txn.for_each_entry([&](const core::EntryInfo& info) {
        upsert(info);
        return true;
    });
    if (!status) return status;
    if (m_keys.size() > std::numeric_limits<std::uint32_t>::max()) {
        return core::fail(
            EFBIG, fmt::format("db {}: the entry keys take more than 4 GiB", m_store->path()));
    }

    m_events.clear();
    m_event_seq = 0;
    m_recent.clear();
    status = txn.for_each_event(0, [&](const core::Event& event) {
        append_event(event);
        m_event_seq = event.seq;
        return true;
    });
    if (!status) return status;

    m_gauge_offset = {
        signed_diff(m_stats.get(core::Counter::entries), m_live),
        signed_diff(m_stats.get(core::Counter::bytes), m_total_bytes),
        signed_diff(m_stats.get(core::Counter::stored_bytes), m_total_stored),
    };

    // Keep the selection and the focused entry where those entries still exist.
    for (core::Ino ino : selected) {
        if (EntryRow* r = find_row(ino); r && !r->gone()) {
            r->flags |= EntryRow::kRowSelected;
            ++m_selected;
        }
    }
    if (m_focused && !row(*m_focused)) m_focused.reset();

    m_txn_id = txn.id();
    ++m_full_loads;
    rebuild_view();
    rebuild_derived();
    m_last_load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {};
}

Result<bool> Model::refresh(bool force) {
    const std::int64_t now = steady_ns();
    if (!force && now < m_next_poll_ns) return false;
    auto txn = m_store->read();
    if (!txn) return tl::unexpected(txn.error());
    if (txn->id() == m_txn_id) {
        m_next_poll_ns = now + m_poll_interval_ns;
        return false;
    }

    auto incremental = apply_changes(*txn);
    if (!incremental) return tl::unexpected(incremental.error());
    if (!*incremental) {
        if (auto status = load_all(*txn); !status) return tl::unexpected(status.error());
    }
    m_txn_id = txn->id();
    // A slow refresh must not eat the frames: look again after several times its cost.
    const std::int64_t cost = steady_ns() - now;
    m_next_poll_ns =
        steady_ns() + std::clamp<std::int64_t>(4 * cost, m_poll_interval_ns, kMaxPollIntervalNs);
    return true;
}

Result<bool> Model::apply_changes(const core::Txn& txn) {
    std::vector<core::Ino> touched;
    bool need_reload = false;
    bool first = true;
    std::size_t count = 0;
    const std::int64_t now = m_store->now_ns();
    core::Status status = txn.for_each_event(m_event_seq, [&](const core::Event& event) {
        // A gap means the log was trimmed past what we saw: changes were lost.
        if ((first && m_event_seq != 0 && event.seq != m_event_seq + 1) ||
            ++count > kMaxIncrementalEvents) {
            need_reload = true;
            return false;
        }
        first = false;
        append_event(event);
        m_event_seq = event.seq;
        if (event.entry != 0) touched.push_back(event.entry);
        if (event.kind == core::EventKind::populate || event.kind == core::EventKind::import) {
            m_recent.emplace_back(event.entry, now);
        }
        return true;
    });
    if (!status) return tl::unexpected(status.error());
    if (need_reload) return false;

    std::erase_if(m_recent, [&](const auto& recent) { return now - recent.second > kRecentNs; });
    for (const auto& recent : m_recent) touched.push_back(recent.first);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());

    for (core::Ino ino : touched) {
        auto info = txn.entry(ino);
        if (info) {
            upsert(*info);
        } else if (info.error().code == ENOENT) {
            mark_gone(ino);
        } else {
            return tl::unexpected(info.error());
        }
    }
    if (m_keys.size() > std::numeric_limits<std::uint32_t>::max()) return false;

    auto stats = txn.stats();
    if (!stats) return tl::unexpected(stats.error());
    m_stats = std::move(*stats);
    m_data_file_bytes = m_store->data_file_bytes();
    // Changes that log no event (another file published into an older entry) show
    // as gauges that no longer match the rows: then only a reload is right.
    const std::array<std::int64_t, 3> offset = {
        signed_diff(m_stats.get(core::Counter::entries), m_live),
        signed_diff(m_stats.get(core::Counter::bytes), m_total_bytes),
        signed_diff(m_stats.get(core::Counter::stored_bytes), m_total_stored),
    };
    if (offset != m_gauge_offset) return false;

    if (m_focused && !row(*m_focused)) m_focused.reset();
    if (!touched.empty()) update_view(touched);
    rebuild_derived();
    return true;
}

EntryRow* Model::find_row(core::Ino ino) {
    auto it = std::lower_bound(m_rows.begin(), m_rows.end(), ino,
                               [](const EntryRow& row, core::Ino i) { return row.ino < i; });
    return it == m_rows.end() || it->ino != ino ? nullptr : &*it;
}

const EntryRow* Model::row(core::Ino ino) const {
    auto it = std::lower_bound(m_rows.begin(), m_rows.end(), ino,
                               [](const EntryRow& r, core::Ino i) { return r.ino < i; });
    if (it == m_rows.end() || it->ino != ino || it->gone()) return nullptr;
    return &*it;
}

void Model::upsert(const core::EntryInfo& info) {
    // A full load visits entries in ino order: each one goes at the end.
    auto it = !m_rows.empty() && m_rows.back().ino < info.ino
                  ? m_rows.end()
                  : std::lower_bound(m_rows.begin(), m_rows.end(), info.ino,
                                     [](const EntryRow& row, core::Ino i) { return row.ino < i; });
    if (it == m_rows.end() || it->ino != info.ino) {
        // New inos are the largest: an append. Anything else moves the rows after it,
        // and the view's row indices with them.
        if (it != m_rows.end()) m_rows_shifted = true;
        it = m_rows.insert(it, EntryRow{});
        it->ino = info.ino;
        it->flags = EntryRow::kRowGone;  // counted as live below
    }
    EntryRow& row = *it;
    if (row.gone()) {
        ++m_live;
    } else {
        m_total_bytes -= row.bytes;
        m_total_stored -= row.stored_bytes;
    }
    const std::string_view old_key = key(row);
    if (row.key_length == 0 || old_key != info.name) {
        row.key_offset = static_cast<std::uint32_t>(m_keys.size());
        row.key_length = static_cast<std::uint16_t>(info.name.size());
        m_keys += info.name;
    }
    row.bytes = info.bytes;
    row.stored_bytes = info.stored_bytes;
    row.hits = info.hits;
    row.created_ns = info.created_ns;
    row.last_access_ns = info.last_access_ns;
    row.files = static_cast<std::uint32_t>(std::min<std::uint64_t>(info.files, UINT32_MAX));
    row.producer = info.producer;
    row.flags = static_cast<std::uint8_t>((row.flags & EntryRow::kRowSelected) |
                                          (info.pinned ? EntryRow::kRowPinned : 0));
    m_total_bytes += row.bytes;
    m_total_stored += row.stored_bytes;
}

void Model::mark_gone(core::Ino ino) {
    EntryRow* found = find_row(ino);
    if (!found) return;
    EntryRow& row = *found;
    if (row.gone()) return;
    if (row.selected()) --m_selected;
    row.flags = EntryRow::kRowGone;
    --m_live;
    m_total_bytes -= row.bytes;
    m_total_stored -= row.stored_bytes;
}

void Model::append_event(const core::Event& event) {
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

bool Model::passes_filter(const EntryRow& row) const {
    if (m_filter.empty()) return true;
    return contains_lower(key(row), m_filter) ||
           contains_lower(core::producer_name(row.producer), m_filter);
}

void Model::set_filter(std::string_view text) {
    std::string lower = to_lower(text);
    if (lower == m_filter) return;
    m_filter = std::move(lower);
    rebuild_view();
}

void Model::set_sort(SortSpec spec) {
    if (spec == m_sort) return;
    m_sort = spec;
    sort_view();
}

void Model::rebuild_view() {
    m_view.clear();
    m_view.reserve(m_live);
    for (std::size_t i = 0; i < m_rows.size(); ++i) {
        const EntryRow& row = m_rows[i];
        if (!row.gone() && passes_filter(row)) m_view.push_back(static_cast<std::uint32_t>(i));
    }
    sort_view();
}

// An order-preserving integer of a row's value in the sort column (keys: their first
// eight bytes). Sorting (integer, row index) pairs reads one contiguous array instead
// of chasing rows and keys through memory: for a million rows, a tenth of a second
// instead of seconds of cache misses.
std::uint64_t Model::sort_value(const EntryRow& r) const {
    static const std::array<std::uint8_t, 256> ranks = producer_ranks();
    constexpr std::uint64_t kSignBit = std::uint64_t{1} << 63;
    switch (m_sort.column) {
        case Column::key: {
            std::uint64_t prefix = 0;
            const std::string_view k = key(r);
            for (std::size_t i = 0; i < 8; ++i) {
                prefix = (prefix << 8) | (i < k.size() ? static_cast<unsigned char>(k[i]) : 0u);
            }
            return prefix;
        }
        case Column::producer:
            return ranks[static_cast<std::uint8_t>(r.producer)];
        case Column::files:
            return r.files;
        case Column::bytes:
            return r.bytes;
        case Column::stored_bytes:
            return r.stored_bytes;
        case Column::hits:
            return r.hits;
        case Column::created:
            return static_cast<std::uint64_t>(r.created_ns) ^ kSignBit;
        case Column::last_access:
            return static_cast<std::uint64_t>(r.last_access_ns) ^ kSignBit;
        case Column::pinned:
            return r.pinned() ? 1 : 0;
    }
    return 0;
}

bool Model::view_less(std::uint32_t a, std::uint32_t b) const {
    const std::uint64_t va = sort_value(m_rows[a]);
    const std::uint64_t vb = sort_value(m_rows[b]);
    if (va != vb) return m_sort.descending ? vb < va : va < vb;
    if (m_sort.column == Column::key) {
        const std::string_view ka = key(m_rows[a]);
        const std::string_view kb = key(m_rows[b]);
        if (ka != kb) return m_sort.descending ? kb < ka : ka < kb;
    }
    return a < b;  // row order is ino (creation) order: ties stay stable
}

void Model::sort_view() {
    struct Item {
        std::uint64_t value;
        std::uint32_t index;
    };
    std::vector<Item> items(m_view.size());
    for (std::size_t i = 0; i < m_view.size(); ++i) {
        const std::uint64_t v = sort_value(m_rows[m_view[i]]);
        items[i] = {m_sort.descending ? ~v : v, m_view[i]};
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        return a.value != b.value ? a.value < b.value : a.index < b.index;
    });
    for (std::size_t i = 0; i < items.size(); ++i) m_view[i] = items[i].index;
    if (m_sort.column != Column::key) return;
    // Keys sharing their first eight bytes: order each such run by the whole key.
    for (std::size_t i = 0; i < items.size();) {
        std::size_t j = i + 1;
        while (j < items.size() && items[j].value == items[i].value) ++j;
        if (j - i > 1) {
            std::sort(m_view.begin() + static_cast<std::ptrdiff_t>(i),
                      m_view.begin() + static_cast<std::ptrdiff_t>(j),
                      [this](std::uint32_t a, std::uint32_t b) { return view_less(a, b); });
        }
        i = j;
    }
}

// A few rows changed: take them out of the view and put them back where they now
// belong, instead of filtering and sorting every row again.
void Model::update_view(const std::vector<core::Ino>& touched) {
    constexpr std::size_t kMaxPatched = 256;
    if (touched.size() > kMaxPatched || m_rows_shifted) {
        rebuild_view();
        m_rows_shifted = false;
        return;
    }
    std::vector<std::uint32_t> changed;
    for (core::Ino ino : touched) {
        if (EntryRow* r = find_row(ino)) {
            changed.push_back(static_cast<std::uint32_t>(r - m_rows.data()));
        }
    }
    std::sort(changed.begin(), changed.end());
    std::erase_if(m_view, [&](std::uint32_t index) {
        return std::binary_search(changed.begin(), changed.end(), index);
    });
    for (std::uint32_t index : changed) {
        const EntryRow& r = m_rows[index];
        if (r.gone() || !passes_filter(r)) continue;
        auto at =
            std::lower_bound(m_view.begin(), m_view.end(), index,
                             [this](std::uint32_t a, std::uint32_t b) { return view_less(a, b); });
        m_view.insert(at, index);
    }
}

std::optional<std::size_t> Model::visible_index(core::Ino ino) const {
    for (std::size_t i = 0; i < m_view.size(); ++i) {
        if (m_rows[m_view[i]].ino == ino) return i;
    }
    return std::nullopt;
}

void Model::rebuild_derived() {
    // Top entries: one pass keeping the best kTopCount, O(entries), at refresh only.
    auto top = [&](auto value) {
        std::vector<std::uint32_t> best;
        auto worse = [&](std::uint32_t a, std::uint32_t b) {
            return value(m_rows[a]) != value(m_rows[b]) ? value(m_rows[a]) > value(m_rows[b])
                                                        : m_rows[a].ino < m_rows[b].ino;
        };
        for (std::size_t i = 0; i < m_rows.size(); ++i) {
            const EntryRow& row = m_rows[i];
            if (row.gone() || value(row) == 0) continue;
            const auto index = static_cast<std::uint32_t>(i);
            if (best.size() < kTopCount) {
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
    m_top_hits = top([](const EntryRow& r) { return r.hits; });
    m_top_size = top([](const EntryRow& r) { return r.bytes; });

    std::array<ProducerTotal, 256> totals{};
    for (const EntryRow& row : m_rows) {
        if (row.gone()) continue;
        ProducerTotal& t = totals[static_cast<std::uint8_t>(row.producer)];
        t.entries += 1;
        t.bytes += row.bytes;
        t.stored_bytes += row.stored_bytes;
    }
    m_by_producer.clear();
    for (std::size_t p = 0; p < totals.size(); ++p) {
        if (totals[p].entries == 0) continue;
        totals[p].producer = static_cast<core::Producer>(p);
        m_by_producer.push_back(totals[p]);
    }
    std::sort(m_by_producer.begin(), m_by_producer.end(),
              [](const ProducerTotal& a, const ProducerTotal& b) { return a.bytes > b.bytes; });

    m_timeline = Timeline{};
    if (!m_events.empty()) {
        const std::int64_t start = m_events.front().time_ns;
        const std::int64_t end = std::max(m_store->now_ns(), m_events.back().time_ns) + 1;
        const auto buckets = static_cast<std::int64_t>(kTimelineBuckets);
        m_timeline.start_ns = start;
        m_timeline.bucket_ns =
            std::max<std::int64_t>(1'000'000'000, (end - start + buckets - 1) / buckets);
        const auto n = static_cast<std::size_t>((end - start + m_timeline.bucket_ns - 1) /
                                                m_timeline.bucket_ns);
        m_timeline.hits.assign(n, 0);
        m_timeline.populates.assign(n, 0);
        m_timeline.evictions.assign(n, 0);
        for (const EventPoint& e : m_events) {
            const auto i = static_cast<std::size_t>(std::clamp<std::int64_t>(
                (e.time_ns - start) / m_timeline.bucket_ns, 0, static_cast<std::int64_t>(n) - 1));
            if (e.kind == core::EventKind::hit) ++m_timeline.hits[i];
            if (e.kind == core::EventKind::populate) ++m_timeline.populates[i];
            if (e.kind == core::EventKind::evict) ++m_timeline.evictions[i];
        }
    }
}

void Model::select_only(std::size_t visible_index) {
    clear_selection();
    toggle_selected(visible_index);
}

void Model::toggle_selected(std::size_t visible_index) {
    EntryRow& row = m_rows[m_view[visible_index]];
    row.flags ^= EntryRow::kRowSelected;
    if (row.selected()) {
        ++m_selected;
        m_focused = row.ino;
    } else {
        --m_selected;
    }
}

void Model::select_range(std::size_t a, std::size_t b) {
    if (a > b) std::swap(a, b);
    b = std::min(b, m_view.size() - 1);
    for (std::size_t i = a; i <= b; ++i) {
        EntryRow& row = m_rows[m_view[i]];
        if (!row.selected()) {
            row.flags |= EntryRow::kRowSelected;
            ++m_selected;
        }
    }
}

void Model::select_all_visible() {
    if (!m_view.empty()) select_range(0, m_view.size() - 1);
}

void Model::clear_selection() {
    if (m_selected == 0) return;
    for (EntryRow& row : m_rows) row.flags &= static_cast<std::uint8_t>(~EntryRow::kRowSelected);
    m_selected = 0;
}

std::uint64_t Model::selected_bytes() const {
    std::uint64_t bytes = 0;
    if (m_selected == 0) return 0;
    for (const EntryRow& row : m_rows) {
        if (row.selected()) bytes += row.bytes;
    }
    return bytes;
}

std::vector<core::Ino> Model::selected_inos() const {
    std::vector<core::Ino> inos;
    if (m_selected == 0) return inos;
    inos.reserve(m_selected);
    for (const EntryRow& row : m_rows) {
        if (row.selected() && !row.gone()) inos.push_back(row.ino);
    }
    return inos;
}

Result<ActionReport> Model::run_evict(const std::vector<core::Ino>& inos) {
    auto txn = m_store->write();
    if (!txn) return tl::unexpected(txn.error());
    ActionReport report;
    for (core::Ino ino : inos) {
        const EntryRow* r = row(ino);
        core::Status status = txn->evict_entry(ino);
        if (!status) {
            const int code = status.error().code;
            if (code == EPERM || code == EBUSY) {  // pinned, or a write in flight
                ++report.skipped;
                continue;
            }
            if (code == ENOENT) continue;  // evicted by someone else meanwhile
            return tl::unexpected(status.error());
        }
        ++report.entries;
        if (r) report.bytes += r->bytes;
    }
    if (auto status = txn->commit(); !status) return tl::unexpected(status.error());
    report.message =
        fmt::format("evicted {} {} ({})", report.entries, report.entries == 1 ? "entry" : "entries",
                    format_bytes(report.bytes));
    if (report.skipped) {
        report.message += fmt::format("; kept {} pinned or with a write in flight", report.skipped);
    }
    if (auto changed = refresh(true); !changed) return tl::unexpected(changed.error());
    return report;
}

Result<ActionReport> Model::evict_selected() {
    return run_evict(selected_inos());
}

namespace {

ActionReport report_of(const core::EvictReport& evicted) {
    ActionReport report;
    report.entries = evicted.entries;
    report.bytes = evicted.bytes;
    report.skipped = evicted.skipped_in_flight;
    report.message =
        fmt::format("evicted {} {} ({}, {} stored freed)", evicted.entries,
                    evicted.entries == 1 ? "entry" : "entries", format_bytes(evicted.bytes),
                    format_bytes(evicted.stored_bytes_freed));
    if (evicted.skipped_in_flight) {
        report.message +=
            fmt::format("; {} with a write in flight kept", evicted.skipped_in_flight);
    }
    return report;
}

}  // namespace

Result<ActionReport> Model::evict_older_than(std::int64_t age_ns) {
    core::EvictRequest request;
    request.older_than_ns = age_ns;
    auto evicted = m_store->evict(request);
    if (!evicted) return tl::unexpected(evicted.error());
    if (auto changed = refresh(true); !changed) return tl::unexpected(changed.error());
    return report_of(*evicted);
}

Result<ActionReport> Model::clear() {
    core::EvictRequest request;
    request.max_entries = 0;
    auto evicted = m_store->evict(request);
    if (!evicted) return tl::unexpected(evicted.error());
    if (auto changed = refresh(true); !changed) return tl::unexpected(changed.error());
    ActionReport report = report_of(*evicted);
    if (m_live > 0) report.message += fmt::format("; {} pinned kept", m_live);
    return report;
}

Result<ActionReport> Model::set_selected_pinned(bool pinned) {
    const std::vector<core::Ino> inos = selected_inos();
    auto txn = m_store->write();
    if (!txn) return tl::unexpected(txn.error());
    ActionReport report;
    for (core::Ino ino : inos) {
        const EntryRow* r = row(ino);
        if (r && r->pinned() == pinned) continue;
        core::Status status = txn->set_pinned(ino, pinned);
        if (!status && status.error().code == ENOENT) continue;
        if (!status) return tl::unexpected(status.error());
        ++report.entries;
    }
    if (auto status = txn->commit(); !status) return tl::unexpected(status.error());
    report.message = fmt::format("{} {} {}", pinned ? "pinned" : "unpinned", report.entries,
                                 report.entries == 1 ? "entry" : "entries");
    if (auto changed = refresh(true); !changed) return tl::unexpected(changed.error());
    return report;
}

Status Model::start_duplicate_scan() {
    std::vector<core::Ino> inos;
    inos.reserve(m_live);
    for (const EntryRow& row : m_rows) {
        if (!row.gone()) inos.push_back(row.ino);
    }
    return m_duplicates.start(*m_store, std::move(inos));
}

std::size_t Model::memory_bytes() const {
    return m_rows.capacity() * sizeof(EntryRow) + m_keys.capacity() +
           m_view.capacity() * sizeof(std::uint32_t) + m_events.capacity() * sizeof(EventPoint) +
           m_recent.capacity() * sizeof(m_recent[0]);
}

}  // namespace kcache::gui
