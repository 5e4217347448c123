#include "page_cache.hpp"

#include <algorithm>

#include "handles.hpp"
#include "log.hpp"
#include "process.hpp"

namespace kcache::fsd {
using core::Ino;

PageState* PageCache::find(Ino ino) {
    Inode* inode = m_inodes.find(ino);
    return inode && inode->pages ? &*inode->pages : nullptr;
}

PageState& PageCache::at(Ino ino) {
    Inode& inode = m_inodes.at(ino);
    if (!inode.pages) inode.pages.emplace();
    return *inode.pages;
}

void PageCache::start() {
    m_writer_gate = std::thread([this] { run_writer_gate(); });
}

void PageCache::stop() {
    {
        MutexLock lock(m_inodes.mutex);
        m_writer_gate_stop = true;
    }
    m_writer_gate_wake.notify_all();
    if (m_writer_gate.joinable()) m_writer_gate.join();
}

PageCache::Use PageCache::enter(FileHandle* reader, const core::Digest& digest, std::uint64_t size,
                                bool* stale_attr) {
    MutexLock lock(m_inodes.mutex);
    Inode& inode = m_inodes.at(reader->ino);
    bool inserted = !inode.pages;
    if (inserted) {
        inode.pages.emplace();
        inode.pages->digest = digest;
        inode.pages->size = size;
    }
    PageState& state = *inode.pages;
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
    // A writer counts itself in (enter_as_writer) under the same lock: a reader
    // either sees it here or is among the readers it waits for.
    // A writer that closed and published what the reader opens is only waiting for its
    // RELEASE (sent after close() returns): the reader refills from the db below, as
    // after the release, and may map the file shared (direct_io could not).
    const bool closed =
        state.writers == 1 && state.closed_writers == 1 && state.closed_digest == digest;
    if (state.writers > 0 && !closed) return Use::direct;
    // Followers of a shared version read what its writers left in the pages, of no
    // version this reader knows.
    if (!state.followers.empty()) return Use::direct;
    Use use = inserted ? Use::refill : Use::keep;
    if (!inserted && state.digest != digest) {
        // Another version's reader still fills the cache: mixing would tear both.
        if (!state.readers.empty()) return Use::direct;
        state.digest = digest;
        state.size = size;
        state.kept.reset();
        use = Use::refill;  // the kernel drops the other version's pages first
    }
    if (use == Use::refill) state.settled = false;
    // The kernel drops the old pages when the refilling open completes, after this
    // reply: until one of its READs shows it did, keeping them could serve another
    // version's pages (a writer's, say) to this reader.
    if (!state.settled) use = Use::refill;
    state.readers.push_back(reader);
    reader->page_cached = true;
    reader->refilling = use == Use::refill;
    if (use == Use::keep) {
        // Counted before open() checks the pin (Contents::pinned), so renew_pin sees it.
        reader->lazy = true;
        if (state.lazy++ == 0) m_lazy_inodes.insert(reader->ino);
    }
    return use;
}

void PageCache::settle(FileHandle* reader) {
    MutexLock lock(m_inodes.mutex);
    reader->refilling = false;
    if (PageState* state = find(reader->ino);
        state && state->digest == reader->snapshot_digest &&
        std::find(state->readers.begin(), state->readers.end(), reader) != state->readers.end()) {
        state->settled = true;
    }
}

void PageCache::enter_as_follower(FileHandle* reader, const std::shared_ptr<Version>& version) {
    MutexLock lock(m_inodes.mutex);
    at(reader->ino).followers.push_back(reader);
    reader->page_cached = true;
    reader->followed = version;
}

void PageCache::leave(FileHandle* reader) {
    std::vector<std::function<void()>> admitted;
    {
        MutexLock lock(m_inodes.mutex);
        if (PageState* state = find(reader->ino)) {
            std::erase(state->readers, reader);
            std::erase(state->followers, reader);
            if (reader->lazy && --state->lazy == 0) m_lazy_inodes.erase(reader->ino);
            if (state->readers.empty()) state->kept.reset();
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
    for (auto& reply : admitted) reply();  // no lock held: a reply may discard its open
}

std::vector<std::pair<FileHandle*, pid_t>> PageCache::enter_as_writer(
    FileHandle* writer, const std::shared_ptr<Version>& version) {
    MutexLock lock(m_inodes.mutex);
    PageState& state = at(writer->ino);
    ++state.writers;
    // Writers write through the page cache: once they are gone it holds no known
    // version (several rewrites may have mixed theirs), so the next reader refills it.
    state.digest = {};
    state.settled = false;
    writer->page_writer = true;
    std::vector<std::pair<FileHandle*, pid_t>> readers;
    for (FileHandle* r : state.readers) readers.emplace_back(r, r->reader_tid);
    // Followers of another shared version than the writer's (one that ended): the
    // writer's pages would be read as theirs. Those of its own version read what it writes.
    for (FileHandle* r : state.followers) {
        if (r->followed.lock() != version) readers.emplace_back(r, r->reader_tid);
    }
    return readers;
}

void PageCache::leave_as_writer(FileHandle* writer) {
    MutexLock lock(m_inodes.mutex);
    if (PageState* state = find(writer->ino)) {
        if (state->writers > 0) --state->writers;
        if (writer->closed_clean && state->closed_writers > 0) --state->closed_writers;
    }
    writer->page_writer = false;
    writer->closed_clean = false;
}

void PageCache::close_writer(FileHandle* writer, bool clean, const core::Digest& published) {
    MutexLock lock(m_inodes.mutex);
    if (!writer->page_writer || writer->closed_clean == clean) return;
    PageState* state = find(writer->ino);
    if (!state) return;
    writer->closed_clean = clean;
    if (clean) {
        ++state->closed_writers;
        state->closed_digest = published;
    } else if (state->closed_writers > 0) {
        --state->closed_writers;
    }
}

void PageCache::admit_writer(FileHandle* writer, const std::shared_ptr<Version>& version,
                             std::function<void()> reply) {
    const auto readers = enter_as_writer(writer, version);
    // The writer's own process reading the file it rewrites races with itself, as
    // on a local disk: waiting for it would only stall it. (process_of reads /proc:
    // not under the lock.)
    std::vector<FileHandle*> others;
    for (auto [reader, tid] : readers) {
        if (process_of(tid) != writer->opener) others.push_back(reader);
    }
    if (!others.empty()) {
        MutexLock lock(m_inodes.mutex);
        // Some may have closed meanwhile; none entered (the writer is registered).
        const PageState* state = find(writer->ino);
        std::erase_if(others, [&](FileHandle* r) {
            if (!state) return true;
            const auto& still = state->readers;
            const auto& following = state->followers;
            return std::find(still.begin(), still.end(), r) == still.end() &&
                   std::find(following.begin(), following.end(), r) == following.end();
        });
        if (!others.empty()) {
            m_waiting_writers.push_back({writer, std::move(others),
                                         std::chrono::steady_clock::now() + kWriterWait,
                                         std::move(reply)});
            m_writer_gate_wake.notify_all();
            return;
        }
    }
    reply();
}

void PageCache::run_writer_gate() {
    MutexLock lock(m_inodes.mutex);
    while (!m_writer_gate_stop) {
        auto next = std::chrono::steady_clock::time_point::max();
        for (const WaitingWriter& w : m_waiting_writers) next = std::min(next, w.deadline);
        m_writer_gate_wake.wait_until(m_inodes.mutex, next);
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
            log::warning(
                "a writer of inode {} waited {} s for {} reader(s) of the old content to "
                "close; it goes ahead (those readers may read past their end)",
                w.writer->ino,
                std::chrono::duration_cast<std::chrono::seconds>(kWriterWait).count(),
                w.readers.size());
            w.reply();
        }
        lock.lock();
    }
}

std::optional<std::uint64_t> PageCache::size(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    const PageState* state = find(ino);
    if (!state || state->readers.empty()) return std::nullopt;
    return state->size;
}

void PageCache::resize(Ino ino, std::uint64_t size) {
    MutexLock lock(m_inodes.mutex);
    if (PageState* state = find(ino)) state->size = size;
}

bool PageCache::tell_attr(const core::Attr& a) {
    MutexLock lock(m_inodes.mutex);
    PageState& state = at(a.ino);  // an empty state is one of no known version (enter)
    if (state.writers > 0 || (!state.readers.empty() && state.digest != a.digest)) return false;
    state.told = a.digest;
    return true;
}

std::optional<core::Digest> PageCache::unkept_readers(Ino ino) {
    MutexLock lock(m_inodes.mutex);
    const PageState* state = find(ino);
    if (!state || state->readers.empty() || state->kept) return std::nullopt;
    return state->digest;
}

void PageCache::keep(Ino ino, const core::Digest& digest,
                     std::shared_ptr<const std::string> content, bool lazy_only) {
    MutexLock lock(m_inodes.mutex);
    PageState* state = find(ino);
    if (!state || state->digest != digest) return;
    if (lazy_only ? (state->lazy == 0 || state->kept) : state->readers.empty()) return;
    state->kept = std::move(content);
}

std::shared_ptr<const std::string> PageCache::kept(Ino ino, const core::Digest& digest) {
    MutexLock lock(m_inodes.mutex);
    if (const PageState* state = find(ino); state && state->kept && state->digest == digest)
        return state->kept;
    return nullptr;
}

std::vector<std::pair<Ino, core::Digest>> PageCache::unkept_lazy() {
    std::vector<std::pair<Ino, core::Digest>> lazy;
    MutexLock lock(m_inodes.mutex);
    for (Ino ino : m_lazy_inodes) {
        const PageState* state = find(ino);  // there while it has lazy readers
        if (state && !state->kept) lazy.emplace_back(ino, state->digest);
    }
    return lazy;
}

}  // namespace kcache::fsd
