// Content kept for readers in kcache-fsd: the snapshots reader handles share, and
// the *pin*, the read snapshot that keeps a lazy reader's version alive.
//
// A reader keeps its version (docs/fsd.md, "A reader keeps its version"),
// even when it loads it lazily: a reader opened onto the kernel's kept pages
// (PageCache::Use::keep) gets its content at its first READ (load), if one comes.
// The background thread holds one read snapshot, the pin, from its previous period;
// LMDB keeps every page that snapshot sees alive, whoever commits after it.
// renew_pin (background thread, every period in which the db changed) takes a new
// snapshot and, for every inode with lazy readers whose version is no longer the
// stored one, keeps the version's content from the pin (PageCache::keep) before it
// lets the pin go. keep_for_readers does the same before this daemon replaces a
// stored version (publish).
//
// Contract: snapshot() shares one copy per digest among the handles alive. load()
// returns null only if reading the pin failed (logged). Nothing else fails.
//
// Locks (lock_order.hpp): m_pin_mutex, level 5, held across renew_pin's scan and swap
// so that a lazy open's check (pinned) comes wholly before or after them; under it the
// snapshots and the page cache. m_snapshots_mutex, level 7, a leaf.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kcache/core/integrity.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

class Lookups;
class PageCache;

class Contents {
  public:
    Contents(core::Store& store, PageCache& pages, Lookups& lookups)
        : m_store(store), m_pages(pages), m_lookups(lookups) {}

    // The shared copy of `digest`'s content (made from `content` if none is alive: its
    // buffer moved in when it owns one, so decompressed content is not copied again).
    std::shared_ptr<const std::string> snapshot(const core::Digest& digest, core::Content content);
    std::shared_ptr<const std::string> find_snapshot(const core::Digest& digest);

    // Before the stored content of `ino` is replaced by a publish: page-cache readers
    // of it that load lazily keep it (PageCache::keep) until the last one closes.
    void keep_for_readers(core::Ino ino);
    // A lazy reader's content (`digest` of `ino`): a live snapshot, the stored one, an
    // orphan, what renew_pin or keep_for_readers kept, or the pin's; null only if
    // reading failed. Stored content that does not match its digest
    // (core::kDamagedContent) is null at once, with the error in *damage when given:
    // the pin holds the same damaged pages.
    std::shared_ptr<const std::string> load(core::Ino ino, const core::Digest& digest,
                                            core::Error* damage = nullptr);
    // The background thread's period: see above.
    void renew_pin();
    // Whether a lazy reader of `digest` of `ino` (already counted lazy by
    // PageCache::enter) is covered by the pin; `txn` is the snapshot its OPEN read. If
    // not, the open copies its content at once.
    bool pinned(core::Ino ino, const core::Digest& digest, const core::ReadTxn& txn);

  private:
    core::Store& m_store;
    PageCache& m_pages;
    Lookups& m_lookups;

    Mutex m_pin_mutex KCACHE_LEVEL(5);
    std::optional<core::ReadTxn> m_pin GUARDED_BY(m_pin_mutex);

    Mutex m_snapshots_mutex KCACHE_LEVEL(7);  // a leaf
    std::unordered_map<std::string, std::weak_ptr<const std::string>> m_snapshots
        GUARDED_BY(m_snapshots_mutex);
};

}  // namespace kcache::fsd
