// Builds catalogs from a db: a full load, or the last catalog brought up to date from
// the events log: the entries those events name are read again. Every change of an
// entry's record logs an event (an `update` when nothing else was logged for it, e.g.
// a file published into a populated entry), so the log alone says what changed. If
// the log was trimmed past what it saw, or too much happened, it loads everything again.
//
// Thread: the worker's only; it is the one place that reads the db for the catalog.
// A published catalog is never changed: an update copies it first.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kcache/core/events.hpp"
#include "kcache/core/store.hpp"
#include "kcache/gui/catalog.hpp"
#include "kcache/gui/worker.hpp"

namespace kcache::gui {

class CatalogBuilder {
  public:
    struct Update {
        std::shared_ptr<const Catalog> catalog;
        bool full = false;                   // loaded anew: row indices mean nothing older
        bool rows_moved = false;             // a row was inserted before others
        std::vector<std::uint32_t> changed;  // row indices re-read (sorted), if not full
    };

    explicit CatalogBuilder(ThreadOwnedStore& store) : m_store(store) {}
    // Loads every entry at a fresh snapshot.
    core::Result<Update> load();
    // Follows the db since the last catalog; nullopt when its transaction id did not move.
    core::Result<std::optional<Update>> follow();
    const std::shared_ptr<const Catalog>& current() const { return m_current; }

  private:
    core::Result<Update> load_all(const core::Txn& txn);
    // Applies the events after m_cursor to `c`; false when a full load is needed instead.
    core::Result<bool> apply_changes(const core::Txn& txn, Catalog& c, Update& update);
    void upsert(Catalog& c, const core::EntryInfo& info, bool& moved);
    void mark_gone(Catalog& c, core::Ino ino);
    void append_event(const core::Event& event);
    void rebuild_derived(Catalog& c);

    ThreadOwnedStore& m_store;  // every use checks the thread
    std::shared_ptr<const Catalog> m_current;

    struct EventPoint {
        std::int64_t time_ns;
        core::EventKind kind;
    };
    std::vector<EventPoint> m_events;  // hit, populate, evict events, oldest first
    core::EventCursor m_cursor;        // after the last event seen
    std::uint64_t m_full_loads = 0;
};

}  // namespace kcache::gui
