// The file handlers of kcache-fsd: open and create, and a dead daemon's handle rebuilt
// (the Filesystem class, filesystem.hpp; reads, writes, publishing and closes:
// file_io.cpp; the units it composes have their own files). Every handler replies only
// after it let go of the handle's lock: the reply may let the kernel release the handle
// on another thread at once.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "filesystem.hpp"
#include "kernel_attrs.hpp"
#include "log.hpp"
#include "process.hpp"
#include "resend.hpp"

namespace kcache::fsd {
using core::Attr;
using core::Ino;

// ---- versions (THE RULE in filesystem.hpp) ------------------------------------------

void Filesystem::leave_version(fuse_req_t req, FileHandle* handle) {
    std::shared_ptr<Version> version;
    bool killed = false;
    {
        MutexLock lock(handle->mutex);
        version = std::move(handle->version);
        killed = handle->killed;
    }
    // A writer of the entry (single flight): counted at its open when it got a version.
    if (handle->writable && version) m_flights.writer_closed(handle->attr.entry, handle->opener);
    if (!version || !m_versions.leave(*version)) return;
    {
        MutexLock lock(version->mutex);
        // A rewrite whose writer was killed publishes nothing; a shared version keeps
        // every handle's writes, as a local disk does.
        const bool keep = version->shared || !killed;
        if (keep) {
            if (auto s = publish(req, *version); !s) {
                log::error("content of inode {} lost at release: {}", handle->ino,
                           s.error().message);
            }
        }
        (void)version->staged.abandon();
        version->ended = true;
    }
    m_versions.ended(handle->ino, version);
    m_notifier.invalidate_attr(handle->ino);  // no writer: the answer is everybody's again
}

void Filesystem::follow_shared(FileHandle* handle) {
    if (handle->writable || handle->orphan) return;
    auto current = m_versions.shared(handle->ino);
    if (!current || current == handle->version) return;
    core::Digest reading = handle->snapshot_digest;
    if (handle->version) {
        MutexLock lock(handle->version->mutex);
        if (!handle->version->ended) return;
        reading = handle->version->staged.stored_digest();  // what it published last
    }
    if (current->started_from != reading) return;  // a reader of another version keeps it
    handle->version = std::move(current);
    handle->snapshot.reset();
}

void Filesystem::discard_open(FileHandle* handle) {
    if (handle->writable) {
        {
            MutexLock lock(handle->mutex);
            handle->killed = true;  // its opener never got it: a rewrite publishes nothing
        }
        leave_version(nullptr, handle);
    }
    if (handle->page_cached) m_pages.leave(handle);
    if (handle->page_writer) m_pages.leave_as_writer(handle);
    m_holds.closed(*handle);
    if (!m_handles.take_file(handle->fh)) delete handle;  // never entered the table
}

std::uint64_t Filesystem::enter_handle(FileHandle* handle, bool unpublished) {
    HandleRecord record;
    record.readable = handle->readable;
    record.writable = handle->writable;
    record.unpublished.store(unpublished ? 1 : 0);
    record.opener = handle->opener;
    record.ino = handle->ino;
    record.size = handle->attr.size;
    record.digest = handle->writable ? handle->attr.digest : handle->snapshot_digest;
    if (handle->writable) {
        MutexLock lock(handle->mutex);
        if (handle->version) record.version = handle->version->spill_key();
    }
    return m_handles.add_file(handle, record);
}

FileHandle* Filesystem::rebuild_file(HandleRecord& r) {
    auto handle = std::make_unique<FileHandle>();
    handle->ino = r.ino;
    handle->readable = r.readable;
    handle->writable = r.writable;
    handle->opener = r.opener;
    handle->snapshot_digest = r.digest;
    std::optional<core::ReadTxn> txn;
    if (auto t = m_store.read()) txn.emplace(std::move(*t));
    std::optional<Attr> attr;
    if (txn) {
        if (auto a = txn->getattr(r.ino); a && a->is_regular()) attr = *a;
    }
    if (attr) {
        handle->attr = *attr;
    } else {  // removed since: answered as an unlinked file
        handle->attr.ino = r.ino;
        handle->attr.mode = S_IFREG | 0644;
        handle->attr.size = r.size;
        handle->attr.digest = r.digest;
        handle->attr.nlink = 0;
    }
    // The kernel knows the inode while the handle is open: a removal keeps its orphan.
    m_lookups.remember(r.ino);
    if (!r.writable) {
        rebuild_reader(*handle, r, attr, txn);
        return handle.release();
    }
    txn.reset();  // Versions::adopt and join are called with nothing held
    rebuild_writer(*handle, r, attr);
    return handle.release();
}

void Filesystem::rebuild_reader(FileHandle& handle, const HandleRecord& r,
                                const std::optional<Attr>& attr,
                                const std::optional<core::ReadTxn>& txn) {
    // A follower read a version being written (open_reader), so its record names no
    // version: it reads what the file holds now, as after that version's close, and
    // follows a shared version rebuilt from a spill file (follow_shared).
    std::uint64_t size = r.size;
    if (r.digest.empty() && attr) {
        handle.snapshot_digest = attr->digest;
        size = attr->size;
    }
    const core::Digest& digest = handle.snapshot_digest;
    auto content = m_contents.load(r.ino, digest);
    if (!content && txn) {
        if (auto blob = txn->read_blob(digest, size))
            content = m_contents.snapshot(digest, std::move(*blob));
    }
    {
        MutexLock lock(handle.mutex);  // not shared yet: for the analysis
        handle.snapshot = content;
    }
    handle.lost = !content;
    if (content) m_holds.rebuilt(handle);
    if (handle.lost)
        log::warning(
            "inode {}: the version a reader had open is gone from the db: its "
            "reads fail with EIO",
            r.ino);
}

void Filesystem::rebuild_writer(FileHandle& handle, HandleRecord& r,
                                const std::optional<Attr>& attr) {
    if (r.version && attr) {
        // Its version changed: its content outlived the dead daemon in a spill file.
        std::shared_ptr<Version> version;
        auto adopted = m_versions.adopt(r.ino, r.version, r.opener, &version);
        if (adopted && *adopted) {
            MutexLock lock(handle.mutex);  // not shared yet: for the analysis
            handle.version = std::move(version);
            if (r.unpublished.load())
                log::info(
                    "inode {}: a writer's unpublished bytes were taken over from its spill file",
                    r.ino);
            return;
        }
        if (!adopted)
            log::warning("inode {}: cannot take a writer's spill file over: {}", r.ino,
                         adopted.error().message);
    }
    if (r.unpublished.load()) {
        handle.lost = true;
        log::warning(
            "inode {}: a writer's unpublished bytes died with the previous daemon: "
            "its next write, fsync or close fails with EIO",
            r.ino);
        return;
    }
    std::shared_ptr<Version> version;
    auto s = attr ? m_versions.join(r.ino, false, r.opener, std::nullopt, &version)
                  : core::fail(ENOENT, "removed");
    // Its spill key is the version it joined now: what it writes from here on is spilled
    // under that one, and the next successor must find it there.
    r.version = version ? version->spill_key() : 0;
    {
        MutexLock lock(handle.mutex);  // not shared yet: for the analysis
        handle.version = std::move(version);
    }
    if (!s && s.error().code == ENOENT) {
        handle.orphan = true;  // as for a file removed while open: writes go nowhere
    } else if (!s) {
        handle.lost = true;
        log::warning("inode {}: cannot take a writer over: {}", r.ino, s.error().message);
    }
}

void Filesystem::open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    // Read-only serving: no handles. The kernel takes ENOSYS as "opens always
    // succeed" and sends no OPEN, FLUSH or RELEASE from now on (read() serves
    // the stored content by inode; docs/stats.md says what is not counted).
    if (m_no_open) return (void)fuse_reply_err(req, ENOSYS);
    auto handle = std::make_unique<FileHandle>();
    handle->ino = ino;
    handle->writable = (fi->flags & O_ACCMODE) != O_RDONLY;
    handle->readable = (fi->flags & O_ACCMODE) != O_WRONLY;
    const bool truncate = handle->writable && (fi->flags & O_TRUNC);
    std::optional<Dirtying> dirtying;  // until its slot says unpublished (enter_handle)
    if (truncate) {
        dirtying.emplace(*this);
        if (dirtying->refused()) return;  // handing over: the successor answers it
    }
    std::optional<BlobHolds::ReaderOpen> reading;  // counted before its snapshot
    if (!handle->writable) reading.emplace(m_holds, ino);
    Opening opening;
    std::optional<core::Error> damage;  // the content did not match its digest
    {
        auto txn = m_store.read();
        if (!txn) return reply_error(req, txn.error());
        auto attr = txn->getattr(ino);
        if (!attr && attr.error().code == ENOENT) {
            auto orphan = m_lookups.find_orphan(ino);
            // Evicted by another process, and the kernel's name for it not yet
            // invalidated: ESTALE makes the kernel look the name up again and open
            // (or, with O_CREAT, create) what is there now, as NFS clients do.
            if (!orphan) return reply_error(req, {ESTALE, "evicted since the kernel looked it up"});
            open_orphan(req, *txn, *orphan, truncate, *handle, fi, opening);
        } else if (!attr) {
            return reply_error(req, attr.error());
        } else if (attr->is_dir()) {
            return reply_error(req, {EISDIR, "is a directory"});
        } else if (!handle->writable) {
            if (auto s = open_reader(req, *txn, *attr, *handle, fi, opening);
                !s && s.error().code == core::kDamagedContent) {
                damage = s.error();  // handled once the snapshot ends: it evicts
            } else if (!s) {
                return reply_error(req, s.error());
            }
        } else {
            handle->attr = *attr;
            // A read-write open without O_TRUNC (a database) reads what it opens: it
            // counts as an open for reading. Its reads may all come from the page cache,
            // so the open, not a READ, is what the daemon sees.
            if (handle->readable && !truncate)
                m_hits.count_open(fuse_req_ctx(req)->pid, *txn, *attr);
        }
    }
    if (damage) return reply_error(req, damaged_content(ino, *damage));
    // Its version is joined with no snapshot held (Versions::join may wait).
    if (handle->writable && !handle->orphan) {
        if (auto s = open_writer(req, truncate, *handle, fi, opening); !s)
            return reply_error(req, s.error());
    }
    if (reading) reading->opened(*handle);
    answer_open(req, std::move(handle), truncate, fi, std::move(opening));
}

void Filesystem::open_orphan(fuse_req_t req, const core::ReadTxn& txn, const Orphan& orphan,
                             bool truncate, FileHandle& handle, fuse_file_info* fi,
                             Opening& opening) {
    // Removed since the kernel looked it up: open what it was, as a local disk would.
    // Its writes go nowhere; it is read directly (its pages are no version's now).
    handle.orphan = true;
    handle.attr = orphan.attr;
    if (!truncate) opening.snapshot = orphan.content;
    handle.snapshot_digest = orphan.attr.digest;
    fi->direct_io = 1;
    // A reader that opens a file a rename replaced after its lookup (racing
    // stores of one kernel) still loads the kernel from the cache: one hit, as
    // for the file that replaced it (docs/stats.md).
    if (!handle.writable || (handle.readable && !truncate))
        m_hits.count_open(fuse_req_ctx(req)->pid, txn, orphan.attr);
}

core::Status Filesystem::open_reader(fuse_req_t req, const core::ReadTxn& txn, const Attr& attr,
                                     FileHandle& handle, fuse_file_info* fi, Opening& opening) {
    handle.attr = attr;
    handle.reader_tid = fuse_req_ctx(req)->pid;
    m_hits.count_open(handle.reader_tid, txn, attr);
    fi->noflush = 1;  // a reader has nothing to publish: spare the round trip at close
    if (auto shared = m_versions.shared(attr.ino)) {
        // The file is being shared by writers: read it as they write it, through
        // the page cache they write through.
        m_pages.enter_as_follower(&handle, shared);
        opening.version = std::move(shared);
        fi->keep_cache = 1;
        return {};
    }
    handle.snapshot_digest = attr.digest;
    const PageCache::Use use = m_pages.enter(&handle, attr.digest, attr.size, &opening.stale_attr);
    fi->direct_io = use == PageCache::Use::direct;
    fi->keep_cache = use == PageCache::Use::keep;
    // The kernel's pages hold this version: a READ comes only for pages it
    // dropped, so the content is loaded then (read()), not copied here.
    // PageCache::enter counted it as lazy; if the pin does not cover its
    // version (committed since the background thread's last period), it
    // copies the content now, as a reader that refills the pages does.
    if (!handle.lazy || !m_contents.pinned(attr.ino, attr.digest, txn)) {
        auto content = txn.read(attr.ino);
        if (!content) {
            if (handle.page_cached) m_pages.leave(&handle);
            return tl::unexpected(content.error());
        }
        opening.snapshot = m_contents.snapshot(attr.digest, std::move(*content));
    }
    // A refilling reader must not read before the kernel's size is at least its
    // version's (KernelNotifier::grow_size): the size and last byte of that version.
    if (use == PageCache::Use::refill && !opening.snapshot->empty())
        opening.grow.emplace(opening.snapshot->size(), opening.snapshot->back());
    return {};
}

core::Status Filesystem::open_writer(fuse_req_t req, bool truncate, FileHandle& handle,
                                     fuse_file_info* fi, Opening& opening) {
    const Ino ino = handle.ino;
    handle.opener = process_of(fuse_req_ctx(req)->pid);
    const bool joined_existing =
        m_versions.shared(ino) != nullptr || (!truncate && m_versions.has_rewrite(ino));
    auto s = m_versions.join(ino, truncate, handle.opener, std::nullopt, &opening.version);
    if (!s && s.error().code == ENOENT) {
        handle.orphan = true;  // replaced since open()'s snapshot: as for a removed file
        fi->direct_io = 1;
        return {};
    }
    if (!s) return s;
    // Through the page cache: every handle of the version sees one page cache,
    // and MAP_SHARED works. A new version drops what the cache held.
    fi->keep_cache = joined_existing;
    m_notifier.invalidate_attr(ino);  // settled attributes now depend on the caller
    if (opening.version) m_flights.writer_opened(handle.attr.entry, handle.opener);
    return {};
}

FileHandle* Filesystem::enter_open(fuse_req_t req, std::unique_ptr<FileHandle> handle,
                                   bool unpublished, fuse_file_info* fi, Opening& opening) {
    {
        MutexLock lock(handle->mutex);  // not shared yet: for the analysis
        handle->snapshot = std::move(opening.snapshot);
        handle->version = opening.version;
    }
    FileHandle* raw = handle.release();
    fi->fh = enter_handle(raw, unpublished);
    if (!fi->fh) {
        discard_open(raw);
        reply_error(req, {ENFILE, "too many open files on the mount"});
        return nullptr;
    }
    return raw;
}

void Filesystem::answer_open(fuse_req_t req, std::unique_ptr<FileHandle> handle, bool truncate,
                             fuse_file_info* fi, Opening opening) {
    const Ino ino = handle->ino;
    const bool unpublished = truncate && !handle->orphan;
    FileHandle* raw = enter_open(req, std::move(handle), unpublished, fi, opening);
    if (!raw) return;
    auto reply = [this, req, opened = *fi, raw]() mutable {
        if (fuse_reply_open(req, &opened) != 0)
            discard_open(raw);  // the opener is gone (interrupted)
    };
    // Every writer, an orphan's too: an O_TRUNC open sets the kernel's one size of the
    // inode to 0 when it completes, and writes grow it, under its readers.
    if (raw->writable) return m_pages.admit_writer(raw, opening.version, std::move(reply));
    if (opening.grow) {
        if (opening.stale_attr) m_notifier.invalidate_attr(ino);  // the same pass, before the reply
        return m_notifier.grow_size(ino, opening.grow->first, opening.grow->second,
                                    std::move(reply));
    }
    if (opening.stale_attr)
        return m_notifier.invalidate_attr(ino, std::move(reply));  // replies once told
    reply();
}

bool Filesystem::created_before_takeover(const NonIdempotent& request, Ino parent,
                                         const char* name) {
    auto made = request.recorded();
    if (!made) return false;
    auto txn = m_store.read();
    auto at = txn ? txn->lookup(parent, name) : core::Result<Attr>(core::fail(ENOENT, ""));
    if (!at || at->ino != *made) return false;
    log::info(
        "a resent O_EXCL create of {} was done by the previous daemon: "
        "opened for its creator",
        name);
    return true;
}

core::Result<Attr> Filesystem::create_file(NonIdempotent& request, Ino parent, const char* name,
                                           mode_t mode, const fuse_ctx& ctx, bool exclusive,
                                           bool truncate, std::optional<core::StagedFile>& made) {
    auto txn = m_store.write();
    if (!txn) return tl::unexpected(txn.error());
    auto created = txn->create(parent, name, mode, ctx.uid, ctx.gid, exclusive);
    if (!created) return tl::unexpected(created.error());
    if (exclusive) request.record(created->ino);
    auto staged = core::StagedFile::begin(*txn, created->ino, truncate || created->size == 0);
    if (!staged) return tl::unexpected(staged.error());
    if (auto s = txn->commit(); !s) {
        staged->forget();
        return tl::unexpected(s.error());
    }
    staged->set_max_size(m_options.max_file_size);
    made = std::move(*staged);
    return *created;
}

void Filesystem::create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                        fuse_file_info* fi) {
    const fuse_ctx* ctx = fuse_req_ctx(req);
    auto handle = std::make_unique<FileHandle>();
    const bool truncate = (fi->flags & O_TRUNC) != 0;
    std::optional<Dirtying> dirtying;  // until its slot says unpublished (enter_handle)
    if (truncate) {
        dirtying.emplace(*this);
        if (dirtying->refused()) return;  // handing over: the successor answers it
    }
    std::optional<core::StagedFile> made;
    auto created =
        non_idempotent(req, {resend::Op::create, parent, name}, [&](NonIdempotent& request) {
            // Resent (resend.hpp) after the dead daemon made the file: it is this creator's, so
            // an O_EXCL create opens it (a lock file's creator does not get EEXIST).
            const bool exclusive =
                (fi->flags & O_EXCL) != 0 && !created_before_takeover(request, parent, name);
            return create_file(request, parent, name, mode, *ctx, exclusive, truncate, made);
        });
    if (!created) return;  // never: an O_EXCL create's resend is proven in its body
    if (!*created) return reply_error(req, created->error());
    Attr attr = **created;
    handle->ino = attr.ino;
    handle->attr = attr;
    handle->writable = true;
    handle->readable = (fi->flags & O_ACCMODE) == O_RDWR;
    handle->opener = process_of(ctx->pid);
    // After the commit: Versions::join may wait for another version to end.
    const bool joined_existing = m_versions.shared(attr.ino) != nullptr;
    std::shared_ptr<Version> version;
    if (auto s = m_versions.join(attr.ino, truncate, handle->opener, std::move(made), &version);
        !s) {
        return reply_error(req, s.error());
    }
    fi->keep_cache = joined_existing;               // as in open() for writing
    m_flights.created(attr.entry, handle->opener);  // single flight: a filler at work
    if (version) m_flights.writer_opened(attr.entry, handle->opener);
    Opening opening;
    opening.version = version;
    // A truncation of a file that had content is unpublished until the writer's close.
    FileHandle* raw = enter_open(req, std::move(handle), truncate && attr.size > 0, fi, opening);
    if (!raw) return;
    m_lookups.remember(attr.ino);
    // O_CREAT of a file that existed: the kernel may hold its settled attributes.
    m_notifier.invalidate_attr(attr.ino);
    auto reply = [this, req, opened = *fi, raw, attr]() mutable {
        // The size when answered: the kernel applies it to the inode (its pages past it
        // go), and a writer that joined the version meanwhile may have written more.
        m_versions.apply_live_size(attr);
        const fuse_entry_param e =
            kernel::entry_param(attr, attr_timeout(attr));  // 0: its version is at work
        if (fuse_reply_create(req, &e, &opened) != 0) {
            forget(attr.ino, 1);
            discard_open(raw);
        }
    };
    // O_CREAT without O_EXCL of a file that exists (the kernel sends CREATE, not OPEN,
    // when its dentry is negative or stale) waits for other processes' page-cache
    // readers as an OPEN does: the reply's size, and the writes after it, would change
    // the kernel's one size and pages under a reader of the old version. A new file has
    // no readers and is answered at once. The kernel holds the directory's lock until
    // the reply, so a background notification of a name in this directory waits too,
    // at most PageCache::kWriterWait.
    m_pages.admit_writer(raw, version, std::move(reply));
}

}  // namespace kcache::fsd
