// A name's and an inode's attributes: Filesystem's lookup (single flight's waits, the
// shared tier's read-through), getattr, setattr and readlink handlers (filesystem.hpp).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "filesystem.hpp"
#include "kernel_attrs.hpp"
#include "process.hpp"

namespace kcache::fsd {
using core::Attr;
using core::Ino;
using kernel::ns_of;
using kernel::to_stat;

void Filesystem::lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    answer_lookup(req, parent, name, m_remote != nullptr, true);
}

bool Filesystem::first_miss(fuse_req_t req, const core::ReadTxn& txn, Ino parent, const char* name,
                            double* negative_timeout) {
    auto dir = txn.getattr(parent);
    if (!dir || !dir->is_dir() || dir->entry == 0 || dir->bookkeeping) return false;
    if (core::is_bookkeeping_name(name)) return false;
    const bool active = m_flights.active(dir->entry);
    if (!active) {
        auto entry = txn.entry(dir->entry);
        if (!entry || entry->kind != core::EntryKind::node) return false;
        if (!entry->populated) *negative_timeout = 0;
        return false;
    }
    *negative_timeout = 0;
    // Just after a takeover a walk may be the retry of an ESTALE the dead daemon gave
    // (step 1), which this one does not know of: a second ESTALE would reach the caller.
    if (core::steady_ns() < m_no_flights_until_ns.load(std::memory_order_relaxed)) return false;
    const pid_t tid = fuse_req_ctx(req)->pid;
    if (m_flights.retried(tid, parent, name)) return false;  // step 3: as it stands
    SingleFlight::Awaited awaited{parent, name, dir->entry, process_of(tid)};
    if (!m_flights.retry_first(tid, awaited)) return false;
    // Step 1: the kernel holds this directory's lock for this LOOKUP; ESTALE lets it go,
    // and the kernel retries the walk, whose lookup of the directory waits (step 2).
    fuse_reply_err(req, ESTALE);
    return true;
}

void Filesystem::answer_lookup(fuse_req_t req, Ino parent, const char* name, bool read_through,
                               bool may_wait) {
    double negative_timeout = kernel::kNegativeTimeout;
    {
        auto txn = m_store.read();
        if (!txn) return reply_error(req, txn.error());
        auto attr = txn->lookup(parent, name);
        if (attr && may_wait && attr->is_dir() && m_flights.enabled()) {
            // Single flight, step 2: the retried walk of a thread answered ESTALE looks
            // up the directory of the name it missed, holding no directory lock: wait.
            if (auto awaited = m_flights.retrying(fuse_req_ctx(req)->pid, attr->ino)) {
                txn = core::fail(ENOENT, "");  // no snapshot held while waiting
                auto answer = [this, req, parent, n = std::string(name),
                               read_through](SingleFlight::End end) {
                    if (end == SingleFlight::End::interrupted) {
                        fuse_reply_err(req, EINTR);
                        return;
                    }
                    if (end == SingleFlight::End::timed_out)
                        m_background.count(core::Counter::single_flight_timeouts);
                    answer_lookup(req, parent, n.c_str(), read_through, false);
                };
                if (m_flights.wait(req, std::move(*awaited), std::move(answer))) {
                    m_background.count(core::Counter::single_flight_waits);
                    return;
                }
                return answer_lookup(req, parent, name, read_through, false);  // cannot wait
            }
        }
        if (attr) return reply_entry(req, *attr);
        if (attr.error().code != ENOENT) return reply_error(req, attr.error());
        if (m_flights.enabled() && first_miss(req, *txn, parent, name, &negative_timeout)) return;
        // The shared tier (remote_tier.hpp): a name that could be an entry is fetched
        // on a tier thread, which answers this request; a container the tier holds
        // entries below is made here, so the compiler's walk goes on to its entry. The
        // kernel keeps a negative answer briefly, so what another node publishes is found.
        if (m_remote) {
            using Kind = RemoteTier::Found::Kind;
            auto found = m_remote->find(*txn, parent, name);
            if (found.may_appear)
                negative_timeout = std::min(negative_timeout, RemoteTier::kNegativeTimeoutS);
            if (found.kind == Kind::container) {
                txn = core::fail(ENOENT, "");
                return make_container(req, parent, name);
            }
            if (read_through && (found.kind == Kind::entry || found.kind == Kind::unknown)) {
                txn = core::fail(ENOENT, "");  // no snapshot held while waiting
                auto again = [this, req, parent, n = std::string(name), kind = found.kind] {
                    // After the containers were read: a container or none; after a
                    // read-through: the entry or a miss. Never waits twice.
                    answer_lookup(req, parent, n.c_str(), kind == Kind::unknown, false);
                };
                if (found.kind == Kind::entry)
                    m_remote->read_through(found.name, std::move(again));
                else
                    m_remote->when_containers_known(std::move(again));
                return;
            }
        }
    }
    m_background.count(core::Counter::negative_lookups);
    fuse_entry_param e{};  // ino 0: a negative entry the kernel may cache
    e.entry_timeout = negative_timeout;
    fuse_reply_entry(req, &e);
}

void Filesystem::getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    FileHandle* handle = fi && fi->fh ? m_handles.file(fi->fh) : nullptr;
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
            MutexLock lock(handle->mutex);
            follow_shared(handle);
            version = handle->version;
            snapshot = handle->snapshot;
            own_view = version || (!handle->orphan && handle->snapshot_digest != attr->digest);
            if (handle->lazy && !snapshot)
                size = handle->attr.size;  // its version's, not yet loaded
        }
        if (!version) version = m_versions.shared(ino);
        if (version) {
            MutexLock lock(version->mutex);
            size = version->staged.size();
        }
        if (!size) size = m_pages.size(ino);
        if (!size && snapshot) size = snapshot->size();
        if (!size)
            size = m_versions.rewrite_size(
                ino, process_of(fuse_req_ctx(req)->pid));  // stat by path by a rewriter
        if (size) attr->size = *size;
    }
    struct stat st = to_stat(*attr);
    fuse_reply_attr(req, &st, own_view ? 0 : attr_timeout(*attr));
}

core::Result<std::optional<std::uint64_t>> Filesystem::truncate_version(Ino ino, FileHandle* handle,
                                                                        std::uint64_t size,
                                                                        int& to_set) {
    if (handle) {
        std::shared_ptr<Version> version;
        {
            MutexLock lock(handle->mutex);
            if (handle->writable) version = handle->version;
        }
        if (!version) return std::nullopt;
        // ftruncate of a file being written: part of its version
        MutexLock lock(version->mutex);
        if (auto s = version->staged.truncate(size); !s) return tl::unexpected(s.error());
        const std::uint64_t version_size = version->staged.size();
        to_set &= ~FUSE_SET_ATTR_SIZE;
        m_handles.set_unpublished(handle->fh, true);
        return version_size;
    }
    // truncate by path: the shared version is the file (stored when it is
    // published); rewrites are cut too.
    std::uint64_t shared_size = 0;
    if (!KCACHE_TRY(m_versions.truncate(ino, size, &shared_size))) return std::nullopt;
    to_set &= ~FUSE_SET_ATTR_SIZE;
    return shared_size;
}

void Filesystem::setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                         fuse_file_info* fi) {
    FileHandle* handle = fi && fi->fh ? m_handles.file(fi->fh) : nullptr;
    std::optional<Dirtying> dirtying;
    if ((to_set & FUSE_SET_ATTR_SIZE) && handle && handle->writable) {
        dirtying.emplace(*this);
        if (dirtying->refused()) return;  // handing over: the successor answers it
    }
    std::optional<std::uint64_t> version_size;  // the size a truncated version now has
    if ((to_set & FUSE_SET_ATTR_SIZE) && handle && handle->lost)
        return reply_error(req, {EIO, "this open file was lost with a daemon"});
    if ((to_set & FUSE_SET_ATTR_SIZE) &&
        static_cast<std::uint64_t>(attr->st_size) > m_options.max_file_size) {
        return reply_error(req, {EFBIG, "file size over --max-file-size"});
    }
    if (to_set & FUSE_SET_ATTR_SIZE) {
        auto cut = truncate_version(ino, handle, static_cast<std::uint64_t>(attr->st_size), to_set);
        if (!cut) return reply_error(req, cut.error());
        version_size = *cut;
    }
    core::SetAttr changes;
    if (to_set & FUSE_SET_ATTR_MODE) changes.mode = attr->st_mode;
    if (to_set & FUSE_SET_ATTR_UID) changes.uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID) changes.gid = attr->st_gid;
    if (to_set & FUSE_SET_ATTR_SIZE) changes.size = static_cast<std::uint64_t>(attr->st_size);
    const std::int64_t now = m_store.now_ns();
    if (to_set & FUSE_SET_ATTR_ATIME_NOW)
        changes.atime_ns = now;
    else if (to_set & FUSE_SET_ATTR_ATIME)
        changes.atime_ns = ns_of(attr->st_atim);
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
        changes.mtime_ns = now;
    else if (to_set & FUSE_SET_ATTR_MTIME)
        changes.mtime_ns = ns_of(attr->st_mtim);
    Attr result;
    auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
        auto a = KCACHE_TRY(txn.setattr(ino, changes));
        result = a;
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
        (void)m_versions.truncate(ino, *changes.size, &unused);
        // A reader of the old version whose RELEASE is still in flight (or one still
        // reading) must not make getattr tell its version's size from now on.
        m_pages.resize(ino, *changes.size);
        m_background.invalidate_inode(ino);
    }
    if (version_size)
        result.size = *version_size;
    else
        m_versions.apply_live_size(result);
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
}  // namespace kcache::fsd
