#define FUSE_USE_VERSION 312
#include "kernel_notifier.hpp"

#include <fuse_lowlevel.h>

#include <algorithm>
#include <cstring>

#include "log.hpp"

namespace kcache::fsd {

void KernelNotifier::start(fuse_session* session) {
    m_session = session;
    if (auto txn = m_store.read()) {  // follow from now on: the kernel knows nothing older
        if (auto end = core::EventCursor::at_end(*txn)) m_events = *end;
    }
}

bool KernelNotifier::close() {
    {
        MutexLock lock(m_mutex);
        if (m_closed) return false;
        m_closed = true;
    }
    m_wake.notify_all();
    return true;
}

void KernelNotifier::finish() {
    m_session = nullptr;
    std::vector<std::function<void()>>
        after;  // replies still owed (their notification no longer matters)
    {
        MutexLock lock(m_mutex);
        after.swap(m_after_invalidation);
    }
    run_all(after);
}

void KernelNotifier::invalidate_inode(core::Ino ino) {
    {
        MutexLock lock(m_mutex);
        m_inodes_to_invalidate.push_back(ino);
    }
    m_wake.notify_all();
}

void KernelNotifier::invalidate_attr(core::Ino ino, std::function<void()> then) {
    {
        MutexLock lock(m_mutex);
        m_attrs_to_invalidate.push_back(ino);
        if (then) m_after_invalidation.push_back(std::move(then));
    }
    m_wake.notify_all();
}

void KernelNotifier::grow_size(core::Ino ino, std::uint64_t size, char last_byte,
                               std::function<void()> then) {
    {
        MutexLock lock(m_mutex);
        m_sizes_to_grow.push_back({ino, size, last_byte});
        m_after_invalidation.push_back(std::move(then));
    }
    m_wake.notify_all();
}

void KernelNotifier::run_all(std::vector<std::function<void()>>& after) {
    for (auto& f : after) f();
    after.clear();
}

std::optional<KernelNotifier::Queued> KernelNotifier::take(std::chrono::milliseconds period) {
    Queued queued;
    MutexLock lock(m_mutex);
    const auto deadline = std::chrono::steady_clock::now() + period;
    while (!m_closed && m_inodes_to_invalidate.empty() && m_attrs_to_invalidate.empty() &&
           m_sizes_to_grow.empty()) {
        if (!m_wake.wait_until(m_mutex, deadline)) break;
    }
    if (m_closed) return std::nullopt;
    queued.inodes.swap(m_inodes_to_invalidate);
    queued.attrs.swap(m_attrs_to_invalidate);
    queued.growths.swap(m_sizes_to_grow);
    queued.after.swap(m_after_invalidation);
    return queued;
}

void KernelNotifier::tell(Queued queued) {
    // Attributes and sizes first, and the replies that wait for them. Neither
    // waits on a request handler: an attribute notification takes no lock a
    // request holds, and a stored byte at most waits for a READ filling its page,
    // which a request thread answers without this thread.
    notify_attrs(std::move(queued.attrs));
    notify_sizes(queued.growths);
    run_all(queued.after);
    notify(queued.inodes, {});
}

void KernelNotifier::follow_events() {
    std::vector<core::Ino> inodes;
    std::vector<std::pair<core::Ino, std::string>> entries;
    {
        auto txn = m_store.read();
        if (!txn) return;
        auto lost = m_events.read(*txn, [&](const core::Event& e) {
            switch (e.kind) {
                case core::EventKind::evict:
                case core::EventKind::remove:
                case core::EventKind::rename:
                case core::EventKind::import:
                case core::EventKind::populate:
                case core::EventKind::member:  // a file of a stem entry, by its own name
                    if (e.parent) entries.emplace_back(e.parent, e.name);
                    inodes.push_back(e.entry);
                    break;
                default:
                    break;  // hits, pins, resets change nothing the kernel caches
            }
            return true;
        });
        if (lost && *lost) {
            log::warning(
                "{} events were trimmed from the log before the daemon read them: "
                "the kernel may keep names of what they changed until they expire",
                *lost);
        }
    }  // the snapshot ends before the kernel is told anything
    notify(inodes, entries);
}

void KernelNotifier::notify_attrs(std::vector<core::Ino> inodes) {
    if (!m_session) return;
    std::sort(inodes.begin(), inodes.end());
    inodes.erase(std::unique(inodes.begin(), inodes.end()), inodes.end());
    // A negative offset: attributes only, the page cache stays (ENOENT when the
    // kernel holds nothing of the inode: harmless).
    for (core::Ino ino : inodes) fuse_lowlevel_notify_inval_inode(m_session, ino, -1, 0);
}

void KernelNotifier::notify_sizes(const std::vector<Growth>& growths) {
    if (!m_session) return;
    for (const Growth& g : growths) {
        // NOTIFY_STORE of the last byte: the kernel extends its size to the end of
        // what it stores (and never shrinks it), and invalidates the size it held.
        fuse_bufvec buf = FUSE_BUFVEC_INIT(1);
        char byte = g.last_byte;
        buf.buf[0].mem = &byte;
        const int err = fuse_lowlevel_notify_store(m_session, g.ino, static_cast<off_t>(g.size - 1),
                                                   &buf, fuse_buf_copy_flags{});
        if (err != 0 && err != -ENOENT)
            log::warning("telling the kernel the size of inode {}: {}", g.ino, strerror(-err));
    }
}

void KernelNotifier::notify(const std::vector<core::Ino>& inodes,
                            const std::vector<std::pair<core::Ino, std::string>>& entries) {
    if (!m_session) return;
    // Errors are expected and harmless: ENOENT when the kernel has nothing cached.
    for (const auto& [parent, name] : entries) {
        fuse_lowlevel_notify_inval_entry(m_session, parent, name.c_str(), name.size());
    }
    for (core::Ino ino : inodes) fuse_lowlevel_notify_inval_inode(m_session, ino, 0, 0);
}

}  // namespace kcache::fsd
