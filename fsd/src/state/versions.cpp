#include "versions.hpp"

#include <algorithm>

namespace kcache::fsd {
using core::Attr;
using core::Ino;

core::Status Versions::join(Ino ino, bool truncate, std::uint32_t opener,
                            std::optional<core::StagedFile> made, std::shared_ptr<Version>* out) {
    std::shared_ptr<Version> joined;
    bool truncate_shared = false;
    for (;;) {
        {
            MutexLock lock(m_inodes.mutex);
            while (ending(ino)) m_inodes.version_ended.wait(m_inodes.mutex);
            Inode& inode = m_inodes.at(ino);
            if (inode.shared) {
                joined = inode.shared;  // an O_TRUNC open truncates it, as on a local disk
                truncate_shared = truncate;
            } else if (!truncate && !inode.rewrites.empty()) {
                // A handle that shares the file meets a rewrite at work: as on a local
                // disk, they share one file from now on (the newest rewrite's content).
                joined = inode.rewrites.back();
                inode.rewrites.pop_back();
                joined->shared = true;
                inode.shared = joined;
            } else if (made) {
                joined = std::make_shared<Version>(std::move(*made), !truncate, opener);
                made.reset();
                joined->touched = ++m_write_clock;
                joined->spill_id = m_spills.next_id();
                if (truncate)
                    inode.rewrites.push_back(joined);
                else
                    inode.shared = joined;
            }
            if (joined) {
                ++joined->handles;
                break;
            }
            m_inodes.prune(ino);  // made by at() above
        }
        // A new version: begin it outside the lock (a write transaction), then decide again.
        auto staged = KCACHE_TRY(core::StagedFile::begin(m_store, ino, truncate));
        staged.set_max_size(m_max_file_size);
        made = std::move(staged);
    }
    if (made) (void)made->abandon();  // another handle's version was taken instead
    *out = joined;
    MutexLock lock(joined->mutex);
    // Its first change on (an O_TRUNC at once) outlives this daemon (spill.hpp).
    if (joined->spill_id && !joined->ended && !joined->staged.mirrored())
        joined->staged.mirror_to(m_spills.mirror(ino, joined->spill_id));
    if (truncate_shared) {
        if (auto s = joined->staged.truncate(0); !s) return s;
    }
    return {};
}

core::Result<bool> Versions::adopt(Ino ino, SpillKey key, std::uint32_t opener,
                                   std::shared_ptr<Version>* adopted) {
    const std::uint32_t id = key & ~kRewrite;
    auto find = [&]() REQUIRES(m_inodes.mutex) -> std::shared_ptr<Version> {
        Inode* inode = m_inodes.find(ino);
        if (!inode) return nullptr;
        if (inode->shared && inode->shared->spill_id == id) return inode->shared;
        for (const auto& v : inode->rewrites)
            if (v->spill_id == id) return v;
        return nullptr;
    };
    {
        MutexLock lock(m_inodes.mutex);
        if (auto v = find()) {  // another handle of it was rebuilt first
            // Rebuilt as a rewrite from an older record, while this handle's record says
            // it was promoted since (a handle that shares the file met it): shared now.
            Inode& inode = m_inodes.at(ino);
            if (!(key & kRewrite) && !v->shared && !inode.shared) {
                std::erase(inode.rewrites, v);
                v->shared = true;
                inode.shared = v;
            }
            ++v->handles;
            *adopted = std::move(v);
            return true;
        }
    }
    auto spilled = m_spills.load(ino, id);
    if (!spilled) return false;
    // Rebuilt as it was: its content from the spill file, the stored one as its start.
    auto staged = KCACHE_TRY(core::StagedFile::begin(m_store, ino, /*truncate=*/true));
    staged.set_max_size(m_max_file_size);
    if (auto s = staged.write(0, spilled->content); !s) {
        (void)staged.abandon();
        return tl::unexpected(s.error());
    }
    staged.mirror_to(std::move(spilled->mirror), /*holds_content=*/true);
    const bool rewrite = key & kRewrite;
    auto version = std::make_shared<Version>(std::move(staged), !rewrite, opener);
    version->spill_id = id;
    MutexLock lock(m_inodes.mutex);  // rebuilds run one at a time (HandleTable)
    Inode& inode = m_inodes.at(ino);
    version->touched = ++m_write_clock;
    if (!rewrite && !inode.shared) {
        inode.shared = version;
    } else {
        version->shared = false;
        inode.rewrites.push_back(version);
    }
    ++version->handles;
    *adopted = std::move(version);
    return true;
}

bool Versions::ending(Ino ino) {
    const Inode* inode = m_inodes.find(ino);
    if (!inode) return false;
    if (inode->shared && inode->shared->ending) return true;
    return std::any_of(inode->rewrites.begin(), inode->rewrites.end(),
                       [](const auto& v) { return v->ending; });
}

bool Versions::leave(Version& version) {
    MutexLock lock(m_inodes.mutex);
    if (--version.handles > 0) return false;
    version.ending = true;  // no handle joins it any more; new ones wait for its end
    return true;
}

void Versions::ended(Ino ino, const std::shared_ptr<Version>& version) {
    {
        MutexLock lock(m_inodes.mutex);
        if (Inode* inode = m_inodes.find(ino)) {
            if (inode->shared == version) inode->shared.reset();
            std::erase(inode->rewrites, version);
            m_inodes.prune(ino);
        }
        version->ending = false;
    }
    if (version->spill_id) m_spills.remove(ino, version->spill_id);  // published, or dropped
    m_inodes.version_ended.notify_all();
}

std::shared_ptr<Version> Versions::shared(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    const Inode* inode = m_inodes.find(ino);
    return inode ? inode->shared : nullptr;
}

bool Versions::has_rewrite(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    const Inode* inode = m_inodes.find(ino);
    return inode && !inode->rewrites.empty();
}

bool Versions::at_work(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    const Inode* inode = m_inodes.find(ino);
    return inode && (inode->shared || !inode->rewrites.empty());
}

std::optional<std::uint64_t> Versions::rewrite_size(Ino ino, std::uint32_t process) {
    std::shared_ptr<Version> newest;
    {
        MutexLock lock(m_inodes.mutex);
        const Inode* inode = m_inodes.find(ino);
        if (!inode) return std::nullopt;
        for (const auto& v : inode->rewrites) {
            if (v->opener == process && (!newest || v->touched > newest->touched)) newest = v;
        }
    }
    if (!newest) return std::nullopt;
    MutexLock lock(newest->mutex);
    return newest->staged.size();
}

core::Result<bool> Versions::truncate(Ino ino, std::uint64_t size, std::uint64_t* shared_size) {
    std::vector<std::shared_ptr<Version>> versions;
    std::shared_ptr<Version> shared;
    {
        MutexLock lock(m_inodes.mutex);
        const Inode* inode = m_inodes.find(ino);
        if (!inode) return false;
        shared = inode->shared;
        versions = inode->rewrites;
    }
    // On a local disk a truncate by path cuts the one file every writer shares: the
    // rewrites' staged copies are cut too. A version that ended (its last release
    // published it; it leaves the registry just after) is the stored file now: cutting
    // its staged copy would cut nothing, so the db's content is truncated instead.
    // A rewrite began empty, so it has no stored content to read: cutting it cannot
    // fail (the size was checked against the limits before).
    for (const auto& v : versions) {
        MutexLock lock(v->mutex);
        if (!v->ended) (void)v->staged.truncate(size);
    }
    if (!shared) return false;
    MutexLock lock(shared->mutex);
    if (shared->ended) return false;
    KCACHE_TRY(shared->staged.truncate(size));
    *shared_size = shared->staged.size();
    return true;
}

void Versions::apply_live_size(Attr& attr) {
    if (!attr.is_regular()) return;
    if (auto version = shared(attr.ino)) {
        MutexLock lock(version->mutex);
        attr.size = version->staged.size();
    }
}

}  // namespace kcache::fsd
