// A name's and an inode's attributes: Filesystem's lookup (the lookup policy's decision,
// lookup_policy.hpp, carried out: single flight's waits, the shared tier's
// read-through), getattr, setattr and readlink handlers (filesystem.hpp).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "filesystem.hpp"
#include "kernel_attrs.hpp"
#include "lookup_policy.hpp"
#include "process.hpp"

namespace kcache::fsd {
using core::Attr;
using core::Ino;
using kernel::ns_of;
using kernel::to_stat;

void Filesystem::lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    answer_lookup(req, parent, name, m_remote != nullptr, true);
}

namespace {

// The lookup policy's view (lookup_policy.hpp) from a read transaction, single flight
// and the shared tier, for one LOOKUP.
class LookupFromDb final : public LookupView {
  public:
    LookupFromDb(const core::ReadTxn& txn, SingleFlight& flights, RemoteTier* remote,
                 const std::atomic<std::int64_t>& no_flights_until_ns, fuse_req_t req, Ino parent,
                 const char* name)
        : m_txn(txn),
          m_flights(flights),
          m_remote(remote),
          m_no_flights_until_ns(no_flights_until_ns),
          m_tid(fuse_req_ctx(req)->pid),
          m_parent(parent),
          m_name(name) {}

    core::Result<Attr> lookup() override { return m_txn.lookup(m_parent, m_name); }
    std::optional<SingleFlight::Awaited> retrying(Ino dir) override {
        return m_flights.retrying(m_tid, dir);
    }
    core::Result<Attr> parent() override { return m_txn.getattr(m_parent); }
    core::Result<core::EntryInfo> entry(Ino entry) override { return m_txn.entry(entry); }
    bool filling(Ino entry) override { return m_flights.active(entry); }
    bool just_taken_over() override {
        return core::steady_ns() < m_no_flights_until_ns.load(std::memory_order_relaxed);
    }
    bool retried() override { return m_flights.retried(m_tid, m_parent, m_name); }
    bool retry_first(Ino entry) override {
        SingleFlight::Awaited awaited{m_parent, m_name, entry, process_of(m_tid)};
        return m_flights.retry_first(m_tid, awaited);
    }
    RemoteTier::Found find() override { return m_remote->find(m_txn, m_parent, m_name); }

  private:
    const core::ReadTxn& m_txn;
    SingleFlight& m_flights;
    RemoteTier* m_remote;
    const std::atomic<std::int64_t>& m_no_flights_until_ns;
    const pid_t m_tid;
    const Ino m_parent;
    const char* m_name;
};

}  // namespace

// Carries out the lookup policy's decision (lookup_policy.hpp says what and why).
void Filesystem::answer_lookup(fuse_req_t req, Ino parent, const char* name, bool read_through,
                               bool may_wait) {
    using Kind = LookupAction::Kind;
    auto txn = m_store.read();
    if (!txn) return reply_error(req, txn.error());
    LookupAction action;
    {
        LookupFromDb view(*txn, m_flights, m_remote, m_no_flights_until_ns, req, parent, name);
        action = decide_lookup(
            view, {parent, name, read_through, may_wait, m_flights.enabled(), m_remote != nullptr});
    }
    switch (action.kind) {  // answered with the snapshot held, as it was read
        case Kind::found:
            return reply_entry(req, action.attr);
        case Kind::error:
            return reply_error(req, action.error);
        case Kind::estale:
            fuse_reply_err(req, ESTALE);
            return;
        default:
            break;
    }
    txn = core::fail(ENOENT, "");  // no snapshot held while waiting
    switch (action.kind) {
        case Kind::wait: {
            auto answer = [this, req, parent, n = std::string(name),
                           read_through](SingleFlight::End end) {
                if (end == SingleFlight::End::interrupted) {
                    fuse_reply_err(req, EINTR);
                    return;
                }
                if (end == SingleFlight::End::timed_out)
                    m_counters.count(core::Counter::single_flight_timeouts);
                answer_lookup(req, parent, n.c_str(), read_through, false);
            };
            if (m_flights.wait(req, std::move(action.awaited), std::move(answer))) {
                m_counters.count(core::Counter::single_flight_waits);
                return;
            }
            return answer_lookup(req, parent, name, read_through, false);  // cannot wait
        }
        case Kind::make_container:
            return make_container(req, parent, name);
        case Kind::fetch:
        case Kind::containers: {
            const bool containers = action.kind == Kind::containers;
            auto again = [this, req, parent, n = std::string(name), containers] {
                // After the containers were read: a container or none; after a
                // read-through: the entry or a miss. Never waits twice.
                answer_lookup(req, parent, n.c_str(), containers, false);
            };
            if (containers)
                m_remote->when_containers_known(std::move(again));
            else
                m_remote->read_through(action.remote_name, std::move(again));
            return;
        }
        default:
            break;
    }
    m_counters.count(core::Counter::negative_lookups);
    fuse_entry_param e{};  // ino 0: a negative entry the kernel may cache
    e.entry_timeout = action.negative_timeout;
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
        m_notifier.invalidate_inode(ino);
    }
    if (version_size)
        result.size = *version_size;
    else
        m_versions.apply_live_size(result);
    // The reply updates the caller's view; the notification reaches answers to
    // requests that were in flight meanwhile (the kernel drops those it overtakes).
    m_notifier.invalidate_attr(ino);
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
