// The shared tier's write-behind (remote_tier.hpp, its "Write-behind" point): the uploader
// thread follows the events log into the entries waiting to settle, and uploads each
// once it has settled, retrying a failed upload a few times.
#include <cerrno>

#include <thread>

#include "faults.hpp"
#include "kcache/core/entry_files.hpp"
#include "kcache/core/roles.hpp"
#include "log.hpp"
#include "remote_tier.hpp"

namespace kcache::fsd {

void RemoteTier::follow_events(core::EventCursor& events) {
    auto txn = m_store.read();
    if (!txn) return;
    const auto now = Clock::now();
    auto lost = events.read(*txn, [&](const core::Event& e) {
        switch (e.kind) {
            case core::EventKind::populate:
            case core::EventKind::member:
            case core::EventKind::import:
            case core::EventKind::rename:
                break;
            default:
                return true;
        }
        if (e.entry == 0) return true;
        if (auto entry =
                txn->entry(e.entry)) {  // pulled here (read through, prefetched): not uploaded back
            MutexLock lock(m_mutex);
            if (m_pulled.count(entry->name)) return true;
        }
        if (auto p = m_pending.find(e.entry); p != m_pending.end()) {
            p->second.since = now;  // changed again: settles later
            return true;
        }
        if (m_pending.size() >= kMaxQueued) {
            m_dropped.fetch_add(1);
            return true;
        }
        m_pending[e.entry] = Pending{0, 0, 0, now};
        m_queued.fetch_add(1);
        return true;
    });
    if (lost && *lost) {
        log::warning(
            "{} events were trimmed from the log before the uploader read them: entries they "
            "changed are not uploaded until `kcache remote push` sends them",
            *lost);
    }
}

std::vector<std::pair<core::Ino, std::string>> RemoteTier::settled() {
    std::vector<std::pair<core::Ino, std::string>> names;
    auto txn = m_store.read();
    if (!txn) return names;
    const auto now = Clock::now();
    for (auto it = m_pending.begin(); it != m_pending.end();) {
        Pending& p = it->second;
        if (now < p.not_before) {
            ++it;
            continue;
        }
        auto entry = txn->entry(it->first);
        if (!entry) {  // evicted or removed meanwhile: nothing to upload
            it = m_pending.erase(it);
            continue;
        }
        auto busy = txn->in_flight(it->first);
        const bool changed = entry->files != p.files || entry->bytes != p.bytes ||
                             entry->last_access_ns != p.last_access_ns;
        if ((busy && *busy) || changed) {
            p.files = entry->files;
            p.bytes = entry->bytes;
            p.last_access_ns = entry->last_access_ns;
            p.since = now;
            core::Completion completion;
            if (auto files = core::entry_files(*txn, *entry)) {
                for (const core::EntryFile& f : *files)
                    completion.add(f.path.substr(f.path.rfind('/') + 1));
            }
            p.marked = completion.marked;
            p.markable = completion.expects_mark;
            ++it;
            continue;
        }
        bool leased = false;  // others may be waiting for it: a shorter settle
        {
            MutexLock lock(m_mutex);
            leased = m_leases.count(entry->name) > 0;
        }
        // Redis keeps an entry's first manifest, so an entry must not go before it is
        // whole. A leased entry its compiler marked complete goes at once (nodes wait
        // for it). One its compiler has yet to mark waits kSettleUnmarked: Triton writes
        // each stage's file as the stage ends, seconds apart on a big kernel.
        const Clock::duration settle = p.marked     ? (leased ? Clock::duration{} : kSettle)
                                       : p.markable ? kSettleUnmarked
                                       : leased     ? kSettleLeased
                                                    : kSettle;
        if (now - p.since < settle) {
            ++it;
            continue;
        }
        bool pulled = false;
        {
            MutexLock lock(m_mutex);
            pulled = m_pulled.erase(entry->name) > 0;
        }
        if (!pulled && entry->files > 0) names.emplace_back(it->first, entry->name);
        it = m_pending.erase(it);
    }
    return names;
}

void RemoteTier::run_uploader(core::EventCursor events) {
    const bool uploads = !m_remote->options().read_only;
    if (named_fault().fault == Fault::slow_uploader) std::this_thread::sleep_for(kSlowStart);
    sync_containers();  // first: lookups below containers wait for it (find())
    auto last_record = Clock::now();
    std::unordered_map<core::Ino, unsigned> failures;  // failed uploads per entry, while retried
    MutexLock lock(m_mutex);
    while (!m_stop) {
        // While this node holds leases, others may wait for its uploads: look more often.
        m_upload_wake.wait_for(m_mutex, m_leases.empty() ? kUploadTick : kUploadTickLeased);
        if (m_stop) break;
        lock.unlock();
        if (uploads) {
            follow_events(events);
            for (const auto& [id, name] : settled()) {
                {
                    MutexLock stopping(m_mutex);
                    if (m_stop) break;
                }
                auto r = m_remote->push(m_store, name, m_job_tag);  // --job-tag: joins its set
                if (r) {
                    failures.erase(id);
                    const bool leased = lease_uploaded(name);
                    // Uploaded: the nodes waiting find its manifest; the lease goes (a
                    // failure leaves it to expire).
                    if (leased) (void)m_remote->release_lease(name, m_owner);
                    continue;
                }
                const unsigned failed = ++failures[id];
                const bool again = failed < kMaxUploadTries && r.error().code != EROFS &&
                                   m_pending.size() < kMaxQueued;
                if (again) {
                    Pending retry;
                    retry.since = Clock::now();
                    retry.not_before =
                        retry.since + std::chrono::seconds(std::int64_t{1} << failed);
                    m_pending[id] = retry;
                } else {
                    failures.erase(id);
                }
                if (may_warn()) {
                    log::warning(
                        "remote: uploading {}: {} ({}; further failures are counted, not logged, "
                        "for 10 s)",
                        name, r.error().message,
                        again ? "tried again later" : "left to `kcache remote push`");
                }
            }
            if (failures.size() > kMaxQueued) failures.clear();
        }
        if (Clock::now() - last_record >= std::chrono::seconds(1)) {
            (void)m_remote->probe();
            sync_containers();
            explain_misses();
            publish_servers(false);
            record_counts();
            last_record = Clock::now();
        }
        lock.lock();
    }
}

void RemoteTier::explain_misses() {
    auto pass = remote::explain_first_misses(*m_remote, m_store, m_explained_seq, kExplainFamilies);
    if (!pass) {
        if (may_warn())
            log::warning(
                "remote: misses not explained across nodes yet: {} (tried again; further "
                "failures are counted, not logged, for 10 s)",
                pass.error().message);
        return;
    }
    if (pass->explained)
        log::info("remote: {} of {} misses explained by other nodes' entries", pass->explained,
                  pass->misses);
}

}  // namespace kcache::fsd
