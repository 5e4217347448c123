// Page-cache coherence in kcache-fsd: which version of an inode the kernel's page
// cache (and its one size of the inode) holds, who reads and writes through it, and
// what the kernel was told to keep of the inode's attributes.
//
// The page cache of an inode, and the kernel's size of it, are shared by all its
// readers: at most one version at a time is read through them, and while it is, the
// kernel's size must stay that version's. Writers write through the page cache (so
// MAP_SHARED works and every handle of a version sees one page cache); readers that
// open while a writer is at work, or while another version's readers read, use
// direct I/O. A writer's open waits (at most kWriterWait, then the writer gate thread
// answers it) until readers of other processes reading through the page cache have
// closed: its writes would grow the size they read up to.
//
// Contract: every handle counted in (enter, enter_as_writer) is counted out
// (leave, leave_as_writer) before it is deleted. Nothing here fails, touches the db
// or notifies the kernel; replies handed to admit_writer are sent by leave() or the
// writer gate thread, with no lock held. It also keeps content for lazy readers
// (PageState::kept) on behalf of Contents, which decides what to keep.
//
// Its state per inode is part of the inode's record in the inode table (inodes.hpp:
// Inode::pages, a PageState).
//
// Locks (lock_order.hpp): the inode table's, level 6. It guards this unit's state and
// FileHandle::refilling, page_writer and closed_clean.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "inodes.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"

namespace kcache::fsd {

struct FileHandle;
struct Version;

class PageCache {
  public:
    explicit PageCache(Inodes& inodes) : m_inodes(inodes) {}
    ~PageCache() { stop(); }
    PageCache(const PageCache&) = delete;
    PageCache& operator=(const PageCache&) = delete;

    // The writer gate thread (answers writers whose readers outlast kWriterWait).
    void start();
    void stop();

    // How a new reader (`reader`, a handle of `digest` of `size`) may use the page
    // cache: keep (the kernel's pages are its version's: it loads its content lazily,
    // FileHandle::lazy), refill (the kernel drops its pages when the open completes),
    // or direct (not at all: a writer is at work, or another version's readers read).
    // `stale_attr`: the kernel may hold attributes told of another version of the
    // inode (PageState::told); the reader's open is answered only once they are gone.
    enum class Use { keep, refill, direct };
    Use enter(FileHandle* reader, const core::Digest& digest, std::uint64_t size, bool* stale_attr);
    // A refilling reader's first READ: its open completed, so the kernel's pages hold
    // only its version from now on.
    void settle(FileHandle* reader);
    // Counts in a read-only handle that opened following shared version `version`: it
    // reads that version's writers' pages. A writer of another version waits for it
    // (admit_writer) and other readers bypass the pages while it reads (enter).
    void enter_as_follower(FileHandle* reader, const std::shared_ptr<Version>& version);
    // Counts a reader (or follower) out; writers that waited only for it are answered.
    void leave(FileHandle* reader);

    // Answers a writer's open (`reply`) now, or once the readers that other processes
    // have reading its inode through the page cache have closed (at most kWriterWait).
    // For OPEN and CREATE. A CREATE is answered while the kernel holds its directory's
    // lock, which the background thread's notifications of names in it take: such a
    // notification waits with it, at most kWriterWait (only a CREATE of an existing
    // file that others read through the page cache waits at all).
    // `version`: the one the writer writes (FileHandle::version; null for an orphan).
    void admit_writer(FileHandle* writer, const std::shared_ptr<Version>& version,
                      std::function<void()> reply);
    // Counts a writer of its inode in (new readers then read directly) and returns the
    // readers already reading through the page cache, with the threads that opened them.
    std::vector<std::pair<FileHandle*, pid_t>> enter_as_writer(
        FileHandle* writer, const std::shared_ptr<Version>& version);
    void leave_as_writer(FileHandle* writer);
    // Marks a page writer as closed with its version published as `published` (or,
    // with `clean` false, written to again): a reader of that version opening before
    // the writer's RELEASE uses the page cache (enter).
    void close_writer(FileHandle* writer, bool clean, const core::Digest& published);

    // The size of the version being read through the page cache of `ino`, if any.
    std::optional<std::uint64_t> size(core::Ino ino);
    // A truncate by path changed the stored file in place, for everybody as on a local
    // disk (its pages are dropped): the size told while its readers read is `size`.
    void resize(core::Ino ino, std::uint64_t size);
    // Whether the kernel may keep the attributes `a` of a regular file that no writer
    // has at work: no page writer, no page-cache reader of another version. If so,
    // `a`'s version is recorded as told (PageState::told).
    bool tell_attr(const core::Attr& a);
    // (The kernel forgetting `ino` drops its idle state: Lookups::forget.)

    // ---- content kept for lazy readers (Contents decides; see contents.hpp) ----
    // The version read through the page cache of `ino` while it has readers and
    // nothing kept for it.
    std::optional<core::Digest> unkept_readers(core::Ino ino);
    // Keeps `content` of `digest` for the readers of `ino`, if they still read it
    // (with `lazy_only`: if lazy readers do) and nothing is kept yet.
    void keep(core::Ino ino, const core::Digest& digest, std::shared_ptr<const std::string> content,
              bool lazy_only);
    std::shared_ptr<const std::string> kept(core::Ino ino, const core::Digest& digest);
    // Inodes with lazy readers and nothing kept, with the version they read.
    std::vector<std::pair<core::Ino, core::Digest>> unkept_lazy();

    static constexpr auto kWriterWait = std::chrono::seconds(2);

  private:
    struct WaitingWriter {
        FileHandle* writer;
        std::vector<FileHandle*> readers;  // still open: the writer's open waits for them
        std::chrono::steady_clock::time_point deadline;
        std::function<void()> reply;
    };
    void run_writer_gate();

    // The page state of `ino`, or null; the record's, made (empty) if needed.
    PageState* find(core::Ino ino) REQUIRES(m_inodes.mutex);
    PageState& at(core::Ino ino) REQUIRES(m_inodes.mutex);

    Inodes& m_inodes;
    // Inodes whose PageState::lazy > 0.
    std::unordered_set<core::Ino> m_lazy_inodes GUARDED_BY(m_inodes.mutex);
    std::vector<WaitingWriter> m_waiting_writers GUARDED_BY(m_inodes.mutex);
    CondVar m_writer_gate_wake;  // a writer waits, or stop
    bool m_writer_gate_stop GUARDED_BY(m_inodes.mutex) = false;
    std::thread m_writer_gate;  // started and joined by start() and stop() only
};

}  // namespace kcache::fsd
