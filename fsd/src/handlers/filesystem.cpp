#include "filesystem.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <vector>

#include "kcache/core/holds.hpp"
#include "kernel_attrs.hpp"
#include "log.hpp"
#include "process.hpp"
#include "resend.hpp"

namespace kcache::fsd {
using core::Attr;
using core::Ino;
using kernel::ns_of;
using kernel::to_stat;

namespace {

Filesystem* self(fuse_req_t req) {
    return static_cast<Filesystem*>(fuse_req_userdata(req));
}

}  // namespace

namespace {

std::unique_ptr<StateFile> private_state(StateFile* given) {
    if (given) return nullptr;
    auto state = StateFile::map(-1);
    if (!state) throw std::runtime_error(state.error().message);
    return std::move(*state);
}

}  // namespace

Filesystem::Filesystem(core::Store& store, const Options& options, StateFile* state,
                       const Resend* resend)
    : m_store(store),
      m_options(options),
      m_background(store, options.sync_interval_s),
      m_notifier(m_background.notifier()),
      m_counters(m_background.counters()),
      m_upkeep(m_background.upkeep()),
      m_spills(options.read_only || options.db.empty() ? "" : options.db + "/spill",
               state ? state->header().daemons.load() : 0),
      m_versions(store, options.max_file_size, m_inodes, m_spills),
      m_pages(m_inodes),
      m_lookups(m_inodes),
      m_contents(store, m_pages, m_lookups),
      m_holds(store, m_inodes),
      m_hits(m_counters),
      m_flights(store, std::chrono::milliseconds(options.single_flight_ms)),
      m_own_state(private_state(state)),
      m_state(state ? *state : *m_own_state),
      m_handles(m_state),
      m_own_resend(resend ? nullptr : std::make_unique<Resend>(nullptr)),
      m_resend(resend ? *resend : *m_own_resend) {
    m_hits.remember_in(HitPairs(m_state.hit_pairs(), kHitPairSlots));
    m_handles.on_rebuild([this](HandleRecord& r) { return rebuild_file(r); },
                         [](const HandleRecord&) { return new DirHandle; });
    // A fresh mount: no handle of a dead mount can be used again, nor its spill files.
    if (!m_state.inherited()) m_spills.sweep({});
}

Filesystem::Dirtying::Dirtying(Filesystem& fs) : m_fs(fs) {
    MutexLock lock(fs.m_handover_mutex);
    if (fs.m_handing_over) return;
    ++fs.m_dirtying;
    m_entered = true;
}

Filesystem::Dirtying::~Dirtying() {
    if (!m_entered) return;
    MutexLock lock(m_fs.m_handover_mutex);
    --m_fs.m_dirtying;
}

bool Filesystem::try_hand_over() {
    MutexLock lock(m_handover_mutex);
    if (m_dirtying > 0 || m_handles.unpublished() > 0) return false;
    m_handing_over = true;
    return true;
}

std::size_t Filesystem::adopt_handles() {
    // The retries of walks a dead daemon answered ESTALE (single flight, step 1) come in
    // at once; a few seconds covers them.
    m_no_flights_until_ns = core::steady_ns() + std::int64_t{5'000'000'000} +
                            2 * static_cast<std::int64_t>(m_options.single_flight_ms) * 1'000'000;
    m_handles.rebuild_inherited([&](const HandleRecord& r) {
        return !r.writable || (r.version && m_spills.exists(r.ino, r.version & ~kRewrite));
    });
    m_holds.adopt();
    // The spill files of inherited writers stay until their version ends; those no
    // writer names go.
    std::set<std::pair<Ino, std::uint32_t>> writers;
    const HandleRecord* records = m_state.records();
    for (std::uint32_t s = 0; s < kHandleSlots; ++s) {
        const HandleRecord& r = records[s];
        if (r.kind.load(std::memory_order_acquire) == HandleKind::file && r.writable && r.version)
            writers.emplace(r.ino, r.version & ~kRewrite);
    }
    m_spills.sweep(writers);
    return m_handles.inherited();
}

Filesystem::~Filesystem() {
    m_flights.stop();  // its answers look up the db and reply
    m_pages.stop();    // the writer gate thread: its replies may publish
    m_background.stop();
}

void Filesystem::start(fuse_session* session) {
    // Also under --read-only (init() has not run yet), where no reader is lazy: the
    // scan is then empty, and the pin one more snapshot.
    m_upkeep.on_period([this] { m_contents.renew_pin(); });
    m_background.start(session);
    m_pages.start();
    m_flights.start();
}

// ---- replies ------------------------------------------------------------------------

void Filesystem::reply_error(fuse_req_t req, const core::Error& error) {
    if (error.code == core::kCorruptDb && !m_options.read_only) db_corrupt(error);
    if (error.code == core::kDamagedContent || error.code == core::kCorruptDb) {
        // A caller that did not handle the damage itself (damaged_content): the kernel
        // and the compiler get EIO, the log the message.
        return reply_error(req, {EIO, error.message});
    }
    switch (error.code) {
        case ENOSPC:
            m_counters.count(core::Counter::errors_nospc);
            break;
        case EIO:
            m_counters.count(core::Counter::errors_io);
            break;
        case EFBIG:
        case ENOMEM:
            m_counters.count(core::Counter::errors_other);
            break;
        default:
            break;  // ENOENT, EEXIST, ENOTEMPTY ... are answers, not failures
    }
    if (error.code == EIO || error.code == ENOSPC) {
        log::error("{}", error.message);
    }
    fuse_reply_err(req, error.code > 0 ? error.code : EIO);
}

core::Error Filesystem::damaged_content(Ino ino, const core::Error& error) {
    std::string path = fmt::format("inode {}", ino);
    std::optional<core::EntryInfo> entry;
    core::Digest digest;
    if (auto txn = m_store.read()) {
        if (auto p = txn->path(ino)) path = "/" + *p;
        auto attr = txn->getattr(ino);
        if (attr) digest = attr->digest;
        if (attr && attr->entry) {
            if (auto e = txn->entry(attr->entry)) entry = std::move(*e);
        }
    }
    m_counters.count(core::Counter::damaged_blobs);
    if (!entry) {
        log::error(
            "DAMAGED CONTENT in {} (in no entry): {}; its reads fail with EIO until it "
            "is rewritten or removed",
            path, error.message);
        return {EIO, error.message};
    }
    auto evicted = m_store.update([&](core::WriteTxn& txn) { return txn.evict_entry(entry->ino); });
    if (!evicted && evicted.error().code == ENOENT) return {ESTALE, "evicted: damaged content"};
    if (!evicted && evicted.error().code == core::kCorruptDb && !m_options.read_only)
        db_corrupt(evicted.error());
    if (!evicted) {
        log::error(
            "DAMAGED CONTENT in {} (entry {}): {}; the entry is kept ({}): its reads fail "
            "with EIO until `kcache evict` removes it",
            path, entry->name, error.message, evicted.error().message);
        return {EIO, error.message};
    }
    // The blob may be shared (identical content is stored once): every entry holding it
    // is damaged too, and a compiler's new copy of the content would be deduplicated onto
    // it. So those entries go as well, and with the last reference the blob. A scan of
    // every entry's files: damage is rare, a loop of compiles onto a damaged blob is not.
    std::vector<Ino> sharers;
    if (auto txn = m_store.read();
        txn && !digest.empty() && txn->has_blob(digest).value_or(false)) {
        (void)txn->for_each_entry([&](const core::EntryInfo& e) {
            (void)txn->for_each_entry_file(e, [&](const core::EntryFile& f) {
                if (!f.attr.is_regular() || !(f.attr.digest == digest)) return true;
                sharers.push_back(e.ino);
                return false;
            });
            return true;
        });
    }
    std::size_t also = 0;
    for (const Ino sharer : sharers) {
        if (m_store.update([&](core::WriteTxn& txn) { return txn.evict_entry(sharer); })) ++also;
    }
    log::error(
        "DAMAGED CONTENT in {} (entry {}): {}; the entry was evicted{}: its compiler "
        "compiles it again. `kcache verify` lists any other damage",
        path, entry->name, error.message,
        also ? fmt::format(", and {} more that held the same content", also) : "");
    return {ESTALE, "evicted: damaged content"};
}

void Filesystem::db_corrupt(const core::Error& error) {
    log::error(
        "DB CORRUPT: {}; the daemon ends so that its successor sets {} aside and serves a "
        "fresh db",
        error.message, m_store.path());
    const std::string marker = m_store.path() + "/" + kCorruptMarker;
    if (FILE* f = std::fopen(marker.c_str(), "w")) {
        std::fputs(error.message.c_str(), f);
        std::fclose(f);
    }
    std::_Exit(kCorruptExit);
}

void Filesystem::reply_entry(fuse_req_t req, const Attr& stored) {
    Attr attr = stored;
    m_versions.apply_live_size(attr);
    const fuse_entry_param e = kernel::entry_param(attr, attr_timeout(attr));
    m_lookups.remember(attr.ino);
    if (fuse_reply_entry(req, &e) != 0) forget(attr.ino, 1);  // the kernel never got it
}

// ---- lookup references and orphans ------------------------------------------------

void Filesystem::forget(fuse_ino_t ino, std::uint64_t count) {
    // The last reference to an orphan: no handle of it is open either (each holds one).
    if (auto held = m_lookups.forget(ino, count)) m_holds.release(*held, 1);
}

std::optional<std::pair<Ino, Orphan>> Filesystem::orphan_of(const core::ReadTxn& txn, Ino parent,
                                                            const char* name) {
    auto attr = txn.lookup(parent, name);
    // A file that keeps other names is no orphan (nodes.cpp: links).
    if (!attr || !attr->is_regular() || attr->nlink > 1) return std::nullopt;
    if (!m_lookups.known(attr->ino)) return std::nullopt;  // the kernel does not know it
    auto content = txn.read(attr->ino);
    if (!content) return std::nullopt;
    Orphan orphan{*attr, m_contents.snapshot(attr->digest, std::move(*content))};
    orphan.attr.nlink = 0;
    return std::pair{attr->ino, std::move(orphan)};
}

core::Status Filesystem::remove_keeping_orphan(
    Ino parent, const char* name, const std::function<core::Status(core::WriteTxn&)>& remove) {
    auto txn = KCACHE_TRY(m_store.write());
    auto orphan = orphan_of(txn, parent, name);
    // Its blob stays in the db while the orphan lives (core/holds.hpp), held in this
    // transaction: a daemon that dies after the commit leaves it to its successor's
    // readers. Only removals of a file the kernel knows pay for it.
    if (orphan && !orphan->second.attr.digest.empty()) {
        if (auto s = core::hold_blob(txn, orphan->second.attr.digest); !s) return s;
        orphan->second.held = true;
    }
    if (auto s = remove(txn); !s) return s;
    // The orphan must exist before the removal is visible: the kernel may open the
    // old inode concurrently (an open does not wait for a rename of its name).
    if (orphan && !m_lookups.adopt(orphan->first, orphan->second)) {
        // The kernel forgot it meanwhile: no orphan, no hold.
        if (orphan->second.held) {
            if (auto s = core::release_hold(txn, orphan->second.attr.digest); !s) return s;
        }
        orphan.reset();
    }
    auto s = txn.commit();
    if (!s && orphan)
        m_lookups.disown(orphan->first);
    else if (orphan)
        m_notifier.invalidate_attr(orphan->first);  // nlink 0 now
    return s;
}

std::optional<Attr> Filesystem::removed_attr(Ino ino, FileHandle* handle) {
    std::optional<Attr> attr;
    if (handle)
        attr = handle->attr;
    else if (auto orphan = m_lookups.find_orphan(ino))
        attr = orphan->attr;
    if (attr) attr->nlink = 0;
    return attr;
}

double Filesystem::attr_timeout(const Attr& a) {
    if (!a.is_regular()) return kernel::kDirAttrTimeout;
    if (a.nlink == 0) return 0;               // removed: answered from a handle or an orphan
    if (m_versions.at_work(a.ino)) return 0;  // a writer at work: the answer depends on the caller
    return m_pages.tell_attr(a) ? kernel::kFileAttrTimeout : 0;
}

// ---- init (each group of handlers has its own file: docs/architecture.md) ----------

void Filesystem::init(fuse_conn_info* conn) {
    // Atomic O_TRUNC: open() must know O_TRUNC to apply THE RULE (a rewrite or the
    // shared version). The kernel then sets the inode's size to 0 after such an open;
    // readers of the old version that it would cut short do not read through the
    // page cache meanwhile (PageCache: admit_writer, enter), and the next getattr answers
    // the size each one should see.
    if (!(conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)) {
        log::warning(
            "the kernel's FUSE lacks atomic O_TRUNC: an O_TRUNC open shares the file "
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

// ---- the operation table -----------------------------------------------------------

const fuse_lowlevel_ops& Filesystem::operations() {
    static const fuse_lowlevel_ops ops = [] {
        fuse_lowlevel_ops t{};
        t.init = [](void* userdata, fuse_conn_info* conn) {
            static_cast<Filesystem*>(userdata)->init(conn);
        };
        t.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r)->lookup(r, p, n); };
        t.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
            self(r)->getattr(r, i, fi);
        };
        t.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* fi) {
            self(r)->setattr(r, i, a, s, fi);
        };
        t.readlink = [](fuse_req_t r, fuse_ino_t i) { self(r)->readlink(r, i); };
        t.mknod = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, dev_t d) {
            self(r)->mknod(r, p, n, m, d);
        };
        t.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) {
            self(r)->mkdir(r, p, n, m);
        };
        t.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r)->unlink(r, p, n); };
        t.rmdir = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r)->rmdir(r, p, n); };
        t.symlink = [](fuse_req_t r, const char* target, fuse_ino_t p, const char* n) {
            self(r)->symlink(r, target, p, n);
        };
        t.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn,
                      unsigned int f) { self(r)->rename(r, p, n, np, nn, f); };
        t.link = [](fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char* nn) {
            self(r)->link(r, i, np, nn);
        };
        t.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->open(r, i, fi); };
        t.read = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) {
            self(r)->read(r, i, s, o, fi);
        };
        t.write = [](fuse_req_t r, fuse_ino_t i, const char* b, size_t s, off_t o,
                     fuse_file_info* fi) { self(r)->write(r, i, b, s, o, fi); };
        t.flush = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r)->flush(r, i, fi); };
        t.release = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
            self(r)->release(r, i, fi);
        };
        t.fsync = [](fuse_req_t r, fuse_ino_t i, int d, fuse_file_info* fi) {
            self(r)->fsync(r, i, d, fi);
        };
        t.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
            self(r)->opendir(r, i, fi);
        };
        t.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) {
            self(r)->readdir(r, i, s, o, fi, false);
        };
        t.readdirplus = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) {
            self(r)->readdir(r, i, s, o, fi, true);
        };
        t.releasedir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
            self(r)->releasedir(r, i, fi);
        };
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
        t.setxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, const char* v, size_t s, int f) {
            self(r)->setxattr(r, i, n, v, s, f);
        };
        t.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) {
            self(r)->getxattr(r, i, n, s);
        };
        t.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { self(r)->listxattr(r, i, s); };
        t.removexattr = [](fuse_req_t r, fuse_ino_t i, const char* n) {
            self(r)->removexattr(r, i, n);
        };
        t.fallocate = [](fuse_req_t r, fuse_ino_t i, int m, off_t o, off_t l, fuse_file_info* fi) {
            self(r)->fallocate(r, i, m, o, l, fi);
        };
        // No lock operations: the kernel then keeps flock() and fcntl() locks itself,
        // which is right for one mount on one machine.
        return t;
    }();
    return ops;
}

}  // namespace kcache::fsd
