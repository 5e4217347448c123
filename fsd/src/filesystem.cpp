#include "filesystem.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "kcache/core/staged.hpp"
#include "log.hpp"
#include "process.hpp"

namespace kcache::fsd {
using core::Attr;
using core::Ino;

namespace {

// Entries (names) and directory attributes: cached long, invalidated explicitly.
constexpr double kEntryTimeout = 86400;
constexpr double kDirAttrTimeout = 86400;
constexpr double kNegativeTimeout = 86400;
// Regular files: cached long while every caller gets the same answer (attr_settled),
// invalidated by notification when that answer changes; see filesystem.hpp.
constexpr double kFileAttrTimeout = 86400;
constexpr std::size_t kMaxSeenPairs = 1 << 20;

struct stat to_stat(const Attr& a) {
    struct stat st{};
    st.st_ino = a.ino;
    st.st_mode = a.mode;
    st.st_nlink = a.nlink;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_size = static_cast<off_t>(a.size);
    st.st_blksize = 4096;
    st.st_blocks = static_cast<blkcnt_t>((a.size + 511) / 512);
    auto ts = [](std::int64_t ns) {
        return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    };
    st.st_atim = ts(a.atime_ns);
    st.st_mtim = ts(a.mtime_ns);
    st.st_ctim = ts(a.ctime_ns);
    return st;
}

// What the kernel caches about a name it looked up (or created).
fuse_entry_param entry_param(const Attr& a, double attr_timeout) {
    fuse_entry_param e{};
    e.ino = a.ino;
    e.generation = 1;
    e.attr = to_stat(a);
    e.attr_timeout = attr_timeout;
    e.entry_timeout = kEntryTimeout;
    return e;
}

std::int64_t ns_of(const timespec& ts) {
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

core::Origin origin_of(fuse_req_t req) {
    const Caller caller = caller_of(fuse_req_ctx(req)->pid);
    return core::Origin{caller.pid, caller.name};
}

Filesystem* self(fuse_req_t req) { return static_cast<Filesystem*>(fuse_req_userdata(req)); }

}  // namespace

// A version of a file being written (THE RULE in filesystem.hpp).
struct Filesystem::Version {
    Version(core::StagedFile content, bool is_shared, std::uint32_t by)
        : staged(std::move(content)), started_from(staged.stored_digest()), shared(is_shared), opener(by) {}
    std::mutex mutex;          // guards staged and ended
    core::StagedFile staged;   // the content, and the write lease while not ended
    bool ended = false;        // published and lease released by its last handle
    const core::Digest started_from;  // the stored version it grew from: its readers follow
    // Guarded by m_versions_mutex:
    std::atomic<bool> shared;  // the inode's shared version (else a private rewrite); read anywhere
    bool ending = false;       // its last handle left: publishing, then out of m_versions
    std::uint32_t handles = 0; // write-capable handles using it
    std::uint32_t opener;      // rewrites: the process that opened it
    std::uint64_t touched = 0; // when it was made (m_write_clock): the newest rewrite is promoted
};

struct Filesystem::FileHandle {
    Ino ino = 0;
    Attr attr;            // as opened: answers getattr once the file is gone from the db
    bool orphan = false;  // opened after its removal: writes are accepted and dropped
    bool writable = false;  // opened for writing (O_WRONLY or O_RDWR)
    bool readable = false;  // opened for reading (O_RDONLY or O_RDWR)
    std::mutex mutex;     // guards the fields below; threads sharing a descriptor call concurrently
    std::shared_ptr<const std::string> snapshot;  // readers that do not read a version
    core::Digest snapshot_digest;
    // A reader opened with the kernel's pages of its version kept: its content is
    // loaded at its first READ (load_content), if one comes; null snapshot until then.
    bool lazy = false;
    // Writers: the version they write (fixed at open). Read-only handles: the shared
    // version they read, once they follow one (follow_shared), else null.
    std::shared_ptr<Version> version;
    std::uint32_t opener = 0;  // writers: the process that opened it; only its close publishes early
    pid_t reader_tid = 0;      // readers: the thread that opened it
    bool page_cached = false;  // a reader counted in m_pages (leave_pages at release)
    // A reader that opened following a shared version (PageState::followers): the
    // version it reads, fixed at open. Compared only, never dereferenced.
    const Version* followed = nullptr;
    // A page-cache reader whose open made the kernel drop its pages: its first READ
    // shows the drop is done (settle_pages). Set under m_pages_mutex, read anywhere.
    std::atomic<bool> refilling{false};
    bool page_writer = false;  // a writer counted in m_pages (leave_pages_as_writer at release)
    bool closed_clean = false; // a page writer whose close published it, nothing written since (m_pages_mutex)
    bool killed = false;       // its writer died by a signal: its close publishes nothing
};

struct Filesystem::DirHandle {
    struct Child {
        std::string name;
        Ino ino;
        core::FileType type;
    };
    std::mutex mutex;
    bool loaded = false;
    std::vector<Child> children;  // a snapshot: offsets stay stable while the dir changes
};

Filesystem::Filesystem(core::Store& store, const Options& options)
    : m_store(store), m_options(options), m_background(store, options.sync_interval_s) {}

Filesystem::~Filesystem() {
    {
        std::lock_guard lock(m_pages_mutex);
        m_writer_gate_stop = true;
    }
    m_writer_gate_wake.notify_all();
    if (m_writer_gate.joinable()) m_writer_gate.join();
    m_background.stop();
}

void Filesystem::start(fuse_session* session) {
    // Also under --read-only (init() has not run yet), where no reader is lazy: the
    // scan is then empty, and the pin one more snapshot.
    m_background.on_period([this] { renew_pin(); });
    m_background.start(session);
    m_writer_gate = std::thread([this] { run_writer_gate(); });
}

// ---- replies ------------------------------------------------------------------------

void Filesystem::reply_error(fuse_req_t req, const core::Error& error) {
    switch (error.code) {
        case ENOSPC: m_background.count(core::Counter::errors_nospc); break;
        case EIO: m_background.count(core::Counter::errors_io); break;
        case EFBIG:
        case ENOMEM: m_background.count(core::Counter::errors_other); break;
        default: break;  // ENOENT, EEXIST, ENOTEMPTY ... are answers, not failures
    }
    if (error.code == EIO || error.code == ENOSPC) {
        log::error("{}", error.message);
    }
    fuse_reply_err(req, error.code > 0 ? error.code : EIO);
}

void Filesystem::reply_entry(fuse_req_t req, const Attr& stored) {
    Attr attr = stored;
    apply_live_size(attr);
    const fuse_entry_param e = entry_param(attr, attr_timeout(attr));
    remember_lookup(attr.ino);
    if (fuse_reply_entry(req, &e) != 0) forget(attr.ino, 1);  // the kernel never got it
}

// ---- lookup references and orphans ------------------------------------------------

void Filesystem::remember_lookup(Ino ino) {
    std::lock_guard lock(m_lookups_mutex);
    ++m_lookups[ino];
}

void Filesystem::forget(fuse_ino_t ino, std::uint64_t count) {
    std::lock_guard lock(m_lookups_mutex);
    auto it = m_lookups.find(ino);
    if (it == m_lookups.end()) return;
    if (it->second > count) {
        it->second -= count;
        return;
    }
    m_lookups.erase(it);
    m_orphans.erase(ino);  // the kernel will not ask for it again
    std::lock_guard pages(m_pages_mutex);  // nor keep pages of it: bounded by the kernel's cache
    if (auto page = m_pages.find(ino);
        page != m_pages.end() && page->second.readers.empty() && page->second.followers.empty() &&
        page->second.writers == 0) {
        m_pages.erase(page);
    }
}

std::optional<std::pair<Ino, Filesystem::Orphan>> Filesystem::orphan_of(const core::ReadTxn& txn, Ino parent,
                                                                        const char* name) {
    auto attr = txn.lookup(parent, name);
    if (!attr || !attr->is_regular()) return std::nullopt;
    {
        std::lock_guard lock(m_lookups_mutex);
        if (!m_lookups.count(attr->ino)) return std::nullopt;  // the kernel does not know it
    }
    auto content = txn.read(attr->ino);
    if (!content) return std::nullopt;
    Orphan orphan{*attr, snapshot(attr->digest, content->bytes())};
    orphan.attr.nlink = 0;
    return std::pair{attr->ino, std::move(orphan)};
}

void Filesystem::adopt(std::optional<std::pair<Ino, Orphan>>& orphan) {
    if (!orphan) return;
    std::lock_guard lock(m_lookups_mutex);
    if (m_lookups.count(orphan->first)) m_orphans[orphan->first] = orphan->second;
}

void Filesystem::disown(const std::optional<std::pair<Ino, Orphan>>& orphan) {
    if (!orphan) return;
    std::lock_guard lock(m_lookups_mutex);
    m_orphans.erase(orphan->first);
}

core::Status Filesystem::remove_keeping_orphan(Ino parent, const char* name,
                                               const std::function<core::Status(core::WriteTxn&)>& remove) {
    auto txn = m_store.write();
    if (!txn) return tl::unexpected(txn.error());
    auto orphan = orphan_of(*txn, parent, name);
    if (auto s = remove(*txn); !s) return s;
    // The orphan must exist before the removal is visible: the kernel may open the
    // old inode concurrently (an open does not wait for a rename of its name).
    adopt(orphan);
    auto s = txn->commit();
    if (!s) disown(orphan);
    else if (orphan) m_background.invalidate_attr(orphan->first);  // nlink 0 now
    return s;
}

std::optional<Attr> Filesystem::removed_attr(Ino ino, FileHandle* handle) {
    std::optional<Attr> attr;
    if (handle) attr = handle->attr;
    else if (auto orphan = find_orphan(ino)) attr = orphan->attr;
    if (attr) attr->nlink = 0;
    return attr;
}

std::optional<Filesystem::Orphan> Filesystem::find_orphan(Ino ino) {
    std::lock_guard lock(m_lookups_mutex);
    auto it = m_orphans.find(ino);
    if (it == m_orphans.end()) return std::nullopt;
    return it->second;
}

// ---- versions (THE RULE in filesystem.hpp) ------------------------------------------

core::Status Filesystem::join_version(FileHandle* handle, bool truncate, std::optional<core::StagedFile> made) {
    const Ino ino = handle->ino;
    std::shared_ptr<Version> joined;
    bool truncate_shared = false;
    for (;;) {
        {
            std::unique_lock lock(m_versions_mutex);
            auto ending = [&] {
                auto it = m_versions.find(ino);
                if (it == m_versions.end()) return false;
                if (it->second.shared && it->second.shared->ending) return true;
                return std::any_of(it->second.rewrites.begin(), it->second.rewrites.end(),
                                   [](const auto& v) { return v->ending; });
            };
            m_version_ended.wait(lock, [&] { return !ending(); });
            InodeVersions& versions = m_versions[ino];
            if (versions.shared) {
                joined = versions.shared;  // an O_TRUNC open truncates it, as on a local disk
                truncate_shared = truncate;
            } else if (!truncate && !versions.rewrites.empty()) {
                // A handle that shares the file meets a rewrite at work: as on a local
                // disk, they share one file from now on (the newest rewrite's content).
                joined = versions.rewrites.back();
                versions.rewrites.pop_back();
                joined->shared = true;
                versions.shared = joined;
            } else if (made) {
                joined = std::make_shared<Version>(std::move(*made), !truncate, handle->opener);
                made.reset();
                joined->touched = ++m_write_clock;
                if (truncate) versions.rewrites.push_back(joined);
                else versions.shared = joined;
            }
            if (joined) {
                ++joined->handles;
                break;
            }
            if (versions.rewrites.empty() && !versions.shared) m_versions.erase(ino);
        }
        // A new version: begin it outside the lock (a write transaction), then decide again.
        auto staged = core::StagedFile::begin(m_store, ino, truncate);
        if (!staged) return tl::unexpected(staged.error());
        staged->set_max_size(m_options.max_file_size);
        made = std::move(*staged);
    }
    if (made) (void)made->abandon();  // another handle's version was taken instead
    handle->version = joined;
    if (truncate_shared) {
        std::lock_guard lock(joined->mutex);
        if (auto s = joined->staged.truncate(0); !s) return s;
    }
    return {};
}

void Filesystem::leave_version(fuse_req_t req, FileHandle* handle) {
    const std::shared_ptr<Version> version = std::move(handle->version);
    if (!version) return;
    {
        std::lock_guard lock(m_versions_mutex);
        if (--version->handles > 0) return;
        version->ending = true;  // no handle joins it any more; new ones wait for its end
    }
    {
        std::lock_guard lock(version->mutex);
        // A rewrite whose writer was killed publishes nothing; a shared version keeps
        // every handle's writes, as a local disk does.
        const bool keep = version->shared || !handle->killed;
        if (keep) {
            if (auto s = publish(req, *version); !s) {
                log::error("content of inode {} lost at release: {}", handle->ino,
                           s.error().message);
            }
        }
        (void)version->staged.abandon();
        version->ended = true;
    }
    {
        std::lock_guard lock(m_versions_mutex);
        if (auto it = m_versions.find(handle->ino); it != m_versions.end()) {
            InodeVersions& versions = it->second;
            if (versions.shared == version) versions.shared.reset();
            std::erase(versions.rewrites, version);
            if (!versions.shared && versions.rewrites.empty()) m_versions.erase(it);
        }
        version->ending = false;
    }
    m_version_ended.notify_all();
    m_background.invalidate_attr(handle->ino);  // no writer: the answer is everybody's again
}

void Filesystem::apply_live_size(Attr& attr) {
    if (!attr.is_regular()) return;
    if (auto shared = shared_version(attr.ino)) {
        std::lock_guard lock(shared->mutex);
        attr.size = shared->staged.content().size();
    }
}

bool Filesystem::has_rewrite(Ino ino) {
    std::lock_guard lock(m_versions_mutex);
    auto it = m_versions.find(ino);
    return it != m_versions.end() && !it->second.rewrites.empty();
}

std::shared_ptr<Filesystem::Version> Filesystem::shared_version(Ino ino) {
    std::lock_guard lock(m_versions_mutex);
    auto it = m_versions.find(ino);
    return it == m_versions.end() ? nullptr : it->second.shared;
}

void Filesystem::follow_shared(FileHandle* handle) {
    if (handle->writable || handle->orphan) return;
    auto current = shared_version(handle->ino);
    if (!current || current == handle->version) return;
    core::Digest reading = handle->snapshot_digest;
    if (handle->version) {
        std::lock_guard lock(handle->version->mutex);
        if (!handle->version->ended) return;
        reading = handle->version->staged.stored_digest();  // what it published last
    }
    if (current->started_from != reading) return;  // a reader of another version keeps it
    handle->version = std::move(current);
    handle->snapshot.reset();
}

std::optional<std::uint64_t> Filesystem::rewrite_size(Ino ino, std::uint32_t process) {
    std::shared_ptr<Version> newest;
    {
        std::lock_guard lock(m_versions_mutex);
        auto it = m_versions.find(ino);
        if (it == m_versions.end()) return std::nullopt;
        for (const auto& v : it->second.rewrites) {
            if (v->opener == process && (!newest || v->touched > newest->touched)) newest = v;
        }
    }
    if (!newest) return std::nullopt;
    std::lock_guard lock(newest->mutex);
    return newest->staged.content().size();
}

bool Filesystem::truncate_versions(Ino ino, std::uint64_t size, std::uint64_t* shared_size) {
    std::vector<std::shared_ptr<Version>> versions;
    std::shared_ptr<Version> shared;
    {
        std::lock_guard lock(m_versions_mutex);
        auto it = m_versions.find(ino);
        if (it == m_versions.end()) return false;
        shared = it->second.shared;
        versions = it->second.rewrites;
    }
    // On a local disk a truncate by path cuts the one file every writer shares: the
    // rewrites' staged copies are cut too. A version that ended (its last release
    // published it; it leaves m_versions just after) is the stored file now: cutting
    // its staged copy would cut nothing, so the db's content is truncated instead.
    for (const auto& v : versions) {
        std::lock_guard lock(v->mutex);
        if (!v->ended) (void)v->staged.truncate(size);
    }
    if (!shared) return false;
    std::lock_guard lock(shared->mutex);
    if (shared->ended) return false;
    (void)shared->staged.truncate(size);
    *shared_size = shared->staged.content().size();
    return true;
}

// ---- init and namespace ---------------------------------------------------------

void Filesystem::init(fuse_conn_info* conn) {
    // Atomic O_TRUNC: open() must know O_TRUNC to apply THE RULE (a rewrite or the
    // shared version). The kernel then sets the inode's size to 0 after such an open;
    // readers of the old version that it would cut short do not read through the
    // page cache meanwhile (admit_writer, enter_pages), and the next getattr answers
    // the size each one should see.
    if (!(conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)) {
        log::warning("the kernel's FUSE lacks atomic O_TRUNC: an O_TRUNC open shares the file "
                     "as any other writer (no private rewrite)");
    }
    conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    // Page-cache writeback would hold writes past close() and fsync's reply to the
    // kernel: publishing needs them. Writes go through the page cache to the daemon.
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;  // invalidation is explicit
    conn->max_write = 1 << 20;
    // Read-only serving at the floor: OPEN answered ENOSYS (open()).
    m_no_open = m_options.read_only && (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT);
}

void Filesystem::lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    answer_lookup(req, parent, name, m_remote != nullptr);
}

void Filesystem::answer_lookup(fuse_req_t req, Ino parent, const char* name, bool read_through) {
    double negative_timeout = kNegativeTimeout;
    {
        auto txn = m_store.read();
        if (!txn) return reply_error(req, txn.error());
        auto attr = txn->lookup(parent, name);
        if (attr) return reply_entry(req, *attr);
        if (attr.error().code != ENOENT) return reply_error(req, attr.error());
        // The shared tier (remote_tier.hpp): a name that could be an entry is fetched
        // on a tier thread, which answers this request; the kernel keeps such a
        // negative answer briefly, so an entry another node publishes is found.
        if (m_remote) {
            if (auto entry = m_remote->candidate(*txn, parent, name)) {
                negative_timeout = RemoteTier::kNegativeTimeoutS;
                if (read_through) {
                    txn = core::fail(ENOENT, "");  // no snapshot held while waiting
                    m_remote->read_through(*entry, [this, req, parent, n = std::string(name)] {
                        answer_lookup(req, parent, n.c_str(), false);
                    });
                    return;
                }
            }
        }
    }
    m_background.count(core::Counter::negative_lookups);
    fuse_entry_param e{};  // ino 0: a negative entry the kernel may cache
    e.entry_timeout = negative_timeout;
    fuse_reply_entry(req, &e);
}

void Filesystem::getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    auto* handle = fi && fi->fh ? reinterpret_cast<FileHandle*>(fi->fh) : nullptr;
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto attr = txn->getattr(ino);
    if (!attr && attr.error().code == ENOENT) {  // removed: a handle or orphan still knows it
        if (auto removed = removed_attr(ino, handle)) attr = *removed;
    }
    if (!attr) return reply_error(req, attr.error());
    // The kernel applies every size it is told to the one inode all openers share.
    // The shared version's size, while there is one, is everybody's: its handles
    // write through the page cache and append at the kernel's size. A rewrite is
    // told its own size (no other process reads the inode through the page cache
    // while it writes: admit_writer). Anyone else is told the size of the version
    // read through the page cache while it is, else their own.
    // The kernel keeps an answer only while every caller would get it (attr_timeout):
    // a handle reading another version than the stored one is told its own, uncached.
    bool own_view = false;
    if (attr->is_regular()) {
        std::optional<std::uint64_t> size;
        std::shared_ptr<Version> version;
        std::shared_ptr<const std::string> snapshot;
        if (handle) {
            std::lock_guard lock(handle->mutex);
            follow_shared(handle);
            version = handle->version;
            snapshot = handle->snapshot;
            own_view = version || (!handle->orphan && handle->snapshot_digest != attr->digest);
            if (handle->lazy && !snapshot) size = handle->attr.size;  // its version's, not yet loaded
        }
        if (!version) version = shared_version(ino);
        if (version) {
            std::lock_guard lock(version->mutex);
            size = version->staged.content().size();
        }
        if (!size) size = page_cache_size(ino);
        if (!size && snapshot) size = snapshot->size();
        if (!size) size = rewrite_size(ino, process_of(fuse_req_ctx(req)->pid));  // stat by path by a rewriter
        if (size) attr->size = *size;
    }
    struct stat st = to_stat(*attr);
    fuse_reply_attr(req, &st, own_view ? 0 : attr_timeout(*attr));
}

void Filesystem::setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                         fuse_file_info* fi) {
    FileHandle* handle = fi && fi->fh ? reinterpret_cast<FileHandle*>(fi->fh) : nullptr;
    std::optional<std::uint64_t> version_size;  // the size a truncated version now has
    if ((to_set & FUSE_SET_ATTR_SIZE) && static_cast<std::uint64_t>(attr->st_size) > m_options.max_file_size) {
        return reply_error(req, {EFBIG, "file size over --max-file-size"});
    }
    if ((to_set & FUSE_SET_ATTR_SIZE) && handle) {
        std::shared_ptr<Version> version;
        {
            std::lock_guard lock(handle->mutex);
            if (handle->writable) version = handle->version;
        }
        if (version) {  // ftruncate of a file being written: part of its version
            std::lock_guard lock(version->mutex);
            if (auto s = version->staged.truncate(static_cast<std::uint64_t>(attr->st_size)); !s) {
                return reply_error(req, s.error());
            }
            version_size = version->staged.content().size();
            to_set &= ~FUSE_SET_ATTR_SIZE;
        }
    }
    if ((to_set & FUSE_SET_ATTR_SIZE) && !handle) {
        // truncate by path: the shared version is the file (stored when it is
        // published); rewrites are cut too.
        std::uint64_t shared_size = 0;
        if (truncate_versions(ino, static_cast<std::uint64_t>(attr->st_size), &shared_size)) {
            version_size = shared_size;
            to_set &= ~FUSE_SET_ATTR_SIZE;
        }
    }
    core::SetAttr changes;
    if (to_set & FUSE_SET_ATTR_MODE) changes.mode = attr->st_mode;
    if (to_set & FUSE_SET_ATTR_UID) changes.uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID) changes.gid = attr->st_gid;
    if (to_set & FUSE_SET_ATTR_SIZE) changes.size = static_cast<std::uint64_t>(attr->st_size);
    const std::int64_t now = m_store.now_ns();
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) changes.atime_ns = now;
    else if (to_set & FUSE_SET_ATTR_ATIME) changes.atime_ns = ns_of(attr->st_atim);
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) changes.mtime_ns = now;
    else if (to_set & FUSE_SET_ATTR_MTIME) changes.mtime_ns = ns_of(attr->st_mtim);
    Attr result;
    auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
        auto a = txn.setattr(ino, changes);
        if (!a) return tl::unexpected(a.error());
        result = *a;
        return {};
    });
    if (!s && s.error().code == ENOENT) {  // removed while open: as on a local disk, it works
        if (auto removed = removed_attr(ino, handle)) {
            s = {};
            result = *removed;
        }
    }
    if (!s) return reply_error(req, s.error());
    if (changes.size) {
        // truncate(path) while rewrites are at work: cut them too (truncate_versions
        // did, before the store; a rewrite that opened in between is cut here).
        std::uint64_t unused = 0;
        (void)truncate_versions(ino, *changes.size, &unused);
        m_background.invalidate_inode(ino);
    }
    if (version_size) result.size = *version_size;
    else apply_live_size(result);
    // The reply updates the caller's view; the notification reaches answers to
    // requests that were in flight meanwhile (the kernel drops those it overtakes).
    m_background.invalidate_attr(ino);
    struct stat st = to_stat(result);
    fuse_reply_attr(req, &st, version_size ? 0 : attr_timeout(result));
}

void Filesystem::readlink(fuse_req_t req, fuse_ino_t ino) {
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto target = txn->readlink(ino);
    if (!target) return reply_error(req, target.error());
    fuse_reply_readlink(req, target->c_str());
}

void Filesystem::make_node(fuse_req_t req,
                           const std::function<core::Result<Attr>(core::WriteTxn&, const fuse_ctx&)>& make) {
    const fuse_ctx* ctx = fuse_req_ctx(req);
    Attr attr;
    auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
        auto a = make(txn, *ctx);
        if (!a) return tl::unexpected(a.error());
        attr = *a;
        return {};
    });
    if (!s) return reply_error(req, s.error());
    reply_entry(req, attr);
}

void Filesystem::mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
    make_node(req, [&](core::WriteTxn& txn, const fuse_ctx& ctx) {
        return txn.mkdir(parent, name, mode, ctx.uid, ctx.gid);
    });
}

void Filesystem::mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t) {
    if (!S_ISREG(mode)) return reply_error(req, {EPERM, "only regular files can be made"});
    make_node(req, [&](core::WriteTxn& txn, const fuse_ctx& ctx) {
        return txn.create(parent, name, mode, ctx.uid, ctx.gid, true);
    });
}

void Filesystem::symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
    make_node(req, [&](core::WriteTxn& txn, const fuse_ctx& ctx) {
        return txn.symlink(parent, name, target, ctx.uid, ctx.gid);
    });
}

void Filesystem::unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
    auto s = remove_keeping_orphan(parent, name, [&](core::WriteTxn& txn) { return txn.unlink(parent, name); });
    if (!s) return reply_error(req, s.error());
    fuse_reply_err(req, 0);
}

void Filesystem::rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
    auto s = m_store.update([&](core::WriteTxn& txn) { return txn.rmdir(parent, name); });
    if (!s) return reply_error(req, s.error());
    fuse_reply_err(req, 0);
}

void Filesystem::rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
                        const char* new_name, unsigned int flags) {
    unsigned ours = 0;
    if (flags & RENAME_NOREPLACE) ours |= core::kRenameNoReplace;
    if (flags & RENAME_EXCHANGE) ours |= core::kRenameExchange;
    if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return reply_error(req, {EINVAL, "rename flags"});
    // The file a rename replaces may still be open (or about to be): keep it. A file
    // renamed into place populates its entry on behalf of the renaming process.
    const core::Origin origin = origin_of(req);
    auto s = remove_keeping_orphan(new_parent, new_name, [&](core::WriteTxn& txn) {
        return txn.rename(parent, name, new_parent, new_name, ours, &origin);
    });
    if (!s) return reply_error(req, s.error());
    fuse_reply_err(req, 0);
}

void Filesystem::link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) {
    fuse_reply_err(req, EPERM);  // no hard links: each node has one parent and name
}

// ---- files ----------------------------------------------------------------------

Filesystem::PageUse Filesystem::enter_pages(FileHandle* reader, const core::Digest& digest, std::uint64_t size,
                                            bool* stale_attr) {
    std::lock_guard lock(m_pages_mutex);
    auto [it, inserted] = m_pages.try_emplace(reader->ino, PageState{digest, size, {}, {}, 0});
    PageState& state = it->second;
    // The kernel may still hold the attributes (the size) of another version, told
    // before it was replaced: it must forget them before this reader reads (open()).
    *stale_attr = state.told && *state.told != digest;
    if (*stale_attr) state.told.reset();
    if (!inserted && state.digest.empty() && state.readers.empty() && state.writers == 0) {
        // The writers that were here left pages of no known version: refill them.
        state.digest = digest;
        state.size = size;
        inserted = true;
    }
    // A writer counts itself in (enter_pages_as_writer) under the same lock: a reader
    // either sees it here or is among the readers it waits for. Followers of a shared
    // version read what its writers left in the pages, of no version this reader knows.
    // A writer that closed and published what the reader opens is only waiting for its
    // RELEASE (sent after close() returns): the reader refills from the db below, as
    // after the release, and may map the file shared (direct_io could not).
    const bool closed = state.writers == 1 && state.closed_writers == 1 && state.closed_digest == digest;
    if (state.writers > 0 && !closed) return PageUse::direct;
    if (!state.followers.empty()) return PageUse::direct;
    PageUse use = inserted ? PageUse::refill : PageUse::keep;
    if (!inserted && state.digest != digest) {
        // Another version's reader still fills the cache: mixing would tear both.
        if (!state.readers.empty()) return PageUse::direct;
        state.digest = digest;
        state.size = size;
        state.kept.reset();
        use = PageUse::refill;  // the kernel drops the other version's pages first
    }
    if (use == PageUse::refill) state.settled = false;
    // The kernel drops the old pages when the refilling open completes, after this
    // reply: until one of its READs shows it did, keeping them could serve another
    // version's pages (a writer's, say) to this reader.
    if (!state.settled) use = PageUse::refill;
    state.readers.push_back(reader);
    reader->page_cached = true;
    reader->refilling = use == PageUse::refill;
    if (use == PageUse::keep) {
        // Counted before open() checks the pin (pinned), so renew_pin sees it.
        reader->lazy = true;
        if (state.lazy++ == 0) m_lazy_inodes.insert(reader->ino);
    }
    return use;
}

void Filesystem::settle_pages(FileHandle* reader) {
    std::lock_guard lock(m_pages_mutex);
    reader->refilling = false;
    if (auto it = m_pages.find(reader->ino); it != m_pages.end() && it->second.digest == reader->snapshot_digest &&
                                             std::find(it->second.readers.begin(), it->second.readers.end(), reader) !=
                                                 it->second.readers.end()) {
        it->second.settled = true;
    }
}

void Filesystem::enter_pages_as_follower(FileHandle* reader, const Version* version) {
    std::lock_guard lock(m_pages_mutex);
    m_pages[reader->ino].followers.push_back(reader);
    reader->page_cached = true;
    reader->followed = version;
}

void Filesystem::leave_pages(FileHandle* reader) {
    std::vector<std::function<void()>> admitted;
    {
        std::lock_guard lock(m_pages_mutex);
        if (auto it = m_pages.find(reader->ino); it != m_pages.end()) {
            std::erase(it->second.readers, reader);
            std::erase(it->second.followers, reader);
            if (reader->lazy && --it->second.lazy == 0) m_lazy_inodes.erase(reader->ino);
            if (it->second.readers.empty()) it->second.kept.reset();
        }
        for (auto w = m_waiting_writers.begin(); w != m_waiting_writers.end();) {
            std::erase(w->readers, reader);
            if (!w->readers.empty()) {
                ++w;
                continue;
            }
            admitted.push_back(std::move(w->reply));
            w = m_waiting_writers.erase(w);
        }
    }
    for (auto& reply : admitted) reply();  // replies never under a lock handlers take
}

double Filesystem::attr_timeout(const Attr& a) {
    if (!a.is_regular()) return kDirAttrTimeout;
    if (a.nlink == 0) return 0;  // removed: answered from a handle or an orphan
    {
        std::lock_guard lock(m_versions_mutex);
        if (m_versions.count(a.ino)) return 0;  // a writer at work: the answer depends on the caller
    }
    std::lock_guard lock(m_pages_mutex);
    PageState& state = m_pages[a.ino];  // an empty state is one of no known version (enter_pages)
    if (state.writers > 0 || (!state.readers.empty() && state.digest != a.digest)) return 0;
    state.told = a.digest;
    return kFileAttrTimeout;
}

void Filesystem::keep_for_readers(Ino ino) {
    core::Digest digest;
    {
        std::lock_guard lock(m_pages_mutex);
        auto it = m_pages.find(ino);
        if (it == m_pages.end() || it->second.readers.empty() || it->second.kept) return;
        digest = it->second.digest;
    }
    auto txn = m_store.read();
    if (!txn) return;
    auto attr = txn->getattr(ino);
    if (!attr || attr->digest != digest) return;
    auto content = txn->read(ino);
    if (!content) return;
    auto kept = snapshot(digest, content->bytes());
    std::lock_guard lock(m_pages_mutex);
    if (auto it = m_pages.find(ino); it != m_pages.end() && it->second.digest == digest && !it->second.readers.empty()) {
        it->second.kept = std::move(kept);
    }
}

std::shared_ptr<const std::string> Filesystem::load_content(Ino ino, const core::Digest& digest) {
    if (auto live = find_snapshot(digest)) return live;
    if (auto txn = m_store.read()) {
        auto attr = txn->getattr(ino);
        if (attr && attr->digest == digest) {
            if (auto content = txn->read(ino)) return snapshot(digest, content->bytes());
        }
    }
    // Removed by this daemon since the open: an orphan.
    if (auto orphan = find_orphan(ino); orphan && orphan->attr.digest == digest) return orphan->content;
    // Replaced or removed by this daemon (keep_for_readers) or another process: kept
    // by renew_pin, or still in the pin if renew_pin has not seen the change yet.
    // Both under m_pin_mutex: renew_pin moves the content from one to the other.
    std::lock_guard pin_lock(m_pin_mutex);
    {
        std::lock_guard lock(m_pages_mutex);
        if (auto it = m_pages.find(ino); it != m_pages.end() && it->second.kept && it->second.digest == digest) {
            return it->second.kept;
        }
    }
    if (m_pin) {
        auto attr = m_pin->getattr(ino);
        if (attr && attr->digest == digest) {
            if (auto content = m_pin->read(ino)) return snapshot(digest, content->bytes());
        }
    }
    return nullptr;
}

void Filesystem::renew_pin() {
    auto now = m_store.read();
    if (!now) return;
    std::lock_guard pin_lock(m_pin_mutex);
    if (m_pin && m_pin->id() == now->id()) return;  // nothing committed since: the pin covers it all
    if (m_pin) {
        // Lazy readers whose version left the db between the pin and now: keep it
        // from the pin, where LMDB still holds its pages.
        std::vector<std::pair<Ino, core::Digest>> lazy;
        {
            std::lock_guard lock(m_pages_mutex);
            for (Ino ino : m_lazy_inodes) {
                const PageState& state = m_pages.at(ino);
                if (!state.kept) lazy.emplace_back(ino, state.digest);
            }
        }
        for (const auto& [ino, digest] : lazy) {
            auto stored = now->getattr(ino);
            if (stored && stored->digest == digest) continue;  // still there: the READ finds it
            auto live = find_snapshot(digest);  // a reader loaded it already
            if (!live) {
                auto old = m_pin->getattr(ino);
                if (!old || old->digest != digest) continue;  // opened after the pin: pinned() copied it
                auto content = m_pin->read(ino);
                if (!content) {
                    log::error("keeping the content of inode {} for its readers: {}", ino, content.error().message);
                    continue;
                }
                live = snapshot(digest, content->bytes());
            }
            std::lock_guard lock(m_pages_mutex);
            if (auto it = m_pages.find(ino); it != m_pages.end() && it->second.lazy > 0 &&
                                             it->second.digest == digest && !it->second.kept) {
                it->second.kept = std::move(live);
            }
        }
    }
    m_pin.reset();  // the old snapshot ends: LMDB may reuse what only it saw
    m_pin.emplace(std::move(*now));
}

bool Filesystem::pinned(Ino ino, const core::Digest& digest, const core::ReadTxn& txn) {
    std::lock_guard lock(m_pin_mutex);
    if (!m_pin) return false;
    if (m_pin->id() == txn.id()) return true;  // the same snapshot: the common case
    // The db changed since the pin: covered if the pin holds the same version.
    auto attr = m_pin->getattr(ino);
    return attr && attr->digest == digest;
}

std::optional<std::uint64_t> Filesystem::page_cache_size(Ino ino) {
    std::lock_guard lock(m_pages_mutex);
    auto it = m_pages.find(ino);
    if (it == m_pages.end() || it->second.readers.empty()) return std::nullopt;
    return it->second.size;
}

std::vector<std::pair<Filesystem::FileHandle*, pid_t>> Filesystem::enter_pages_as_writer(FileHandle* writer) {
    std::lock_guard lock(m_pages_mutex);
    PageState& state = m_pages[writer->ino];
    ++state.writers;
    // Writers write through the page cache: once they are gone it holds no known
    // version (several rewrites may have mixed theirs), so the next reader refills it.
    state.digest = {};
    state.settled = false;
    writer->page_writer = true;
    std::vector<std::pair<FileHandle*, pid_t>> readers;
    for (FileHandle* r : state.readers) readers.emplace_back(r, r->reader_tid);
    // Readers of another shared version than the writer's (one that ended): the
    // writer's pages would be theirs. Those of its own version read what it writes.
    for (FileHandle* r : state.followers) {
        if (r->followed != writer->version.get()) readers.emplace_back(r, r->reader_tid);
    }
    return readers;
}

void Filesystem::leave_pages_as_writer(FileHandle* writer) {
    std::lock_guard lock(m_pages_mutex);
    if (auto it = m_pages.find(writer->ino); it != m_pages.end()) {
        if (it->second.writers > 0) --it->second.writers;
        if (writer->closed_clean && it->second.closed_writers > 0) --it->second.closed_writers;
    }
    writer->page_writer = false;
    writer->closed_clean = false;
}

void Filesystem::close_page_writer(FileHandle* writer, bool clean, const core::Digest& published) {
    std::lock_guard lock(m_pages_mutex);
    if (!writer->page_writer || writer->closed_clean == clean) return;
    auto it = m_pages.find(writer->ino);
    if (it == m_pages.end()) return;
    writer->closed_clean = clean;
    if (clean) {
        ++it->second.closed_writers;
        it->second.closed_digest = published;
    } else if (it->second.closed_writers > 0) {
        --it->second.closed_writers;
    }
}

void Filesystem::admit_writer(FileHandle* writer, std::function<void()> reply) {
    const auto readers = enter_pages_as_writer(writer);
    // The writer's own process reading the file it rewrites races with itself, as
    // on a local disk: waiting for it would only stall it.
    std::vector<FileHandle*> others;
    for (auto [reader, tid] : readers) {
        if (process_of(tid) != writer->opener) others.push_back(reader);
    }
    if (!others.empty()) {
        std::lock_guard lock(m_pages_mutex);
        // Some may have closed meanwhile; none entered (the writer is registered).
        const auto it = m_pages.find(writer->ino);
        std::erase_if(others, [&](FileHandle* r) {
            if (it == m_pages.end()) return true;
            const auto& still = it->second.readers;
            const auto& following = it->second.followers;
            return std::find(still.begin(), still.end(), r) == still.end() &&
                   std::find(following.begin(), following.end(), r) == following.end();
        });
        if (!others.empty()) {
            m_waiting_writers.push_back({writer, std::move(others),
                                         std::chrono::steady_clock::now() + kWriterWait, std::move(reply)});
            m_writer_gate_wake.notify_all();
            return;
        }
    }
    reply();
}

void Filesystem::run_writer_gate() {
    std::unique_lock lock(m_pages_mutex);
    while (!m_writer_gate_stop) {
        auto next = std::chrono::steady_clock::time_point::max();
        for (const WaitingWriter& w : m_waiting_writers) next = std::min(next, w.deadline);
        m_writer_gate_wake.wait_until(lock, next);
        std::vector<WaitingWriter> overdue;
        const auto now = std::chrono::steady_clock::now();
        for (auto w = m_waiting_writers.begin(); w != m_waiting_writers.end();) {
            if (w->deadline > now) {
                ++w;
                continue;
            }
            overdue.push_back(std::move(*w));
            w = m_waiting_writers.erase(w);
        }
        if (overdue.empty()) continue;
        lock.unlock();
        for (auto& w : overdue) {
            log::warning("a writer of inode {} waited {} s for {} reader(s) of the old content to "
                         "close; it goes ahead (those readers may read past their end)",
                         w.writer->ino,
                         std::chrono::duration_cast<std::chrono::seconds>(kWriterWait).count(),
                         w.readers.size());
            w.reply();
        }
        lock.lock();
    }
}

void Filesystem::discard_open(FileHandle* handle) {
    if (handle->writable) {
        handle->killed = true;  // its opener never got it: a rewrite publishes nothing
        leave_version(nullptr, handle);
    }
    if (handle->page_cached) leave_pages(handle);
    if (handle->page_writer) leave_pages_as_writer(handle);
    delete handle;
}

std::shared_ptr<const std::string> Filesystem::find_snapshot(const core::Digest& digest) {
    std::lock_guard lock(m_snapshots_mutex);
    auto it = m_snapshots.find(digest.hex());
    return it == m_snapshots.end() ? nullptr : it->second.lock();
}

std::shared_ptr<const std::string> Filesystem::snapshot(const core::Digest& digest,
                                                        std::string_view bytes) {
    const std::string key = digest.hex();
    std::lock_guard lock(m_snapshots_mutex);
    if (auto it = m_snapshots.find(key); it != m_snapshots.end()) {
        if (auto shared = it->second.lock()) return shared;
    }
    if (m_snapshots.size() > 4096) {  // drop the expired ones now and then
        std::erase_if(m_snapshots, [](const auto& kv) { return kv.second.expired(); });
    }
    auto shared = std::make_shared<const std::string>(bytes);
    m_snapshots[key] = shared;
    return shared;
}

void Filesystem::count_open(fuse_req_t req, const core::ReadTxn& txn, const Attr& attr) {
    m_background.count(core::Counter::opens);
    if (!attr.entry || attr.bookkeeping) return;  // locks and temp files are no kernel
    auto entry = txn.entry(attr.entry);
    if (!entry || !entry->populated) return;
    // Most opens come from a thread that opened this entry before: known without /proc.
    const auto tid = static_cast<std::uint32_t>(fuse_req_ctx(req)->pid);
    const std::string by_thread = fmt::format("{}:t{}", attr.entry, tid);
    {
        std::lock_guard lock(m_seen_mutex);
        if (m_seen.count(by_thread)) return;
    }
    const std::uint32_t pid = process_of(static_cast<pid_t>(tid));
    const std::string by_process = fmt::format("{}:{}", attr.entry, pid);
    const bool own = same_compile(pid, entry->populated_by_pid);  // /proc: not under the lock
    {
        std::lock_guard lock(m_seen_mutex);
        if (m_seen.size() >= kMaxSeenPairs) m_seen.clear();  // bounded: may recount after this
        m_seen.insert(by_thread);
        if (own) return;  // its own kernel (or its compile's), not a cache hit
        if (!m_seen.insert(by_process).second) return;
    }
    m_background.hit(attr.entry);
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
    bool joined_existing = false;
    bool stale_attr = false;  // a reader must not read before the kernel forgot old attributes
    // A refilling reader must not read before the kernel's size is at least its
    // version's (Background::grow_size): the size and last byte of that version.
    std::optional<std::pair<std::uint64_t, char>> grow;
    {
        auto txn = m_store.read();
        if (!txn) return reply_error(req, txn.error());
        auto attr = txn->getattr(ino);
        if (!attr) {
            auto orphan = attr.error().code == ENOENT ? find_orphan(ino) : std::nullopt;
            if (!orphan && attr.error().code == ENOENT) {
                // Evicted by another process, and the kernel's name for it not yet
                // invalidated: ESTALE makes the kernel look the name up again and open
                // (or, with O_CREAT, create) what is there now, as NFS clients do.
                return reply_error(req, {ESTALE, "evicted since the kernel looked it up"});
            }
            if (!orphan) return reply_error(req, attr.error());
            // Removed since the kernel looked it up: open what it was, as a local disk would.
            handle->orphan = true;
            handle->attr = orphan->attr;
            if (!truncate) handle->snapshot = orphan->content;
            handle->snapshot_digest = orphan->attr.digest;
            fi->direct_io = 1;
        } else if (attr->is_dir()) {
            return reply_error(req, {EISDIR, "is a directory"});
        } else if (!handle->writable) {
            handle->attr = *attr;
            count_open(req, *txn, *attr);
            fi->noflush = 1;  // a reader has nothing to publish: spare the round trip at close
            if (auto shared = shared_version(ino)) {
                // The file is being shared by writers: read it as they write it, through
                // the page cache they write through.
                handle->reader_tid = fuse_req_ctx(req)->pid;
                enter_pages_as_follower(handle.get(), shared.get());
                handle->version = std::move(shared);
                fi->keep_cache = 1;
            } else {
                handle->snapshot_digest = attr->digest;
                handle->reader_tid = fuse_req_ctx(req)->pid;
                const PageUse use = enter_pages(handle.get(), attr->digest, attr->size, &stale_attr);
                fi->direct_io = use == PageUse::direct;
                fi->keep_cache = use == PageUse::keep;
                // The kernel's pages hold this version: a READ comes only for pages it
                // dropped, so the content is loaded then (read()), not copied here.
                // enter_pages counted it as lazy; if the pin does not cover its
                // version (committed since the background thread's last period), it
                // copies the content now, as a reader that refills the pages does.
                if (!handle->lazy || !pinned(ino, attr->digest, *txn)) {
                    auto content = txn->read(ino);
                    if (!content) {
                        if (handle->page_cached) leave_pages(handle.get());
                        return reply_error(req, content.error());
                    }
                    handle->snapshot = snapshot(attr->digest, content->bytes());
                }
                if (use == PageUse::refill && !handle->snapshot->empty()) {
                    grow.emplace(handle->snapshot->size(), handle->snapshot->back());
                }
            }
        } else {
            handle->attr = *attr;
            // A read-write open without O_TRUNC (a database) reads what it opens: it
            // counts as an open for reading. Its reads may all come from the page cache,
            // so the open, not a READ, is what the daemon sees.
            if (handle->readable && !truncate) count_open(req, *txn, *attr);
        }
    }
    if (handle->writable && !handle->orphan) {
        handle->opener = process_of(fuse_req_ctx(req)->pid);
        joined_existing = shared_version(ino) != nullptr || (!truncate && has_rewrite(ino));
        auto s = join_version(handle.get(), truncate, std::nullopt);
        if (!s && s.error().code == ENOENT) {
            handle->orphan = true;  // replaced since the snapshot above: as for a removed file
            fi->direct_io = 1;
        } else if (!s) {
            return reply_error(req, s.error());
        } else {
            // Through the page cache: every handle of the version sees one page cache,
            // and MAP_SHARED works. A new version drops what the cache held.
            fi->keep_cache = joined_existing;
            m_background.invalidate_attr(ino);  // settled attributes now depend on the caller
        }
    }
    FileHandle* raw = handle.release();
    fi->fh = reinterpret_cast<std::uint64_t>(raw);
    auto reply = [this, req, opened = *fi, raw]() mutable {
        if (fuse_reply_open(req, &opened) != 0) discard_open(raw);  // the opener is gone (interrupted)
    };
    if (raw->version && raw->writable) return admit_writer(raw, std::move(reply));
    if (grow) {
        if (stale_attr) m_background.invalidate_attr(ino);  // the same pass, before the reply
        return m_background.grow_size(ino, grow->first, grow->second, std::move(reply));
    }
    if (stale_attr) return m_background.invalidate_attr(ino, std::move(reply));  // replies once told
    reply();
}

void Filesystem::create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                        fuse_file_info* fi) {
    const fuse_ctx* ctx = fuse_req_ctx(req);
    auto handle = std::make_unique<FileHandle>();
    const bool truncate = (fi->flags & O_TRUNC) != 0;
    Attr attr;
    std::optional<core::StagedFile> made;
    {
        auto txn = m_store.write();
        if (!txn) return reply_error(req, txn.error());
        auto created = txn->create(parent, name, mode, ctx->uid, ctx->gid, (fi->flags & O_EXCL) != 0);
        if (!created) return reply_error(req, created.error());
        auto staged = core::StagedFile::begin(*txn, created->ino, truncate || created->size == 0);
        if (!staged) return reply_error(req, staged.error());
        if (auto s = txn->commit(); !s) {
            staged->forget();
            return reply_error(req, s.error());
        }
        staged->set_max_size(m_options.max_file_size);
        made = std::move(*staged);
        attr = *created;
    }
    handle->ino = attr.ino;
    handle->attr = attr;
    handle->writable = true;
    handle->readable = (fi->flags & O_ACCMODE) == O_RDWR;
    handle->opener = process_of(ctx->pid);
    // After the commit: join_version may wait for another version to end.
    const bool joined_existing = shared_version(attr.ino) != nullptr;
    if (auto s = join_version(handle.get(), truncate, std::move(made)); !s) return reply_error(req, s.error());
    fi->keep_cache = joined_existing;  // as in open() for writing
    FileHandle* raw = handle.release();
    fi->fh = reinterpret_cast<std::uint64_t>(raw);
    (void)enter_pages_as_writer(raw);  // no reader enters the page cache while it writes; see admit_writer
    apply_live_size(attr);
    const fuse_entry_param e = entry_param(attr, attr_timeout(attr));  // 0: its version is at work
    remember_lookup(attr.ino);
    // O_CREAT of a file that existed: the kernel may hold its settled attributes.
    m_background.invalidate_attr(attr.ino);
    if (fuse_reply_create(req, &e, fi) != 0) {
        forget(attr.ino, 1);
        discard_open(raw);
    }
}

// Every handler replies only after it let go of the handle's lock: the reply may
// let the kernel release the handle on another thread at once.

void Filesystem::read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
    if (!handle) return read_unopened(req, ino, size, off);
    std::shared_ptr<Version> version;
    std::shared_ptr<const std::string> shared;  // keeps a reader's snapshot alive for the reply
    bool lost = false;
    if (handle->refilling.load(std::memory_order_relaxed)) settle_pages(handle);
    {
        std::lock_guard lock(handle->mutex);
        follow_shared(handle);
        version = handle->version;
        if (!version && handle->lazy && !handle->snapshot) {
            handle->snapshot = load_content(ino, handle->snapshot_digest);
            // renew_pin keeps a version that left the db for its lazy readers; null
            // only if reading it from the pin failed (logged there).
            lost = !handle->snapshot;
        }
        shared = handle->snapshot;
    }
    if (lost) return reply_error(req, {EIO, "content removed by another process before its first read, and not kept"});
    std::string copy;  // a version's bytes, which may change after the lock
    std::string_view slice;
    if (version) {
        std::lock_guard lock(version->mutex);
        const std::string_view content = version->staged.content();
        copy.assign(content.substr(std::min(static_cast<std::size_t>(off), content.size()), size));
        slice = copy;
    } else if (shared) {
        const std::string_view content = *shared;
        slice = content.substr(std::min(static_cast<std::size_t>(off), content.size()), size);
    }
    m_background.count(core::Counter::bytes_read, slice.size());
    fuse_reply_buf(req, slice.data(), slice.size());
}

void Filesystem::read_unopened(fuse_req_t req, Ino ino, size_t size, off_t off) {
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto content = txn->read(ino);
    if (!content) return reply_error(req, content.error());
    const std::string_view bytes = content->bytes();
    const std::string_view slice = bytes.substr(std::min(static_cast<std::size_t>(off), bytes.size()), size);
    m_background.count(core::Counter::bytes_read, slice.size());
    fuse_reply_buf(req, slice.data(), slice.size());  // from the map: before the snapshot ends
}

void Filesystem::write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
                       fuse_file_info* fi) {
    auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
    std::shared_ptr<Version> version;
    bool orphan = false;
    {
        std::lock_guard lock(handle->mutex);
        orphan = handle->orphan;
        if (handle->writable) version = handle->version;
    }
    core::Status s;
    if (orphan) {
        // The file is gone: like an unlinked file's, its new bytes go nowhere.
    } else if (!version) {
        s = core::fail(EBADF, "not open for writing");
    } else {
        close_page_writer(handle, false, {});  // written again after its close
        std::lock_guard lock(version->mutex);
        s = version->staged.write(static_cast<std::uint64_t>(off), {buf, size});
    }
    if (!s) return reply_error(req, s.error());
    fuse_reply_write(req, size);
}

core::Status Filesystem::publish(fuse_req_t req, Version& version) {
    if (version.ended || !version.staged.dirty()) return {};  // an unchanged file publishes nothing
    const std::uint64_t size = version.staged.content().size();
    // Make room first. If the cache cannot get under its bound (everything left is
    // pinned or being written), the writer gets ENOSPC and nothing is published.
    std::uint64_t max = 0, stored = 0;
    {
        auto txn = m_store.read();
        if (!txn) return tl::unexpected(txn.error());
        max = txn->config().max_bytes;
        stored = txn->counter(core::Counter::stored_bytes).value_or(0);
    }
    if (max && stored + size > max) {
        auto evicted = m_store.evict({.max_bytes = size > max ? 0 : max - size});
        if (!evicted) return tl::unexpected(evicted.error());
        if (!evicted->satisfied) {
            return core::fail(ENOSPC, fmt::format("cache full: {} bytes do not fit under the {} byte bound "
                                                  "(the rest is pinned or being written)", size, max));
        }
    }
    // Readers of the stored version that load it lazily (open()) may still need it.
    keep_for_readers(version.staged.ino());
    auto s = version.staged.commit(req ? origin_of(req) : core::Origin{});
    if (!s && s.error().code == ENOENT) return {};  // removed while open: its bytes go nowhere
    if (!s) return s;
    // A rewrite's pages may be cached by its own process's readers of the old version.
    // A shared version's are the page cache its handles read: nothing is stale, but
    // its attributes (times) changed.
    if (!version.shared) m_background.invalidate_inode(version.staged.ino());
    else m_background.invalidate_attr(version.staged.ino());
    m_background.check_limits();
    return {};
}

void Filesystem::flush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    // Every close() of a descriptor flushes, also a forked child closing the copy it
    // inherited (at exec, or at exit) while the opener is still writing. Only the
    // opener's close publishes here; release (the last descriptor gone) always does.
    // A process killed by a signal closes its files too: a rewriter killed mid-file
    // must not publish what it had written so far.
    auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
    if (!handle) return (void)fuse_reply_err(req, m_no_open ? ENOSYS : 0);  // read-only: never again
    const pid_t tid = fuse_req_ctx(req)->pid;
    std::shared_ptr<Version> version;
    {
        std::lock_guard lock(handle->mutex);
        if (handle->writable && !handle->killed) version = handle->version;
    }
    bool dirty = false;
    if (version) {
        std::lock_guard lock(version->mutex);
        dirty = version->staged.dirty();
    }
    core::Status s;
    if (dirty && killed_by_signal(tid)) {
        std::lock_guard lock(handle->mutex);
        handle->killed = true;
    } else if (dirty && process_of(tid) == handle->opener) {
        std::lock_guard lock(version->mutex);
        s = publish(req, *version);
    }
    if (s && version && !handle->killed) {
        core::Digest published;
        bool clean = false;
        {
            std::lock_guard lock(version->mutex);
            clean = !version->staged.dirty();
            published = version->staged.stored_digest();
        }
        if (clean) close_page_writer(handle, true, published);
    }
    if (!s) return reply_error(req, s.error());
    fuse_reply_err(req, 0);
}

void Filesystem::fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
    // fsync and fdatasync alike publish the version the handle writes (every handle's
    // writes, for the shared version); with durability=full the commit is synced.
    auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
    std::shared_ptr<Version> version;
    if (handle) {
        std::lock_guard lock(handle->mutex);
        if (handle->writable) version = handle->version;
    }
    core::Status s;
    if (version) {
        std::lock_guard lock(version->mutex);
        s = publish(req, *version);
    }
    if (s) s = m_store.sync();
    if (!s) return reply_error(req, s.error());
    fuse_reply_err(req, 0);
}

void Filesystem::release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    std::unique_ptr<FileHandle> handle(reinterpret_cast<FileHandle*>(fi->fh));
    if (!handle) return (void)fuse_reply_err(req, 0);
    // flush() published already unless a write came after it (or it failed, in which
    // case the writer was told), or its writer was killed. The last handle of a
    // version publishes it and ends its lease, before readers may use the page cache.
    if (handle->writable) leave_version(req, handle.get());
    if (handle->page_cached) leave_pages(handle.get());
    if (handle->page_writer) leave_pages_as_writer(handle.get());
    fuse_reply_err(req, 0);
}

// ---- directories ----------------------------------------------------------------

void Filesystem::opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    auto attr = txn->getattr(ino);
    if (!attr) return reply_error(req, attr.error());
    if (!attr->is_dir()) return reply_error(req, {ENOTDIR, "not a directory"});
    fi->fh = reinterpret_cast<std::uint64_t>(new DirHandle);
    if (fuse_reply_open(req, fi) != 0) delete reinterpret_cast<DirHandle*>(fi->fh);
}

void Filesystem::readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                         fuse_file_info* fi, bool plus) {
    auto* dir = reinterpret_cast<DirHandle*>(fi->fh);
    std::unique_lock lock(dir->mutex);
    auto txn = m_store.read();
    if (!txn) {
        lock.unlock();
        return reply_error(req, txn.error());
    }
    if (!dir->loaded || off == 0) {  // a rewind takes a fresh snapshot
        dir->children.clear();
        auto self_attr = txn->getattr(ino);
        if (!self_attr) {
            lock.unlock();
            return reply_error(req, self_attr.error());
        }
        dir->children.push_back({".", ino, core::FileType::directory});
        dir->children.push_back({"..", self_attr->parent, core::FileType::directory});
        auto s = txn->readdir(ino, {}, [&](const core::DirEntry& d) {
            dir->children.push_back({std::string(d.name), d.ino, d.type});
            return true;
        });
        if (!s) {
            lock.unlock();
            return reply_error(req, s.error());
        }
        dir->loaded = true;
    }
    std::vector<char> buf(size);
    std::size_t used = 0;
    for (auto i = static_cast<std::size_t>(off); i < dir->children.size(); ++i) {
        const auto& child = dir->children[i];
        const auto next = static_cast<off_t>(i + 1);
        std::size_t n = 0;
        if (plus) {
            auto attr = txn->getattr(child.ino);
            if (!attr) continue;  // removed since the snapshot
            apply_live_size(*attr);
            fuse_entry_param e{};
            if (child.name == "." || child.name == "..") {
                e.attr = to_stat(*attr);  // no entry: the kernel takes no reference on these
            } else {
                e = entry_param(*attr, attr_timeout(*attr));
            }
            n = fuse_add_direntry_plus(req, buf.data() + used, size - used, child.name.c_str(), &e, next);
            if (n <= size - used && e.ino) remember_lookup(e.ino);  // the kernel takes a reference
        } else {
            struct stat st{};
            st.st_ino = child.ino;
            st.st_mode = child.type == core::FileType::directory ? S_IFDIR
                         : child.type == core::FileType::symlink ? S_IFLNK
                                                                 : S_IFREG;
            n = fuse_add_direntry(req, buf.data() + used, size - used, child.name.c_str(), &st, next);
        }
        if (n > size - used) break;  // did not fit: the kernel asks again from `next`
        used += n;
    }
    lock.unlock();
    fuse_reply_buf(req, buf.data(), used);
}

void Filesystem::releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    delete reinterpret_cast<DirHandle*>(fi->fh);
    fuse_reply_err(req, 0);
}

void Filesystem::statfs(fuse_req_t req, fuse_ino_t) {
    struct statvfs st{};
    if (::statvfs(m_store.path().c_str(), &st) != 0) return reply_error(req, {errno, "statvfs"});
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    const std::uint64_t max = txn->config().max_bytes;
    const std::uint64_t stored = txn->counter(core::Counter::stored_bytes).value_or(0);
    const std::uint64_t files = txn->counter(core::Counter::files).value_or(0);
    const std::uint64_t block = 4096;
    const std::uint64_t disk_free = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
    std::uint64_t total = max ? max : static_cast<std::uint64_t>(st.f_blocks) * st.f_frsize;
    std::uint64_t free = max ? (stored < max ? max - stored : 0) : disk_free;
    free = std::min(free, disk_free);
    total = std::max(total, stored);
    struct statvfs out{};
    out.f_bsize = block;
    out.f_frsize = block;
    out.f_blocks = total / block;
    out.f_bfree = free / block;
    out.f_bavail = free / block;
    out.f_files = files + st.f_ffree;
    out.f_ffree = st.f_ffree;
    out.f_favail = st.f_ffree;
    out.f_namemax = core::kMaxNameLength;
    fuse_reply_statfs(req, &out);
}

// ---- the operation table -----------------------------------------------------------

const fuse_lowlevel_ops& Filesystem::operations() {
    static const fuse_lowlevel_ops ops = [] {
        fuse_lowlevel_ops t{};
        t.init = [](void* userdata, fuse_conn_info* conn) { static_cast<Filesystem*>(userdata)->init(conn); };
        t.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r)->lookup(r, p, n); };
        t.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->getattr(r, i, fi); };
        t.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* fi) {
            self(r)->setattr(r, i, a, s, fi);
        };
        t.readlink = [](fuse_req_t r, fuse_ino_t i) { self(r)->readlink(r, i); };
        t.mknod = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, dev_t d) { self(r)->mknod(r, p, n, m, d); };
        t.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) { self(r)->mkdir(r, p, n, m); };
        t.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r)->unlink(r, p, n); };
        t.rmdir = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r)->rmdir(r, p, n); };
        t.symlink = [](fuse_req_t r, const char* target, fuse_ino_t p, const char* n) { self(r)->symlink(r, target, p, n); };
        t.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn, unsigned int f) {
            self(r)->rename(r, p, n, np, nn, f);
        };
        t.link = [](fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char* nn) { self(r)->link(r, i, np, nn); };
        t.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->open(r, i, fi); };
        t.read = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) { self(r)->read(r, i, s, o, fi); };
        t.write = [](fuse_req_t r, fuse_ino_t i, const char* b, size_t s, off_t o, fuse_file_info* fi) {
            self(r)->write(r, i, b, s, o, fi);
        };
        t.flush = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->flush(r, i, fi); };
        t.release = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->release(r, i, fi); };
        t.fsync = [](fuse_req_t r, fuse_ino_t i, int d, fuse_file_info* fi) { self(r)->fsync(r, i, d, fi); };
        t.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->opendir(r, i, fi); };
        t.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) {
            self(r)->readdir(r, i, s, o, fi, false);
        };
        t.readdirplus = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) {
            self(r)->readdir(r, i, s, o, fi, true);
        };
        t.releasedir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->releasedir(r, i, fi); };
        t.fsyncdir = [](fuse_req_t r, fuse_ino_t, int, fuse_file_info*) { fuse_reply_err(r, 0); };
        t.statfs = [](fuse_req_t r, fuse_ino_t i) { self(r)->statfs(r, i); };
        t.forget = [](fuse_req_t r, fuse_ino_t i, std::uint64_t n) {
            self(r)->forget(i, n);
            fuse_reply_none(r);
        };
        t.forget_multi = [](fuse_req_t r, size_t count, fuse_forget_data* forgets) {
            for (size_t k = 0; k < count; ++k) self(r)->forget(forgets[k].ino, forgets[k].nlookup);
            fuse_reply_none(r);
        };
        t.create = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, fuse_file_info* fi) {
            self(r)->create(r, p, n, m, fi);
        };
        // No lock operations: the kernel then keeps flock() and fcntl() locks itself,
        // which is right for one mount on one machine.
        return t;
    }();
    return ops;
}

}  // namespace kcache::fsd
