#include "single_flight.hpp"

#include <signal.h>

#include <cerrno>
#include <utility>

#include "process.hpp"

namespace kcache::fsd {

void SingleFlight::start() {
    if (!enabled()) return;
    MutexLock lock(m_mutex);
    if (m_started || m_stop) return;
    m_started = true;
    m_thread = std::thread([this] { run(); });
}

void SingleFlight::stop() {
    {
        MutexLock lock(m_mutex);
        if (m_stop) return;
        m_stop = true;
    }
    m_wake.notify_all();
    if (m_thread.joinable()) m_thread.join();
    // Registered waiters are answered here; one still registering is answered by its
    // wait(), which sees m_stop.
    std::vector<std::function<void(End)>> answer;
    {
        MutexLock lock(m_mutex);
        for (auto it = m_waiters.begin(); it != m_waiters.end();) {
            if (!it->second.registered) {
                ++it;
                continue;
            }
            m_by_req.erase(it->second.req);
            answer.push_back(std::move(it->second.answer));
            it = m_waiters.erase(it);
        }
    }
    for (auto& a : answer) a(End::stopped);
}

void SingleFlight::writer_opened(core::Ino entry, std::uint32_t process) {
    if (!enabled() || entry == 0) return;
    MutexLock lock(m_mutex);
    if (m_fillers.size() >= kMaxEntries) prune_locked(Clock::now());
    if (m_fillers.size() >= kMaxEntries && !m_fillers.count(entry)) return;  // a bound: no wait
    Filler& f = m_fillers[entry][process];
    ++f.writers;
    f.last = Clock::now();
}

void SingleFlight::writer_closed(core::Ino entry, std::uint32_t process) {
    if (!enabled() || entry == 0) return;
    {
        MutexLock lock(m_mutex);
        auto e = m_fillers.find(entry);
        if (e == m_fillers.end()) return;
        auto f = e->second.find(process);
        if (f == e->second.end() || f->second.writers == 0) return;
        --f->second.writers;
        f->second.last = Clock::now();
    }
    m_wake.notify_one();
}

void SingleFlight::created(core::Ino entry, std::uint32_t process) {
    if (!enabled() || entry == 0) return;
    {
        MutexLock lock(m_mutex);
        if (m_fillers.size() >= kMaxEntries) prune_locked(Clock::now());
        if (m_fillers.size() >= kMaxEntries && !m_fillers.count(entry)) return;
        m_fillers[entry][process].last = Clock::now();
    }
    m_wake.notify_one();
}

bool SingleFlight::active(core::Ino entry) {
    if (!enabled()) return false;
    MutexLock lock(m_mutex);
    auto e = m_fillers.find(entry);
    if (e == m_fillers.end()) return false;
    const auto now = Clock::now();
    for (const auto& [process, f] : e->second) {
        if (at_work(f, now)) return true;
    }
    return false;
}

bool SingleFlight::filled_by_other(core::Ino entry, std::uint32_t asker) {
    if (!enabled()) return false;
    std::vector<std::uint32_t> at;
    {
        MutexLock lock(m_mutex);
        auto e = m_fillers.find(entry);
        if (e == m_fillers.end()) return false;
        const auto now = Clock::now();
        for (const auto& [process, f] : e->second) {
            if (at_work(f, now)) at.push_back(process);
        }
    }
    if (at.empty()) return false;
    // A compile at work in the entry itself never waits: two compiles filling one entry
    // would otherwise wait for each other until the bound.
    bool other = false;
    for (std::uint32_t process : at) {
        if (same_compile(asker, process)) return false;
        // A filler that exited finishes nothing: what it left is all there will be.
        const bool alive = ::kill(static_cast<pid_t>(process), 0) == 0 || errno == EPERM;
        other = other || alive;
    }
    return other;
}

bool SingleFlight::retry_first(pid_t tid, const Awaited& awaited) {
    if (!enabled() || !active(awaited.entry)) return false;
    {
        MutexLock lock(m_mutex);
        if (m_stop || !m_started) return false;
        if (m_retries.size() >= kMaxRetries) prune_locked(Clock::now());
        if (m_retries.size() >= kMaxRetries) return false;  // a bound: a plain miss
    }
    if (!filled_by_other(awaited.entry, awaited.asker)) return false;  // /proc: not locked
    MutexLock lock(m_mutex);
    Retry& r = m_retries[tid];
    r.awaited = awaited;
    r.waited = false;
    r.expires = Clock::now() + kRetryWindow;
    return true;
}

bool SingleFlight::retried(pid_t tid, core::Ino dir, std::string_view name) {
    if (!enabled()) return false;
    MutexLock lock(m_mutex);
    auto r = m_retries.find(tid);
    if (r == m_retries.end()) return false;
    if (r->second.expires <= Clock::now()) {  // an older system call's: not this one's retry
        m_retries.erase(r);
        return false;
    }
    if (r->second.awaited.dir != dir || r->second.awaited.name != name) return false;
    m_retries.erase(r);
    return true;
}

std::optional<SingleFlight::Awaited> SingleFlight::retrying(pid_t tid, core::Ino ino) {
    if (!enabled()) return std::nullopt;
    MutexLock lock(m_mutex);
    auto r = m_retries.find(tid);
    if (r == m_retries.end() || r->second.waited || r->second.awaited.dir != ino)
        return std::nullopt;
    if (r->second.expires <= Clock::now()) {  // an older system call's: no wait now
        m_retries.erase(r);
        return std::nullopt;
    }
    r->second.waited = true;  // once: a later walk through the directory does not wait
    r->second.expires = Clock::now() + m_bound + kRetryWindow;
    return r->second.awaited;
}

bool SingleFlight::wait(fuse_req_t req, Awaited awaited, std::function<void(End)> answer) {
    if (!enabled()) return false;
    std::uint64_t id = 0;
    {
        MutexLock lock(m_mutex);
        if (!m_started || m_stop || m_waiters.size() >= kMaxWaiters) return false;
        id = ++m_next_id;
        Waiter& w = m_waiters[id];
        w.req = req;
        w.awaited = std::move(awaited);
        w.deadline = Clock::now() + m_bound;
        w.answer = std::move(answer);
        m_by_req[req] = id;
    }
    // Not under m_mutex: when the kernel interrupted the request already, libfuse calls
    // on_interrupt from here. Nobody answers the waiter before it is registered, so
    // `req` is alive here.
    fuse_req_interrupt_func(req, &SingleFlight::on_interrupt, this);
    std::function<void(End)> stopped;
    {
        MutexLock lock(m_mutex);
        auto w = m_waiters.find(id);
        if (m_stop) {  // stop() left it to us
            m_by_req.erase(w->second.req);
            stopped = std::move(w->second.answer);
            m_waiters.erase(w);
        } else {
            w->second.registered = true;
        }
    }
    if (stopped) {
        stopped(End::stopped);
        return true;
    }
    m_wake.notify_one();
    return true;
}

void SingleFlight::on_interrupt(fuse_req_t req, void* data) {
    auto* self = static_cast<SingleFlight*>(data);
    {
        MutexLock lock(self->m_mutex);
        auto id = self->m_by_req.find(req);
        if (id == self->m_by_req.end()) return;  // answered already
        auto w = self->m_waiters.find(id->second);
        if (w == self->m_waiters.end()) return;
        w->second.interrupted = true;
    }
    self->m_wake.notify_one();
}

void SingleFlight::prune_locked(Clock::time_point now) {
    std::erase_if(m_retries, [&](const auto& r) { return r.second.expires <= now; });
    for (auto e = m_fillers.begin(); e != m_fillers.end();) {
        std::erase_if(e->second, [&](const auto& f) { return !at_work(f.second, now); });
        e = e->second.empty() ? m_fillers.erase(e) : std::next(e);
    }
}

void SingleFlight::run() {
    MutexLock lock(m_mutex);
    auto last_prune = Clock::now();
    while (!m_stop) {
        if (m_waiters.empty()) {
            m_wake.wait_for(m_mutex, std::chrono::seconds(1));
        } else {
            m_wake.wait_for(m_mutex, kPoll);
        }
        if (m_stop) break;
        auto now = Clock::now();
        std::vector<std::pair<std::uint64_t, End>> ends;
        std::vector<std::pair<std::uint64_t, Awaited>> checks;
        for (const auto& [id, w] : m_waiters) {
            if (!w.registered) continue;
            if (w.interrupted) {
                ends.emplace_back(id, End::interrupted);
            } else if (now >= w.deadline) {
                ends.emplace_back(id, End::timed_out);
            } else {
                checks.emplace_back(id, w.awaited);
            }
        }
        if (!checks.empty()) {
            lock.unlock();  // filled_by_other takes the lock and reads /proc
            auto txn = m_store.read();
            for (const auto& [id, what] : checks) {
                // A db that cannot be read ends the wait: the lookup answers the error.
                const bool appeared = !txn || txn->lookup(what.dir, what.name).has_value();
                if (appeared || !filled_by_other(what.entry, what.asker))
                    ends.emplace_back(id, End::settled);
            }
            txn = core::fail(ENOENT, "");  // no snapshot held while the thread sleeps
            lock.lock();
        }
        std::vector<std::pair<std::function<void(End)>, End>> answer;
        for (const auto& [id, end] : ends) {
            auto w = m_waiters.find(id);
            if (w == m_waiters.end()) continue;
            // An interrupt that came meanwhile wins: the kernel waits for that answer.
            const End e = w->second.interrupted ? End::interrupted : end;
            m_by_req.erase(w->second.req);
            answer.emplace_back(std::move(w->second.answer), e);
            m_waiters.erase(w);
        }
        now = Clock::now();
        if (now - last_prune > std::chrono::seconds(1)) {
            prune_locked(now);
            last_prune = now;
        }
        if (answer.empty()) continue;
        lock.unlock();
        for (auto& [a, end] : answer) a(end);
        lock.lock();
    }
}

}  // namespace kcache::fsd
