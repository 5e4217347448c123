// Telling the kernel what changed behind the mount: entries evicted, removed, renamed,
// imported or populated by anyone (it follows the db's events log, so `kcache evict` in
// another process shows in the mount at once), files whose content a writer published,
// attributes a handler changed, and sizes a reader's version grew to. Notifications
// never come from a request handler: the kernel may hold a directory lock while it
// waits for that handler's reply. So handlers queue them here and the background
// thread (background.hpp) sends them.
//
// Contract:
//  - invalidate_inode / invalidate_attr / grow_size: request handlers, any thread;
//    they queue and wake the background thread, never block on the kernel. The `then`
//    of invalidate_attr and grow_size is a reply that must follow its notification: it
//    runs on the background thread after the kernel was told, or at finish().
//  - take / tell / follow_events: the background thread only (Background::run), which
//    takes the queue once a period (or sooner, when something is queued), tells the
//    kernel, then follows the events log.
//  - close() makes take() answer "stop"; finish(), once the background thread ended,
//    forgets the session and runs the replies still owed.
// Threads: none of its own; it runs on the background thread. Locks (lock_order.hpp):
// m_mutex, level 8, a leaf: it guards the queues and m_closed; the replies it runs
// after a notification (`then`) run with it let go.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kcache/core/events.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

struct fuse_session;

namespace kcache::fsd {

class KernelNotifier {
  public:
    explicit KernelNotifier(core::Store& store) : m_store(store) {}
    KernelNotifier(const KernelNotifier&) = delete;
    KernelNotifier& operator=(const KernelNotifier&) = delete;

    // Follows events from the newest one on (the kernel knows nothing older); `session`
    // receives notifications. Before the background thread starts.
    void start(fuse_session* session);

    // ---- for request handlers: thread-safe, never block on the kernel ----
    void invalidate_inode(core::Ino ino);
    // The kernel forgets the inode's attributes only (its pages stay), then `then`
    // runs on the background thread (a reply that must follow the invalidation).
    void invalidate_attr(core::Ino ino, std::function<void()> then = {});
    // The kernel's size of the inode becomes at least `size`, then `then` runs on the
    // background thread. The kernel applies every size it is told to the one inode
    // (a stat during a rewrite tells the stored version's), and silently drops a
    // GETATTR answer that crossed a notification, reading on with the size it had:
    // a reader whose version is longer would stop short. Growing it cannot be undone
    // by a crossing; a size too large is corrected by the first short READ.
    // `last_byte` is the version's byte at size - 1 (the notification stores it).
    void grow_size(core::Ino ino, std::uint64_t size, char last_byte, std::function<void()> then);

    // ---- for the background thread ----
    struct Growth {
        core::Ino ino;
        std::uint64_t size;
        char last_byte;
    };
    // What handlers queued since the last take().
    struct Queued {
        std::vector<core::Ino> inodes, attrs;
        std::vector<Growth> growths;
        std::vector<std::function<void()>> after;  // replies owed once the kernel was told
    };
    // Waits until something is queued or `period` passed, and takes the queue; none
    // once close() was called.
    std::optional<Queued> take(std::chrono::milliseconds period);
    // Tells the kernel what `queued` holds and runs the replies that wait for it.
    void tell(Queued queued);
    // Reads the events log from where it stopped and tells the kernel what changed.
    void follow_events();

    // ---- stopping ----
    // take() answers none from now on (and wakes). False when it was closed already.
    bool close();
    // After the background thread ended: forgets the session and runs the replies still
    // owed (their notification no longer matters).
    void finish();

  private:
    void notify(const std::vector<core::Ino>& inodes,
                const std::vector<std::pair<core::Ino, std::string>>& entries);
    void notify_attrs(std::vector<core::Ino> inodes);
    void notify_sizes(const std::vector<Growth>& growths);
    static void run_all(std::vector<std::function<void()>>& after);

    core::Store& m_store;
    fuse_session* m_session = nullptr;  // set by start(), cleared by finish()
    core::EventCursor m_events;         // where follow_events() goes on from
    Mutex m_mutex KCACHE_LEVEL(8);      // a leaf
    CondVar m_wake;                     // something queued, or close()
    bool m_closed GUARDED_BY(m_mutex) = false;
    std::vector<core::Ino> m_inodes_to_invalidate GUARDED_BY(m_mutex);
    std::vector<core::Ino> m_attrs_to_invalidate GUARDED_BY(m_mutex);
    std::vector<Growth> m_sizes_to_grow GUARDED_BY(m_mutex);
    std::vector<std::function<void()>> m_after_invalidation GUARDED_BY(m_mutex);
};

}  // namespace kcache::fsd
