#include "lookups.hpp"

namespace kcache::fsd {
using core::Ino;

void Lookups::remember(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    ++m_inodes.at(ino).lookups;
}

std::optional<core::Digest> Lookups::forget(Ino ino, std::uint64_t count) {
    MutexLock lock(m_inodes.mutex);
    Inode* inode = m_inodes.find(ino);
    if (!inode || inode->lookups == 0) return std::nullopt;
    if (inode->lookups > count) {
        inode->lookups -= count;
        return std::nullopt;
    }
    inode->lookups = 0;
    std::optional<core::Digest> held;
    if (inode->orphan && inode->orphan->held) held = inode->orphan->attr.digest;
    inode->orphan.reset();  // the kernel will not ask for it again
    // Nor its page-cache state (bounded by the kernel's cache), unless a handle uses it.
    if (inode->pages && inode->pages->idle()) inode->pages.reset();
    m_inodes.prune(ino);
    return held;
}

bool Lookups::known(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    const Inode* inode = m_inodes.find(ino);
    return inode && inode->lookups > 0;
}

bool Lookups::adopt(Ino ino, const Orphan& orphan) {
    MutexLock lock(m_inodes.mutex);
    Inode* inode = m_inodes.find(ino);
    if (!inode || inode->lookups == 0) return false;
    inode->orphan = orphan;
    return true;
}

void Lookups::disown(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    if (Inode* inode = m_inodes.find(ino)) {
        inode->orphan.reset();
        m_inodes.prune(ino);
    }
}

std::optional<Orphan> Lookups::find_orphan(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    const Inode* inode = m_inodes.find(ino);
    if (!inode) return std::nullopt;
    return inode->orphan;
}

}  // namespace kcache::fsd
