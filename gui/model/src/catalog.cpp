// The catalog's lookups and the orders of the entries table (catalog.hpp).
#include "kcache/gui/catalog.hpp"

#include <algorithm>
#include <array>

#include "kcache/core/roles.hpp"
#include "kcache/core/units.hpp"
#include "kcache/gui/text.hpp"

namespace kcache::gui {
namespace {

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

// An order-preserving integer of a row's value in the sort column (keys: their first
// eight bytes). Sorting (integer, row index) pairs reads one contiguous array instead
// of chasing rows and keys through memory: for a million rows, a tenth of a second
// instead of seconds of cache misses.
std::uint64_t sort_value(const Catalog& c, Column column, const EntryRow& r) {
    static const std::array<std::uint8_t, 256> ranks = producer_ranks();
    constexpr std::uint64_t kSignBit = std::uint64_t{1} << 63;
    switch (column) {
        case Column::key: {
            std::uint64_t prefix = 0;
            const std::string_view k = c.key(r);
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

// The view's order: the column's value, then (keys) the whole key, then row order,
// which is ino (creation) order, so ties stay stable.
bool view_less(const Catalog& c, SortSpec sort, std::uint32_t a, std::uint32_t b) {
    const std::uint64_t va = sort_value(c, sort.column, c.rows[a]);
    const std::uint64_t vb = sort_value(c, sort.column, c.rows[b]);
    if (va != vb) return sort.descending ? vb < va : va < vb;
    if (sort.column == Column::key) {
        const std::string_view ka = c.key(c.rows[a]);
        const std::string_view kb = c.key(c.rows[b]);
        if (ka != kb) return sort.descending ? kb < ka : ka < kb;
    }
    return a < b;
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

const EntryRow* Catalog::find(core::Ino ino) const {
    auto it = std::lower_bound(rows.begin(), rows.end(), ino,
                               [](const EntryRow& r, core::Ino i) { return r.ino < i; });
    return it == rows.end() || it->ino != ino ? nullptr : &*it;
}

std::size_t Catalog::memory_bytes() const {
    return rows.capacity() * sizeof(EntryRow) + keys.capacity() +
           (top_hits.capacity() + top_size.capacity()) * sizeof(std::uint32_t) +
           by_producer.capacity() * sizeof(ProducerTotal);
}

bool passes_filter(const Catalog& catalog, const EntryRow& row, std::string_view filter) {
    if (filter.empty()) return true;
    return contains_lower(catalog.key(row), filter) ||
           contains_lower(core::producer_name(row.producer), filter);
}

std::vector<std::uint32_t> order_rows(const Catalog& c, const ViewSpec& spec) {
    struct Item {
        std::uint64_t value;
        std::uint32_t index;
    };
    std::vector<Item> items;
    items.reserve(c.live);
    for (std::size_t i = 0; i < c.rows.size(); ++i) {
        const EntryRow& row = c.rows[i];
        if (row.gone() || !passes_filter(c, row, spec.filter)) continue;
        const std::uint64_t v = sort_value(c, spec.sort.column, row);
        items.push_back({spec.sort.descending ? ~v : v, static_cast<std::uint32_t>(i)});
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        return a.value != b.value ? a.value < b.value : a.index < b.index;
    });
    std::vector<std::uint32_t> order(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) order[i] = items[i].index;
    if (spec.sort.column != Column::key) return order;
    // Keys sharing their first eight bytes: order each such run by the whole key.
    for (std::size_t i = 0; i < items.size();) {
        std::size_t j = i + 1;
        while (j < items.size() && items[j].value == items[i].value) ++j;
        if (j - i > 1) {
            std::sort(
                order.begin() + static_cast<std::ptrdiff_t>(i),
                order.begin() + static_cast<std::ptrdiff_t>(j),
                [&](std::uint32_t a, std::uint32_t b) { return view_less(c, spec.sort, a, b); });
        }
        i = j;
    }
    return order;
}

void patch_order(std::vector<std::uint32_t>& order, const Catalog& c, const ViewSpec& spec,
                 const std::vector<std::uint32_t>& changed) {
    std::erase_if(order, [&](std::uint32_t index) {
        return std::binary_search(changed.begin(), changed.end(), index);
    });
    for (std::uint32_t index : changed) {
        const EntryRow& r = c.rows[index];
        if (r.gone() || !passes_filter(c, r, spec.filter)) continue;
        auto at = std::lower_bound(
            order.begin(), order.end(), index,
            [&](std::uint32_t a, std::uint32_t b) { return view_less(c, spec.sort, a, b); });
        order.insert(at, index);
    }
}

}  // namespace kcache::gui
