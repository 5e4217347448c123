#include "lookups.hpp"

#include "page_cache.hpp"

namespace kcache::fsd {
using core::Ino;

void Lookups::remember(Ino ino) {
    MutexLock lock(m_mutex);
    ++m_lookups[ino];
}

void Lookups::forget(Ino ino, std::uint64_t count) {
    MutexLock lock(m_mutex);
    auto it = m_lookups.find(ino);
    if (it == m_lookups.end()) return;
    if (it->second > count) {
        it->second -= count;
        return;
    }
    m_lookups.erase(it);
    m_orphans.erase(ino);  // the kernel will not ask for it again
    // Nor its page-cache state (bounded by the kernel's cache), unless a handle uses it.
    m_pages.forget(ino);
}

bool Lookups::known(Ino ino) {
    MutexLock lock(m_mutex);
    return m_lookups.count(ino) > 0;
}

void Lookups::adopt(Ino ino, const Orphan& orphan) {
    MutexLock lock(m_mutex);
    if (m_lookups.count(ino)) m_orphans[ino] = orphan;
}

void Lookups::disown(Ino ino) {
    MutexLock lock(m_mutex);
    m_orphans.erase(ino);
}

std::optional<Orphan> Lookups::find_orphan(Ino ino) {
    MutexLock lock(m_mutex);
    auto it = m_orphans.find(ino);
    if (it == m_orphans.end()) return std::nullopt;
    return it->second;
}

}  // namespace kcache::fsd
