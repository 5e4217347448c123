#include "contents.hpp"

#include <vector>

#include "log.hpp"
#include "lookups.hpp"
#include "page_cache.hpp"

namespace kcache::fsd {
using core::Ino;

std::shared_ptr<const std::string> Contents::find_snapshot(const core::Digest& digest) {
    MutexLock lock(m_snapshots_mutex);
    auto it = m_snapshots.find(digest.hex());
    return it == m_snapshots.end() ? nullptr : it->second.lock();
}

std::shared_ptr<const std::string> Contents::snapshot(const core::Digest& digest,
                                                      core::Content content) {
    const std::string key = digest.hex();
    MutexLock lock(m_snapshots_mutex);
    if (auto it = m_snapshots.find(key); it != m_snapshots.end()) {
        if (auto shared = it->second.lock()) return shared;
    }
    if (m_snapshots.size() > 4096) {  // drop the expired ones now and then
        std::erase_if(m_snapshots, [](const auto& kv) { return kv.second.expired(); });
    }
    auto shared = std::make_shared<const std::string>(std::move(content).release());
    m_snapshots[key] = shared;
    return shared;
}

void Contents::keep_for_readers(Ino ino) {
    const auto digest = m_pages.unkept_readers(ino);
    if (!digest) return;
    auto txn = m_store.read();
    if (!txn) return;
    auto attr = txn->getattr(ino);
    if (!attr || attr->digest != *digest) return;
    auto content = txn->read(ino);
    if (!content) return;
    m_pages.keep(ino, *digest, snapshot(*digest, std::move(*content)), false);
}

std::shared_ptr<const std::string> Contents::load(Ino ino, const core::Digest& digest,
                                                  core::Error* damage) {
    if (auto live = find_snapshot(digest)) return live;
    if (auto txn = m_store.read()) {
        auto attr = txn->getattr(ino);
        if (attr && attr->digest == digest) {
            auto content = txn->read(ino);
            if (content) return snapshot(digest, std::move(*content));
            if (content.error().code == core::kDamagedContent) {
                if (damage) *damage = content.error();
                return nullptr;
            }
        }
    }
    // Removed by this daemon since the open: an orphan.
    if (auto orphan = m_lookups.find_orphan(ino); orphan && orphan->attr.digest == digest)
        return orphan->content;
    // Replaced or removed by this daemon (keep_for_readers) or another process: kept
    // by renew_pin, or still in the pin if renew_pin has not seen the change yet.
    // Both under m_pin_mutex: renew_pin moves the content from one to the other.
    MutexLock pin_lock(m_pin_mutex);
    if (auto kept = m_pages.kept(ino, digest)) return kept;
    if (m_pin) {
        auto attr = m_pin->getattr(ino);
        if (attr && attr->digest == digest) {
            if (auto content = m_pin->read(ino)) return snapshot(digest, std::move(*content));
        }
    }
    return nullptr;
}

void Contents::renew_pin() {
    auto now = m_store.read();
    if (!now) return;
    MutexLock pin_lock(m_pin_mutex);
    if (m_pin && m_pin->id() == now->id())
        return;  // nothing committed since: the pin covers it all
    if (m_pin) {
        // Lazy readers whose version left the db between the pin and now: keep it
        // from the pin, where LMDB still holds its pages.
        for (const auto& [ino, digest] : m_pages.unkept_lazy()) {
            auto stored = now->getattr(ino);
            if (stored && stored->digest == digest) continue;  // still there: the READ finds it
            auto live = find_snapshot(digest);                 // a reader loaded it already
            if (!live) {
                auto old = m_pin->getattr(ino);
                if (!old || old->digest != digest)
                    continue;  // opened after the pin: pinned() copied it
                auto content = m_pin->read(ino);
                if (!content) {
                    log::error("keeping the content of inode {} for its readers: {}", ino,
                               content.error().message);
                    continue;
                }
                live = snapshot(digest, std::move(*content));
            }
            m_pages.keep(ino, digest, std::move(live), true);
        }
    }
    m_pin.reset();  // the old snapshot ends: LMDB may reuse what only it saw
    m_pin.emplace(std::move(*now));
}

bool Contents::pinned(Ino ino, const core::Digest& digest, const core::ReadTxn& txn) {
    MutexLock lock(m_pin_mutex);
    if (!m_pin) return false;
    if (m_pin->id() == txn.id()) return true;  // the same snapshot: the common case
    // The db changed since the pin: covered if the pin holds the same version.
    auto attr = m_pin->getattr(ino);
    return attr && attr->digest == digest;
}

}  // namespace kcache::fsd
