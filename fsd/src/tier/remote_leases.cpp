// The shared tier's compile leases (remote_tier.hpp, "Compile leases"): after a miss,
// take the entry's lease or wait for the node that holds it (lease_after_miss); an
// upload ends this node's lease and sizes the next ones' bound (lease_uploaded); the
// lease keeper thread renews the leases this node holds (run_lease_keeper).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "log.hpp"
#include "remote_tier.hpp"

namespace kcache::fsd {

bool RemoteTier::lease_after_miss(const std::string& entry, std::optional<bool> taken) {
    bool waiting = false;
    {
        MutexLock lock(m_mutex);
        auto f = m_flights.find(entry);
        if (f == m_flights.end() || f->second.overdue || m_stop) return false;
        if (m_leases.count(entry)) return false;  // ours: this node compiles it
        waiting = f->second.lease_wait;
    }
    const std::int64_t ttl = lease_ttl_ms();
    // A waiter's bound: the lease's time, or (renewed) the longest any holder renews it.
    const auto wait_bound =
        renewed_leases()
            ? kLeaseBoundMax + std::chrono::milliseconds(ttl)
            : std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(ttl));
    bool other = taken && !*taken;  // another node holds the lease
    bool won = taken && *taken;     // the pull took it (Remote::LeaseAsk)
    if (waiting && !taken) {  // a poll: still theirs? If it is gone without a manifest, take it
        auto held = m_remote->lease_held(entry);
        if (held && *held) other = true;
    }
    if (!other && !won && !taken) {
        auto got = m_remote->acquire_lease(entry, m_owner, ttl);
        if (got) {
            won = *got;
            other = !*got;
        } else if (waiting) {
            log::warning("remote: the compile lease of {}: {} (compiled here)", entry,
                         got.error().message);
        }
    }
    MutexLock lock(m_mutex);
    if (waiting && !other) {
        // The holder's lease went (expired, or released) without its manifest: the wait
        // ends without the entry, as at the deadline.
        m_lease_timeouts.fetch_add(1);
    }
    if (won) {
        if (m_leases.size() >= kMaxLeases) m_leases.clear();  // a bound: they expire anyway
        m_leases[entry] = Lease{Clock::now()};
        return false;  // a miss: this node compiles
    }
    if (!other) return false;  // no lease to be had: a plain miss
    auto f = m_flights.find(entry);
    if (f == m_flights.end() || f->second.overdue || m_stop) return false;
    const auto now = Clock::now();
    if (!f->second.lease_wait) {
        f->second.lease_wait = true;
        f->second.deadline = std::max(f->second.deadline, now + wait_bound);
        m_lease_waits.fetch_add(1);
    }
    f->second.fetching = false;
    f->second.next_poll = now + kLeasePoll;
    return true;
}

bool RemoteTier::lease_uploaded(const std::string& entry) {
    MutexLock lock(m_mutex);
    const auto l = m_leases.find(entry);
    if (l == m_leases.end()) return false;
    // How long a compile here takes, lease to upload: the bound of the next leases.
    if (m_lease_times.size() >= kLeaseSamples) m_lease_times.pop_front();
    m_lease_times.push_back(Clock::now() - l->second.taken);
    const Clock::duration longest = *std::max_element(m_lease_times.begin(), m_lease_times.end());
    m_lease_bound =
        std::clamp<Clock::duration>(kLeaseBoundFactor * longest, kLeaseBoundMin, kLeaseBoundMax);
    m_leases.erase(l);
    return true;
}

void RemoteTier::run_lease_keeper() {
    MutexLock lock(m_mutex);
    while (!m_stop) {
        m_lease_wake.wait_for(m_mutex, kLeaseRenew);
        if (m_stop) return;
        std::vector<std::string> renew;
        const auto now = Clock::now();
        for (auto& [entry, lease] : m_leases) {
            // Held for the bound without an upload: left to expire (kLeaseTtlMs), so that
            // a lookup that never compiles does not hold the others for long.
            if (lease.renewing && now - lease.taken >= m_lease_bound) lease.renewing = false;
            if (lease.renewing) renew.push_back(entry);
        }
        if (renew.empty()) continue;
        lock.unlock();
        std::vector<std::string> lost;
        for (const std::string& entry : renew) {
            auto r = m_remote->renew_lease(entry, m_owner, remote::Options::kLeaseTtlMs);
            if (r && !*r) lost.push_back(entry);  // expired, or another's now
        }
        lock.lock();
        for (const std::string& entry : lost) {
            if (auto l = m_leases.find(entry); l != m_leases.end()) l->second.renewing = false;
        }
    }
}

}  // namespace kcache::fsd
