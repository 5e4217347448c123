#include "blob_holds.hpp"

#include <algorithm>

#include "kcache/core/holds.hpp"
#include "log.hpp"

namespace kcache::fsd {
using core::Digest;
using core::Ino;

namespace {

// The record of `digest` among the versions the readers of `inode` read; null if none.
ReadVersion* find_version(Inode& inode, const Digest& digest) {
    auto& versions = inode.read_versions;
    auto it = std::find_if(versions.begin(), versions.end(),
                           [&](const ReadVersion& v) { return v.digest == digest; });
    return it == versions.end() ? nullptr : &*it;
}

// The same, made (no readers, not held) when there is none.
ReadVersion& version_of(Inode& inode, const Digest& digest) {
    if (ReadVersion* found = find_version(inode, digest)) return *found;
    return inode.read_versions.emplace_back(ReadVersion{digest});
}

}  // namespace

void BlobHolds::release(const Digest& digest, std::uint64_t count) {
    auto s = [&]() -> core::Status {
        auto txn = KCACHE_TRY(m_store.write());
        for (std::uint64_t i = 0; i < count; ++i) KCACHE_TRY(core::release_hold(txn, digest));
        return txn.commit();
    }();
    if (!s)
        log::warning("blob {}: its hold for an open file stays: {}", digest.hex(),
                     s.error().message);
}

void BlobHolds::release_all(const std::vector<Digest>& digests) {
    for (const Digest& digest : digests) release(digest, 1);
}

std::vector<Digest> BlobHolds::unread(Ino ino) {
    std::vector<Digest> gone;
    Inode* inode = m_inodes.find(ino);
    if (!inode) return gone;
    // A held version no reader reads goes, unless an open still counting may read it.
    std::erase_if(inode->read_versions, [&](const ReadVersion& v) {
        if (v.readers > 0 || (v.held && inode->opening_readers > 0)) return false;
        if (v.held) gone.push_back(v.digest);
        return true;
    });
    m_inodes.prune(ino);
    return gone;
}

void BlobHolds::opening(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    ++m_inodes.at(ino).opening_readers;
}

void BlobHolds::opened(FileHandle& handle) {
    std::vector<Digest> gone;
    {
        MutexLock lock(m_inodes.mutex);
        Inode& inode = m_inodes.at(handle.ino);
        --inode.opening_readers;
        if (!handle.snapshot_digest.empty()) {  // a follower reads a version being written
            ++version_of(inode, handle.snapshot_digest).readers;
            handle.counted_reader = true;
        }
        gone = unread(handle.ino);
    }
    release_all(gone);
}

void BlobHolds::abandoned(Ino ino) {
    std::vector<Digest> gone;
    {
        MutexLock lock(m_inodes.mutex);
        --m_inodes.at(ino).opening_readers;
        gone = unread(ino);
    }
    release_all(gone);
}

void BlobHolds::closed(const FileHandle& handle) {
    if (handle.counted_reader) {
        std::vector<Digest> gone;
        {
            MutexLock lock(m_inodes.mutex);
            if (Inode* inode = m_inodes.find(handle.ino)) {
                ReadVersion* version = find_version(*inode, handle.snapshot_digest);
                if (version && version->readers > 0) --version->readers;
                gone = unread(handle.ino);
            }
        }
        release_all(gone);
    }
    if (!handle.rebuilt_reader || !m_any_inherited.load()) return;
    std::optional<Inherited> last;
    {
        MutexLock lock(m_inherited_mutex);
        auto it = std::find_if(m_inherited.begin(), m_inherited.end(), [&](const Inherited& h) {
            return h.digest == handle.snapshot_digest && h.readers > 0;
        });
        if (it != m_inherited.end() && --it->readers == 0) {
            if (it->holds > 0) last = *it;
            m_inherited.erase(it);
        }
        m_any_inherited = !m_inherited.empty();
    }
    if (last) release(last->digest, last->holds);
}

core::Result<std::optional<Digest>> BlobHolds::hold_replaced(core::WriteTxn& txn, Ino ino) {
    auto stored = txn.getattr(ino);
    if (!stored || stored->digest.empty()) return std::nullopt;  // the publish says why
    bool read = false;
    {
        MutexLock lock(m_inodes.mutex);
        if (Inode* inode = m_inodes.find(ino)) {
            // An open still counting may have read it; a held one is held already.
            const ReadVersion* version = find_version(*inode, stored->digest);
            const bool held = version && version->held;
            read = !held && (inode->opening_readers > 0 || version);
        }
    }
    if (!read) return std::nullopt;
    KCACHE_TRY(core::hold_blob(txn, stored->digest));
    return stored->digest;
}

void BlobHolds::replaced(Ino ino, const Digest& held) {
    bool twice = false;  // two publishes both held it: one hold is enough
    std::vector<Digest> gone;
    {
        MutexLock lock(m_inodes.mutex);
        ReadVersion& version = version_of(m_inodes.at(ino), held);
        twice = version.held;
        version.held = true;
        gone = unread(ino);  // its readers closed since the check: let it go now
    }
    if (twice) release(held, 1);
    release_all(gone);
}

void BlobHolds::rebuilt(FileHandle& handle) {
    if (handle.snapshot_digest.empty()) return;  // empty: nothing to hold
    {
        MutexLock lock(m_inodes.mutex);
        ++version_of(m_inodes.at(handle.ino), handle.snapshot_digest).readers;
        handle.counted_reader = true;
    }
    // Counted for adopt(), which runs once every reader is rebuilt.
    MutexLock lock(m_inherited_mutex);
    handle.rebuilt_reader = true;
    auto it = std::find_if(m_inherited.begin(), m_inherited.end(),
                           [&](const Inherited& h) { return h.digest == handle.snapshot_digest; });
    if (it != m_inherited.end())
        ++it->readers;
    else
        m_inherited.push_back({handle.snapshot_digest, 0, 1});
}

void BlobHolds::adopt() {
    std::vector<Inherited> held;
    if (auto txn = m_store.read()) {
        (void)core::for_each_hold(*txn, [&](const Digest& digest, std::uint64_t count) {
            held.push_back({digest, count, 0});
            return true;
        });
    }
    std::vector<Inherited> unread;
    {
        MutexLock lock(m_inherited_mutex);
        for (Inherited& h : held) {
            for (const Inherited& r : m_inherited) {  // rebuilt readers, by digest
                if (r.digest == h.digest) h.readers = r.readers;
            }
        }
        m_inherited.clear();
        for (Inherited& h : held) (h.readers ? m_inherited : unread).push_back(h);
        m_any_inherited = !m_inherited.empty();
    }
    // Held for a reader that closed, or an orphan no handle had open (a successor
    // cannot open an orphan: ESTALE): nothing can read them any more.
    for (const Inherited& h : unread) release(h.digest, h.holds);
}

}  // namespace kcache::fsd
