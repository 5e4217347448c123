// The FUSE filesystem over a kcache store (libfuse3 low-level API).
//
// Inode numbers are the store's: stable, never reused, so the daemon translates none;
// what it keeps per inode (lookup count, orphan, page state, versions) is one record
// of the inode table (inodes.hpp). State lives in open handles and in the versions
// writers build:
// - a reader's handle holds a snapshot of the content it opened (shared between
//   handles of the same content), so an unlink or eviction never breaks a read;
// - a writer's handle writes a Version: content in memory (a core::StagedFile) that is
//   published in one transaction at fsync, at close and at the last release.
// - THE RULE (docs/fsd.md, "Several handles on one file"): an inode has at
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
// A reader opened onto the kernel's kept pages loads its content at its first READ.
// Writers use the page cache (so MAP_SHARED works
// and every handle sees one page cache); readers that open while a writer is at work
// and do not read the shared version use direct I/O: a rewrite's bytes in the page
// cache are never theirs, and their reads end where their own version ends. The
// kernel's one size per inode is the last shared thing: a writer's open waits (at
// most kWriterWait) until readers of other processes that read the inode through the
// page cache have closed.
//
// The units, each owning one kind of state (their headers state their contracts):
// - Filesystem (filesystem.cpp: the operation table, replies, orphans; attributes.cpp:
//   lookup and attributes; names.cpp, nodes.cpp: the namespace; directories.cpp;
//   files.cpp: opens; file_io.cpp: reads, writes, publishing, closes): the handlers, which compose
//   the units below and reply;
// - handles.hpp: FileHandle, DirHandle, each field with the lock that guards it;
// - Inodes (inodes.hpp): the inode table, one record per inode with the parts of the
//   units below, behind one mutex;
// - Versions (versions.hpp): the writer registry, THE RULE;
// - PageCache (page_cache.hpp): page-cache coherence, the kernel's told attributes,
//   the writer gate thread;
// - Lookups (lookups.hpp): the kernel's lookup references and orphans;
// - Contents (contents.hpp): snapshots shared by readers, the pin, lazy loading;
// - BlobHolds (blob_holds.hpp): blobs kept in the db for open readers, for a successor;
// - HitCounter (hits.hpp): hits and opens;
// - Background (background.hpp): the one thread that notifies the kernel;
// - SingleFlight (single_flight.hpp): a lookup inside an entry another compile is
//   filling waits for it.
// THE LOCK ORDER, the one order in which all of their locks nest, is lock_order.hpp.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "background.hpp"
#include "blob_holds.hpp"
#include "contents.hpp"
#include "handles.hpp"
#include "hits.hpp"
#include "inodes.hpp"
#include "kcache/core/staged.hpp"
#include "kcache/core/store.hpp"
#include "lock_order.hpp"
#include "lookups.hpp"
#include "options.hpp"
#include "page_cache.hpp"
#include "remote_tier.hpp"
#include "resend.hpp"
#include "single_flight.hpp"
#include "state.hpp"
#include "versions.hpp"

namespace kcache::fsd {

// A daemon that finds the db corrupt while serving (Filesystem::db_corrupt) leaves this
// file in the db directory, holding LMDB's message, and exits with kCorruptExit; the
// daemon that starts next sets the db aside (serve.cpp) and removes it.
inline constexpr const char* kCorruptMarker = "damaged";
inline constexpr int kCorruptExit = 76;

class Filesystem {
  public:
    // `state`: the handle table's memory (state.hpp), the keeper's memfd; null: private.
    // A state a dead daemon left is taken over: its open handles stay valid.
    // `resend`: where resent requests are answered once (resend.hpp), the daemon's;
    // null: a private one that records nothing.
    Filesystem(core::Store& store, const Options& options, StateFile* state = nullptr,
               const Resend* resend = nullptr);
    ~Filesystem();

    // The operation table; every callback's userdata is a Filesystem*.
    static const fuse_lowlevel_ops& operations();

    void start(fuse_session* session);
    // After a takeover, before the first request: rebuilds the readers the previous
    // daemon left open (their versions may leave the db before their next READ).
    // Returns how many handles it left (readers, writers, directories).
    std::size_t adopt_handles();
    // An upgrade (keeper.hpp): true once no handle has unpublished bytes and no request
    // that could leave some is running; from then on such requests (WRITE, an O_TRUNC
    // open or create, a truncating SETATTR of a handle) are left unanswered: the kernel
    // resends them to the successor. False: not yet (writers are at work).
    bool try_hand_over();
    // The shared tier (kcache-fsd --remote), before start(); it must outlive every
    // request and be stopped before stop(): its callbacks answer lookups.
    void attach_remote(RemoteTier* remote) { m_remote = remote; }
    // Answers the lookups single flight holds, then stops the background thread.
    void stop() {
        m_flights.stop();
        m_background.stop();
    }

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
    void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                fuse_file_info* fi);
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
    // xattrs.cpp (kcache/core/xattrs.hpp)
    void setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                  int flags);
    void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
    void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
    void removexattr(fuse_req_t req, fuse_ino_t ino, const char* name);
    // fallocate.cpp: the modes the kernel passes (0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE,
    // ZERO_RANGE) on a handle open for writing; ENOSPC when the room is not there.
    void fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                   fuse_file_info* fi);

  private:
    // Held by a request that may leave bytes unpublished; refused() once handing over
    // (then the request returns unanswered). Lock: m_handover_mutex, level 8, a leaf.
    class Dirtying {
      public:
        explicit Dirtying(Filesystem& fs);
        ~Dirtying();
        Dirtying(const Dirtying&) = delete;
        Dirtying& operator=(const Dirtying&) = delete;
        bool refused() const { return !m_entered; }

      private:
        Filesystem& m_fs;
        bool m_entered = false;
    };
    // The start of a request that changes a file's bytes (WRITE, FALLOCATE): the
    // handle's writable version, or `orphan` when its file is gone (its new bytes go
    // nowhere, as an unlinked file's). Answers the request itself and returns nullopt
    // for an unknown or lost handle and one not open for writing; returns nullopt
    // unanswered when handing over (the successor answers it). `dirtying` is entered
    // here, after the handle checks, and must outlive the change.
    struct Change {
        FileHandle* handle = nullptr;
        std::shared_ptr<Version> version;  // null only when orphan
        bool orphan = false;
    };
    std::optional<Change> start_change(fuse_req_t req, fuse_file_info* fi,
                                       std::optional<Dirtying>& dirtying);
    // Answers with error.code; damage (core/integrity.hpp) is EIO to the kernel, and
    // kCorruptDb ends the daemon for a successor that sets the db aside (db_corrupt).
    void reply_error(fuse_req_t req, const core::Error& error);
    // Content of `ino` that did not match its digest (core::kDamagedContent; `error`
    // says which blob): counted (damaged_blobs), logged with the file and entry, and
    // the entry evicted so that the compiler compiles it again. Returns what the
    // request that found it answers: ESTALE when the entry is gone (an open is then
    // looked up again and finds nothing: ENOENT, a miss), else EIO (a pinned entry, a
    // write in flight, a file in no entry). A reader that had opened the file already
    // keeps what it read; its next READ the kernel has no page for fails with EIO.
    core::Error damaged_content(core::Ino ino, const core::Error& error);
    // LMDB reported the db corrupt (core::kCorruptDb) while serving: logged, a marker
    // left in the db directory (kCorruptMarker) and the daemon ends at once, as a crash
    // does; the keeper starts a successor, which sets the db aside and serves a fresh
    // one (serve.cpp). Does not return.
    [[noreturn]] void db_corrupt(const core::Error& error);
    // LOOKUP; a miss of a name that could be an entry is read through the shared tier
    // first when `read_through` (then answered from a tier thread, asynchronously). When
    // `may_wait`, a miss inside an entry another compile is filling is answered ESTALE
    // and the retry's lookup of its directory waits (single flight, single_flight.hpp).
    void answer_lookup(fuse_req_t req, core::Ino parent, const char* name, bool read_through,
                       bool may_wait);
    // What a non-idempotent request (resend.hpp) changes: its op (none: redone when
    // resent, a RENAME_EXCHANGE), the name it makes or removes (a rename's source) and a
    // rename's target.
    struct Target {
        Target(resend::Op which, core::Ino in = 0, const char* called = nullptr,
               core::Ino new_in = 0, const char* new_called = nullptr)
            : op(which), parent(in), name(called), new_parent(new_in), new_name(new_called) {}
        resend::Op op;
        core::Ino parent;
        const char* name;
        core::Ino new_parent;
        const char* new_name;
    };
    // The one way of a non-idempotent request: its context is read once here
    // (Resend::current) into the NonIdempotent the body gets. A resent one whose change
    // the dead daemon had committed, as its record proves from `target`'s name, is
    // answered as it would have been (answer_resent) and nullopt returned. Else
    // `body(request)` does the change in one write transaction, recording it there
    // (NonIdempotent::record; setxattr and removexattr prove a resend there too), and
    // its outcome (a core::Result) is returned after the fault point
    // (NonIdempotent::before_reply), for the handler to answer.
    template <typename Body>
    auto non_idempotent(fuse_req_t req, const Target& target, Body&& body)
        -> std::optional<std::invoke_result_t<Body, NonIdempotent&>>;
    // non_idempotent's answer to a resent request the dead daemon had done (true);
    // false: do it.
    bool answer_resent(fuse_req_t req, const NonIdempotent& request, const Target& target);
    // A LOOKUP's answer for a container the shared tier holds entries below
    // (RemoteTier::Found): makes the directory (or finds the one made meanwhile) and
    // replies with its entry.
    void make_container(fuse_req_t req, core::Ino parent, const char* name);
    // Makes a node in one transaction (for reply_node).
    core::Result<core::Attr> make_node(
        fuse_req_t req,
        const std::function<core::Result<core::Attr>(core::WriteTxn&, const fuse_ctx&)>& make);
    // Replies with the entry of the node make_node made, or its error.
    void reply_node(fuse_req_t req, const core::Result<core::Attr>& made);
    // Replies with an entry the kernel now holds a lookup reference on.
    void reply_entry(fuse_req_t req, const core::Attr& attr);
    // Before a removal: keeps the content of `name` in `parent` if the kernel knows it.
    std::optional<std::pair<core::Ino, Orphan>> orphan_of(const core::ReadTxn& txn,
                                                          core::Ino parent, const char* name);
    // Runs `remove` (an unlink, or a rename over `name`) in one transaction, keeping
    // the removed file readable as an orphan while the kernel still knows it.
    core::Status remove_keeping_orphan(core::Ino parent, const char* name,
                                       const std::function<core::Status(core::WriteTxn&)>& remove);
    // Attributes of a file removed from the db that a handle or orphan still holds.
    std::optional<core::Attr> removed_attr(core::Ino ino, FileHandle* handle);
    // Takes `handle` out of its version; the last handle of a version publishes it
    // (unless it is a rewrite whose writer was killed) and ends its lease.
    void leave_version(fuse_req_t req, FileHandle* handle);
    // A read-only handle follows the shared version that grew out of the version it
    // reads.
    void follow_shared(FileHandle* handle) REQUIRES(handle->mutex);
    // Whether a file of `size` bytes, `added` of them new, can be stored: EFBIG past
    // --max-file-size, ENOSPC over the cache's size bound or the db disk's free space.
    core::Status check_room(std::uint64_t size, std::uint64_t added);
    // Publishes a version's content, first making room under the size bound.
    core::Status publish(fuse_req_t req, Version& version) REQUIRES(version.mutex);
    // How long the kernel may keep the attributes `a` of an inode: long (and recorded
    // as told, PageCache::tell_attr) while every caller gets that answer (no writer at
    // work, no page-cache reader of another version, not removed), else 0. Every
    // change of that answer is followed by KernelNotifier::invalidate_attr.
    double attr_timeout(const core::Attr& a);
    // OPEN by role. open() reads the inode and hands it to open_orphan (removed since
    // the kernel looked it up), open_reader (read-only) or, after its snapshot ends,
    // open_writer (joins the version THE RULE gives it); answer_open puts the handle
    // into the table (enter_open) and replies, now or once what the reply waits for is
    // done. CREATE makes the file, joins its version, and enters the handle the same way.
    struct Opening {                                  // what the parts decided, for answer_open
        std::shared_ptr<const std::string> snapshot;  // FileHandle::snapshot
        std::shared_ptr<Version> version;             // FileHandle::version
        // A reader opening another version than the kernel was told of: answered only
        // once the kernel forgot those attributes (KernelNotifier::invalidate_attr).
        bool stale_attr = false;
        // A refilling reader: answered once the kernel's size is at least its version's
        // (KernelNotifier::grow_size): that size and the version's last byte.
        std::optional<std::pair<std::uint64_t, char>> grow;
    };
    void open_orphan(fuse_req_t req, const core::ReadTxn& txn, const Orphan& orphan, bool truncate,
                     FileHandle& handle, fuse_file_info* fi, Opening& opening);
    core::Status open_reader(fuse_req_t req, const core::ReadTxn& txn, const core::Attr& attr,
                             FileHandle& handle, fuse_file_info* fi, Opening& opening);
    core::Status open_writer(fuse_req_t req, bool truncate, FileHandle& handle, fuse_file_info* fi,
                             Opening& opening);
    void answer_open(fuse_req_t req, std::unique_ptr<FileHandle> handle, bool truncate,
                     fuse_file_info* fi, Opening opening);
    // Gives `handle` the snapshot and version `opening` holds and enters it in the table
    // (enter_handle; `unpublished` as there), setting fi->fh. Null when the table is
    // full: then the request is answered ENFILE and the handle discarded.
    FileHandle* enter_open(fuse_req_t req, std::unique_ptr<FileHandle> handle, bool unpublished,
                           fuse_file_info* fi, Opening& opening);
    // READ without a handle (read-only serving, no OPEN): the stored content.
    void read_unopened(fuse_req_t req, core::Ino ino, size_t size, off_t off);
    // Undoes an open whose reply the kernel did not take (the opener was interrupted).
    void discard_open(FileHandle* handle);
    // Puts an opened handle into the handle table; its fh, or 0 when the table is full.
    // `unpublished`: the open itself changed the file (O_TRUNC) and nothing published it.
    std::uint64_t enter_handle(FileHandle* handle, bool unpublished);
    // A handle a dead daemon left (state.hpp): rebuilt by inode and digest, a reader's
    // (rebuild_reader: its snapshot) or a writer's (rebuild_writer: its version). `attr`:
    // the file's stored attributes, none when it was removed since.
    FileHandle* rebuild_file(HandleRecord& record);
    void rebuild_reader(FileHandle& handle, const HandleRecord& record,
                        const std::optional<core::Attr>& attr,
                        const std::optional<core::ReadTxn>& txn);
    void rebuild_writer(FileHandle& handle, HandleRecord& record,
                        const std::optional<core::Attr>& attr);
    // CREATE's steps: whether the file a resent O_EXCL create names is the one the dead
    // daemon made for it (resend.hpp); the file made (or found: no O_EXCL) and committed
    // with its staged content begun (`made`).
    bool created_before_takeover(const NonIdempotent& request, core::Ino parent, const char* name);
    core::Result<core::Attr> create_file(NonIdempotent& request, core::Ino parent, const char* name,
                                         mode_t mode, const fuse_ctx& ctx, bool exclusive,
                                         bool truncate, std::optional<core::StagedFile>& made);
    // SETATTR's size change of a file being written: cuts its version (a handle's), or
    // the shared version and rewrites (truncate by path). Returns the size the version
    // now has, with FUSE_SET_ATTR_SIZE cleared from `to_set`, or none when no version
    // took it (the stored file is cut then).
    core::Result<std::optional<std::uint64_t>> truncate_version(core::Ino ino, FileHandle* handle,
                                                                std::uint64_t size, int& to_set);

    core::Store& m_store;
    const Options m_options;
    Background m_background;     // owns the three below and their thread
    KernelNotifier& m_notifier;  // what changed behind the kernel's back (kernel_notifier.hpp)
    Counters& m_counters;        // statistics counted in memory (counters.hpp)
    Upkeep& m_upkeep;            // size bounds, sync, dictionaries (upkeep.hpp)
    bool m_no_open = false;      // --read-only with the kernel's no-open support; set by init()
    // Single flight makes no walk wait before this (steady_ns), after a takeover.
    std::atomic<std::int64_t> m_no_flights_until_ns{0};
    Mutex m_handover_mutex KCACHE_LEVEL(8);           // a leaf
    int m_dirtying GUARDED_BY(m_handover_mutex) = 0;  // requests holding a Dirtying
    bool m_handing_over GUARDED_BY(m_handover_mutex) = false;
    RemoteTier* m_remote = nullptr;  // --remote: read-through of missed entries

    // The units (lock_order.hpp). Declared in dependency order: Versions, PageCache
    // and Lookups keep their state per inode in the inode table; Contents refers to
    // the page cache and the lookups.
    Inodes m_inodes;
    Spills m_spills;  // the writers' spill files (spill.hpp), for m_versions
    Versions m_versions;
    PageCache m_pages;
    Lookups m_lookups;
    Contents m_contents;
    BlobHolds m_holds;
    HitCounter m_hits;
    SingleFlight m_flights;

    // Open handles: fi->fh is a slot of this table (state.hpp), in `m_state`.
    std::unique_ptr<StateFile> m_own_state;  // when no state was given
    StateFile& m_state;
    HandleTable m_handles;

    // Resent requests (resend.hpp): the daemon's, or m_own_resend.
    std::unique_ptr<Resend> m_own_resend;
    const Resend& m_resend;
};

template <typename Body>
auto Filesystem::non_idempotent(fuse_req_t req, const Target& target, Body&& body)
    -> std::optional<std::invoke_result_t<Body, NonIdempotent&>> {
    NonIdempotent request(m_resend, m_resend.current(), target.op);
    if (answer_resent(req, request, target)) return std::nullopt;
    auto outcome = std::forward<Body>(body)(request);
    request.before_reply(outcome.has_value());
    return outcome;
}

}  // namespace kcache::fsd
