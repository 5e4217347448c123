// The FUSE filesystem over a kcache store (libfuse3 low-level API).
//
// Inode numbers are the store's: stable, never reused, so the daemon keeps no
// per-inode state and needs no FORGET bookkeeping. State lives in open handles and in
// the versions writers build:
// - a reader's handle holds a snapshot of the content it opened (shared between
//   handles of the same content), so an unlink or eviction never breaks a read;
// - a writer's handle writes a Version: content in memory (a core::StagedFile) that is
//   published in one transaction at fsync, at close and at the last release.
// - THE RULE (docs/architecture.md, "Several handles on one file"): an inode has at
//   most one *shared* version. Every handle opened for writing without O_TRUNC uses
//   it (it is made from the published content, or from a rewrite it promotes), and so
//   does an O_TRUNC open while it exists (the truncation applies to it, as on a local
//   disk). Read-only handles opened while it exists read it, and a read-only handle
//   of the version it started from follows it. What one handle writes is therefore
//   read by every handle afterwards, and no close or fsync ever discards another
//   handle's writes: a close publishes the whole shared version. An O_TRUNC open (or
//   a create with O_TRUNC) while there is no shared version is a *rewrite*: a private
//   version, invisible to others until its opener closes it (the compilers' whole-file
//   pattern; readers keep reading a complete version; a writer killed by a signal
//   publishes nothing). Concurrent rewrites stay private to each other: the last
//   close wins with one whole version.
// - a file removed (unlink, rename over it) while the kernel still knows its inode
//   stays readable as an orphan until the kernel forgets it, as an unlinked inode
//   does on a local disk; writes to it are accepted and dropped.
// Caching: entries and directory attributes are cached by the kernel for a long
// time and invalidated explicitly (Background). File attributes too, while the
// answer is everybody's (attr_timeout): no writer at work, no page-cache reader of
// another version; otherwise timeout 0 and getattr answers with the shared version,
// the open handle's view, or the newest rewrite of the caller. Every change of a
// settled answer (a writer's open and close, publish, setattr, a removal, another
// version entering the page cache, events of other processes) is followed by an
// attribute invalidation from the background thread; a reader that opens another
// version than the kernel was told of is answered only after that invalidation.
// A reader opened onto the kernel's kept pages loads its content at its first READ. Writers use the page cache (so MAP_SHARED works
// and every handle sees one page cache); readers that open while a writer is at work
// and do not read the shared version use direct I/O: a rewrite's bytes in the page
// cache are never theirs, and their reads end where their own version ends. The
// kernel's one size per inode is the last shared thing: a writer's open waits (at
// most kWriterWait) until readers of other processes that read the inode through the
// page cache have closed.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "background.hpp"
#include "kcache/core/staged.hpp"
#include "kcache/core/store.hpp"
#include "options.hpp"
#include "remote_tier.hpp"

namespace kcache::fsd {

class Filesystem {
public:
    Filesystem(core::Store& store, const Options& options);
    ~Filesystem();

    // The operation table; every callback's userdata is a Filesystem*.
    static const fuse_lowlevel_ops& operations();

    void start(fuse_session* session);
    // The shared tier (kcache-fsd --remote), before start(); it must outlive every
    // request and be stopped before stop(): its callbacks answer lookups.
    void attach_remote(RemoteTier* remote) { m_remote = remote; }
    void stop() { m_background.stop(); }

    // ---- handlers (called from libfuse's worker threads) ----
    void init(fuse_conn_info* conn);
    void lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
    void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
    void readlink(fuse_req_t req, fuse_ino_t ino);
    void mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev);
    void mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
    void unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
    void rmdir(fuse_req_t req, fuse_ino_t parent, const char* name);
    void symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name);
    void rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
                const char* new_name, unsigned int flags);
    void link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name);
    void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
    void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
    void write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
               fuse_file_info* fi);
    void flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
    void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi,
                 bool plus);
    void releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void statfs(fuse_req_t req, fuse_ino_t ino);
    void forget(fuse_ino_t ino, std::uint64_t count);

private:
    struct FileHandle;
    struct DirHandle;
    struct Version;
    // The versions being written of one inode (THE RULE above).
    struct InodeVersions {
        std::shared_ptr<Version> shared;                 // at most one
        std::vector<std::shared_ptr<Version>> rewrites;  // private O_TRUNC versions, oldest first
    };

    struct Orphan {
        core::Attr attr;
        std::shared_ptr<const std::string> content;
    };

    void reply_error(fuse_req_t req, const core::Error& error);
    // LOOKUP; a miss of a name that could be an entry is read through the shared tier
    // first when `read_through` (then answered from a tier thread, asynchronously).
    void answer_lookup(fuse_req_t req, core::Ino parent, const char* name, bool read_through);
    // Makes a node in one transaction and replies with its entry.
    void make_node(fuse_req_t req,
                   const std::function<core::Result<core::Attr>(core::WriteTxn&, const fuse_ctx&)>& make);
    // Replies with an entry the kernel now holds a lookup reference on.
    void reply_entry(fuse_req_t req, const core::Attr& attr);
    void remember_lookup(core::Ino ino);
    // Before a removal: keeps the content of `name` in `parent` if the kernel knows it.
    std::optional<std::pair<core::Ino, Orphan>> orphan_of(const core::ReadTxn& txn, core::Ino parent,
                                                          const char* name);
    void adopt(std::optional<std::pair<core::Ino, Orphan>>& orphan);
    void disown(const std::optional<std::pair<core::Ino, Orphan>>& orphan);
    // Runs `remove` (an unlink, or a rename over `name`) in one transaction, keeping
    // the removed file readable as an orphan while the kernel still knows it.
    core::Status remove_keeping_orphan(core::Ino parent, const char* name,
                                       const std::function<core::Status(core::WriteTxn&)>& remove);
    std::optional<Orphan> find_orphan(core::Ino ino);
    // Attributes of a file removed from the db that a handle or orphan still holds.
    std::optional<core::Attr> removed_attr(core::Ino ino, FileHandle* handle);
    // Gives `handle` (opened for writing, `truncate` for O_TRUNC) its version under
    // THE RULE. `made` is a StagedFile already begun for it (create), or null: then
    // one is begun here when a new version is needed. Waits while a version of the
    // inode is ending (its last close is publishing), so that a new version starts
    // from what that one published.
    core::Status join_version(FileHandle* handle, bool truncate, std::optional<core::StagedFile> made);
    // Takes `handle` out of its version; the last handle of a version publishes it
    // (unless it is a rewrite whose writer was killed) and ends its lease.
    void leave_version(fuse_req_t req, FileHandle* handle);
    std::shared_ptr<Version> shared_version(core::Ino ino);
    bool has_rewrite(core::Ino ino);
    // Every size the kernel is told of a file with a shared version is that version's
    // (lookup, readdirplus, create, setattr, getattr): the kernel applies it to the one
    // inode whose pages the version's handles map, and a smaller one would cut them
    // (SIGBUS in a MAP_SHARED mapping, such as SQLite's -shm).
    void apply_live_size(core::Attr& attr);
    // A read-only handle follows the shared version that grew out of the version it
    // reads (caller holds handle->mutex).
    void follow_shared(FileHandle* handle);
    // The size the newest rewrite that `process` opened of `ino` has staged, if any.
    std::optional<std::uint64_t> rewrite_size(core::Ino ino, std::uint32_t process);
    // A truncate by path: applied to the shared version (then true: nothing to store)
    // and to every rewrite; false when the db's content must be truncated too.
    bool truncate_versions(core::Ino ino, std::uint64_t size, std::uint64_t* shared_size);
    // Publishes a version's content, first making room under the size bound (caller
    // holds version.mutex).
    core::Status publish(fuse_req_t req, Version& version);
    // The page cache of an inode, and the kernel's size of it, are shared by all its
    // readers: at most one version at a time is read through them, and while it is,
    // the kernel's size must stay that version's. enter_pages says how `reader` (a new
    // handle of `digest`) may use them: not at all while a writer is at work (its
    // writes move the kernel's size) or another version's readers read.
    // `stale_attr`: the kernel may hold attributes told of another version of the
    // inode (PageState::told); the reader's open is answered only once they are gone.
    enum class PageUse { keep, refill, direct };
    PageUse enter_pages(FileHandle* reader, const core::Digest& digest, std::uint64_t size, bool* stale_attr);
    // A refilling reader's first READ: its open completed, so the kernel's pages hold
    // only its version from now on.
    void settle_pages(FileHandle* reader);
    void enter_pages_as_follower(FileHandle* reader, const Version* version);
    void leave_pages(FileHandle* reader);
    // How long the kernel may keep the attributes `a` of an inode: long (and recorded
    // in PageState::told) while every caller gets that answer (no writer at work, no
    // page-cache reader of another version, not removed), else 0. Every change of that
    // answer is followed by Background::invalidate_attr.
    double attr_timeout(const core::Attr& a);
    // Before the stored content of `ino` is replaced by a publish: page-cache readers
    // of it that load lazily keep it (PageState::kept) until the last one closes.
    void keep_for_readers(core::Ino ino);
    // A lazy reader's content (`digest` of `ino`): a live snapshot, the stored one, an
    // orphan, what renew_pin or keep_for_readers kept, or the pin's; null only if
    // reading failed.
    std::shared_ptr<const std::string> load_content(core::Ino ino, const core::Digest& digest);
    // A reader keeps its version even when it loads it lazily (docs/architecture.md,
    // "A reader keeps its version"). The background thread holds one read snapshot,
    // the *pin*, from its previous period; LMDB keeps every page that snapshot sees
    // alive, whoever commits after it. renew_pin (background thread, every period in
    // which the db changed) takes a new snapshot and, for every inode with lazy
    // readers whose version is no longer the stored one, keeps the version's content
    // from the pin (PageState::kept) before it lets the pin go.
    void renew_pin();
    // Whether a lazy reader of `digest` of `ino` (already counted in PageState::lazy)
    // is covered by the pin; `txn` is the snapshot its OPEN read. If not, the open
    // copies its content at once.
    bool pinned(core::Ino ino, const core::Digest& digest, const core::ReadTxn& txn);
    // READ without a handle (read-only serving, no OPEN): the stored content.
    void read_unopened(fuse_req_t req, core::Ino ino, size_t size, off_t off);
    // The size of the version being read through the page cache of `ino`, if any.
    std::optional<std::uint64_t> page_cache_size(core::Ino ino);
    // Answers a writer's open (`reply`) now, or once the readers that other processes
    // have reading its inode through the page cache have closed: its writes would
    // grow the size those readers read up to, and they would read zeros. Readers that
    // outlast kWriterWait (an mmap kept for long) no longer hold it up; the writer
    // gate thread answers then. Only for OPEN: a CREATE is answered while the kernel
    // holds its directory's lock, which the background thread's notifications take.
    void admit_writer(FileHandle* writer, std::function<void()> reply);
    // Counts a writer of its inode in (new readers then read directly) and returns the
    // readers already reading through the page cache, with the threads that opened them.
    std::vector<std::pair<FileHandle*, pid_t>> enter_pages_as_writer(FileHandle* writer);
    void leave_pages_as_writer(FileHandle* writer);
    // Marks a page writer as closed with its version published as `published` (or,
    // with `clean` false, written to again): see enter_pages.
    void close_page_writer(FileHandle* writer, bool clean, const core::Digest& published);
    void run_writer_gate();
    // Undoes an open whose reply the kernel did not take (the opener was interrupted).
    void discard_open(FileHandle* handle);
    std::shared_ptr<const std::string> snapshot(const core::Digest& digest, std::string_view bytes);
    std::shared_ptr<const std::string> find_snapshot(const core::Digest& digest);
    void count_open(fuse_req_t req, const core::ReadTxn& txn, const core::Attr& attr);

    core::Store& m_store;
    const Options m_options;
    Background m_background;
    bool m_no_open = false;  // --read-only with the kernel's no-open support; set by init()
    RemoteTier* m_remote = nullptr;  // --remote: read-through of missed entries

    struct PageState {
        core::Digest digest;                // the version whose pages the kernel caches
        std::uint64_t size = 0;             // its size
        std::vector<FileHandle*> readers;   // open handles reading through the page cache
        // Read-only handles that opened following a shared version (its writers' pages):
        // a writer of another version waits for them, other readers bypass the pages.
        std::vector<FileHandle*> followers;
        std::uint32_t writers = 0;          // open writer handles: no reader enters meanwhile
        std::uint32_t closed_writers = 0;   // of them, closed with their version published (FileHandle::closed_clean)
        core::Digest closed_digest;         // what the last of them published
        // The kernel's pages are known to hold only `digest`: a reader that refilled
        // them (its open made the kernel drop what it held) has sent a READ since.
        // Until then a new reader refills too: a kept page could still be another
        // version's, dropped only when the refilling open completes in the kernel.
        bool settled = false;
        // The version whose attributes the kernel was last told to keep (attr_timeout);
        // a reader of another one waits for their invalidation (enter_pages).
        std::optional<core::Digest> told;
        std::shared_ptr<const std::string> kept;  // `digest`'s content once replaced (keep_for_readers, renew_pin)
        std::uint32_t lazy = 0;  // of `readers`, those that load their content at the first READ
    };
    struct WaitingWriter {
        FileHandle* writer;
        std::vector<FileHandle*> readers;  // still open: the writer's open waits for them
        std::chrono::steady_clock::time_point deadline;
        std::function<void()> reply;
    };
    static constexpr auto kWriterWait = std::chrono::seconds(2);
    std::mutex m_pages_mutex;  // a leaf: nothing else is locked while it is held
    std::unordered_map<core::Ino, PageState> m_pages;
    std::unordered_set<core::Ino> m_lazy_inodes;  // inodes whose PageState::lazy > 0
    std::vector<WaitingWriter> m_waiting_writers;
    std::condition_variable m_writer_gate_wake;  // a writer waits, or stop
    bool m_writer_gate_stop = false;
    std::thread m_writer_gate;

    // Guards m_pin. Taken with nothing else held; under it renew_pin takes
    // m_pages_mutex and m_snapshots_mutex. Held across renew_pin's scan and swap, so
    // a lazy open's check (pinned) comes wholly before or after them.
    std::mutex m_pin_mutex;
    std::optional<core::ReadTxn> m_pin;  // used by one thread at a time, under m_pin_mutex

    std::mutex m_snapshots_mutex;  // content shared by reader handles
    std::unordered_map<std::string, std::weak_ptr<const std::string>> m_snapshots;

    std::mutex m_seen_mutex;  // (entry, process) pairs that counted their hit
    std::unordered_set<std::string> m_seen;

    std::mutex m_lookups_mutex;  // kernel lookup references, and orphans they keep alive
    std::unordered_map<core::Ino, std::uint64_t> m_lookups;
    std::unordered_map<core::Ino, Orphan> m_orphans;

    // Versions being written, per inode. Lock order: a handle's mutex, then a
    // version's mutex, then LMDB's writer lock (publish() holds a version's mutex
    // across its write transaction). m_versions_mutex, like m_pages_mutex, is a leaf:
    // nothing is locked while it is held. join_version() may wait for an ending version
    // to publish, so it is never called with a write transaction open (create() calls
    // it after its commit) nor with a version's mutex held.
    std::mutex m_versions_mutex;
    std::unordered_map<core::Ino, InodeVersions> m_versions;
    std::condition_variable m_version_ended;  // a version of some inode finished ending
    std::atomic<std::uint64_t> m_write_clock{0};
};

}  // namespace kcache::fsd
