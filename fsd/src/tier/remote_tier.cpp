#include "remote_tier.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include <fmt/core.h>

#include "log.hpp"

namespace kcache::fsd {

namespace {

std::vector<std::string_view> split_path(std::string_view path) {
    std::vector<std::string_view> parts;
    while (!path.empty()) {
        const auto slash = path.find('/');
        parts.push_back(path.substr(0, slash));
        if (slash == std::string_view::npos) break;
        path.remove_prefix(slash + 1);
    }
    return parts;
}

std::string lease_owner() {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    return fmt::format("{}:{}", host, ::getpid());
}

}  // namespace

core::Result<std::unique_ptr<RemoteTier>> RemoteTier::create(core::Store& store,
                                                             remote::Options options,
                                                             std::string prefetch_job_tag,
                                                             std::string job_tag) {
    for (const std::string* tag : {&prefetch_job_tag, &job_tag}) {
        if (tag->empty()) continue;
        KCACHE_TRY(remote::validate_job_tag(*tag));
    }
    if (!job_tag.empty() && options.read_only) {
        return core::fail(EINVAL,
                          "a job tag adds entries to a job's set in the shared tier: not with a "
                          "read-only remote");
    }
    auto r = KCACHE_TRY(remote::Remote::create(std::move(options)));
    return std::unique_ptr<RemoteTier>(
        new RemoteTier(store, std::move(r), std::move(prefetch_job_tag), std::move(job_tag)));
}

RemoteTier::RemoteTier(core::Store& store, std::unique_ptr<remote::Remote> remote,
                       std::string prefetch_job_tag, std::string job_tag)
    : m_store(store),
      m_remote(std::move(remote)),
      m_deadline(std::chrono::nanoseconds(m_remote->options().connect_timeout_ns +
                                          m_remote->options().op_timeout_ns)),
      m_owner(lease_owner()),
      m_prefetch_tag(std::move(prefetch_job_tag)),
      m_job_tag(std::move(job_tag)) {}

RemoteTier::~RemoteTier() {
    stop();
}

void RemoteTier::start() {
    {
        MutexLock lock(m_mutex);
        if (m_started || m_stop) return;
        m_started = true;
    }
    publish_servers(false);
    if (m_remote->verifying()) {
        log::info("remote: entries are accepted only when signed by a key of {}",
                  m_remote->options().trusted_keys);
    } else {
        log::warning(
            "remote: the shared tier is unverified: any entry a writer puts there is accepted "
            "(give --remote-trusted-keys FILE; docs/operations.md, \"Trust model\")");
    }
    for (int i = 0; i < kFetchers; ++i) m_threads.emplace_back([this] { run_fetcher(); });
    m_threads.emplace_back([this] { run_timer(); });
    // From now on, before the mount serves: `kcache remote push` uploads what is older.
    core::EventCursor events;
    if (auto txn = m_store.read()) {
        if (auto end = core::EventCursor::at_end(*txn)) events = *end;
    }
    m_threads.emplace_back([this, events] { run_uploader(events); });
    if (renewed_leases()) m_threads.emplace_back([this] { run_lease_keeper(); });
    if (!m_prefetch_tag.empty()) m_threads.emplace_back([this] { run_prefetch(); });
}

void RemoteTier::stop() {
    std::vector<std::function<void()>> answer;
    bool started = false;
    {
        MutexLock lock(m_mutex);
        if (m_stop) return;
        m_stop = true;
        started = m_started;
        for (auto& [name, flight] : m_flights) {
            for (auto& w : flight.waiters) answer.push_back(std::move(w));
            flight.waiters.clear();
            flight.overdue = true;
        }
        m_fetch_queue.clear();
    }
    {
        MutexLock lock(m_containers_mutex);
        m_containers_known = true;  // nothing waits any more: unknown is none from now on
        for (auto& w : m_container_waiters) answer.push_back(std::move(w));
        m_container_waiters.clear();
    }
    m_fetch_wake.notify_all();
    m_timer_wake.notify_all();
    m_upload_wake.notify_all();
    m_lease_wake.notify_all();
    for (auto& done : answer) done();
    for (std::thread& t : m_threads) t.join();
    m_threads.clear();
    record_counts();
    if (started) publish_servers(true);
}

const std::vector<core::LayoutRule>* RemoteTier::rules(const std::string& text) {
    if (text.empty()) return nullptr;
    MutexLock lock(m_rules_mutex);
    if (!m_rules || m_rules_text != text) {
        auto parsed = core::parse_layout_rules(text);
        // The db accepted them (set_config checks): a failure here leaves the built-in rules.
        m_rules = parsed ? std::move(*parsed) : std::vector<core::LayoutRule>{};
        m_rules_text = text;
    }
    return &*m_rules;
}

RemoteTier::Found RemoteTier::find(const core::ReadTxn& txn, core::Ino parent,
                                   std::string_view name) {
    using Kind = Found::Kind;
    if (core::is_bookkeeping_name(name)) return {};
    auto dir = txn.getattr(parent);
    if (!dir || !dir->is_dir() || dir->bookkeeping) return {};
    if (dir->entry != 0) {
        // Inside an entry: only an entry directory with no file yet may be fetched.
        auto entry = txn.entry(dir->entry);
        if (!entry || entry->kind != core::EntryKind::node || entry->files != 0) return {};
        return {Kind::entry, entry->name, true};
    }
    auto path = txn.path(parent);
    if (!path) return {};
    const std::string full = path->empty() ? std::string(name) : *path + "/" + std::string(name);
    core::LayoutContext context;
    context.ancestors = split_path(*path);
    context.entry_depth = txn.config().entry_depth;
    context.rules = rules(txn.config().layout_rules);
    // Only names a layout rule recognizes: the depth fallback would make every unknown
    // name a round trip to Redis. A lookup does not say whether it wants a file or a
    // directory: a name whose stem is shorter than itself (a suffix the layout knows:
    // Inductor's <key>.py, JAX's <key>-cache) is a file of its stem's entry; compilers
    // name entry directories by the bare key (Triton's, Inductor's fxgraph/<xx>/<key>).
    const auto as_file = core::classify(context, name, core::FileType::regular);
    const bool stem_file = as_file.placement == core::Placement::entry_stem && as_file.by_rule;
    if (stem_file && as_file.stem != name)
        return {Kind::entry, path->empty() ? as_file.stem : *path + "/" + as_file.stem, true};
    const auto as_dir = core::classify(context, name, core::FileType::directory);
    if (as_dir.placement == core::Placement::entry_dir && as_dir.by_rule)
        return {Kind::entry, full, true};
    if (stem_file) return {Kind::entry, full, true};
    // Not an entry: a container the shared tier holds entries below? Memory only.
    MutexLock lock(m_containers_mutex);
    if (!m_containers_known) return {Kind::unknown, full, true};
    if (m_containers.contains(full)) return {Kind::container, full, true};
    return {Kind::none, {}, true};
}

void RemoteTier::when_containers_known(std::function<void()> done) {
    bool started = false;
    {
        MutexLock lock(m_mutex);
        started = m_started && !m_stop;
    }
    if (started) {
        MutexLock lock(m_containers_mutex);
        if (!m_containers_known) {
            m_container_waiters.push_back(std::move(done));
            return;
        }
    }
    done();
}

void RemoteTier::sync_containers() {
    auto count = m_remote->container_count();
    std::optional<core::Error> failed;
    if (!count) {
        failed = count.error();
    } else if (*count != m_containers_count) {
        auto paths = m_remote->containers();
        if (!paths) {
            failed = paths.error();
        } else {
            std::unordered_set<std::string> set;
            set.reserve(std::min(paths->size(), kMaxContainers));
            for (std::string& p : *paths) {
                if (set.size() == kMaxContainers) break;
                set.insert(std::move(p));
            }
            if (paths->size() > kMaxContainers && may_warn())
                log::warning(
                    "remote: {} containers in the shared tier; {} kept (the rest are "
                    "not read through)",
                    paths->size(), kMaxContainers);
            m_containers_count = *count;
            MutexLock lock(m_containers_mutex);
            m_containers.swap(set);
        }
    }
    if (failed && may_warn())
        log::warning(
            "remote: reading the containers: {} (tried again every second; further "
            "failures are counted, not logged, for 10 s)",
            failed->message);
    std::vector<std::function<void()>> waiters;
    {
        MutexLock lock(m_containers_mutex);
        m_containers_known = true;
        waiters.swap(m_container_waiters);
    }
    for (auto& done : waiters) done();
}

void RemoteTier::read_through(const std::string& entry, std::function<void()> done) {
    {
        MutexLock lock(m_mutex);
        const auto now = Clock::now();
        bool now_answer = m_stop || !m_started;
        if (!now_answer) {
            if (auto m = m_missed.find(entry); m != m_missed.end()) {
                if (m->second > now) {
                    now_answer = true;
                } else {
                    m_missed.erase(m);
                }
            }
        }
        if (!now_answer) {
            if (auto f = m_flights.find(entry); f != m_flights.end()) {
                if (f->second.overdue) {
                    now_answer = true;  // Redis is slow: do not wait again
                } else {
                    f->second.waiters.push_back(std::move(done));
                    return;
                }
            } else if (m_flights.size() >= kMaxFlights) {
                now_answer = true;
            } else {
                Flight& flight = m_flights[entry];
                flight.deadline = now + m_deadline;
                flight.waiters.push_back(std::move(done));
                m_fetch_queue.push_back(entry);
                lock.unlock();
                m_fetch_wake.notify_one();
                m_timer_wake.notify_one();
                return;
            }
        }
    }
    done();
}

void RemoteTier::run_fetcher() {
    MutexLock lock(m_mutex);
    for (;;) {
        while (!m_stop && m_fetch_queue.empty()) m_fetch_wake.wait(m_mutex);
        if (m_stop) return;
        const std::string entry = std::move(m_fetch_queue.front());
        m_fetch_queue.pop_front();
        // With leases, a miss takes the compile lease in the manifest's round trip (one
        // round trip a miss); not for an entry whose lease this node holds already.
        const bool leases = m_remote->options().lease_ms != 0 && !m_remote->options().read_only;
        std::optional<remote::Remote::LeaseAsk> ask;
        if (leases && !m_leases.count(entry))
            ask = remote::Remote::LeaseAsk{m_owner, lease_ttl_ms()};
        lock.unlock();
        auto result = m_remote->pull(m_store, entry, ask ? &*ask : nullptr);
        const bool found = result && (result->outcome == remote::Outcome::pulled ||
                                      result->outcome == remote::Outcome::already_local);
        if (result && result->outcome == remote::Outcome::miss &&
            m_remote->options().lease_ms != 0 && lease_after_miss(entry, result->lease_taken)) {
            m_timer_wake.notify_one();  // its next poll
            lock.lock();
            continue;
        }
        if (!result) {
            if (may_warn()) {
                log::warning(
                    "remote: reading {} through: {} (a miss; further failures are counted, "
                    "not logged, for 10 s)",
                    entry, result.error().message);
            }
        } else if (result->outcome == remote::Outcome::corrupt ||
                   result->outcome == remote::Outcome::dangling ||
                   result->outcome == remote::Outcome::rejected) {
            log::warning("remote: {} is {} in the shared tier ({}): not stored, a miss", entry,
                         remote::outcome_name(result->outcome), result->detail);
        }
        std::vector<std::function<void()>> answer;
        lock.lock();
        if (auto f = m_flights.find(entry); f != m_flights.end()) {
            answer = std::move(f->second.waiters);
            m_flights.erase(f);
        }
        if (found) {
            if (result->outcome == remote::Outcome::pulled) remember_pulled(entry);
        } else {
            if (m_missed.size() >= 4 * kMaxFlights) {
                const auto now = Clock::now();
                std::erase_if(m_missed, [&](const auto& m) { return m.second <= now; });
            }
            m_missed[entry] = Clock::now() + kMissMemo;
        }
        lock.unlock();
        for (auto& done : answer) done();
        if (found && result->outcome == remote::Outcome::pulled) tag_pulled({entry});
        lock.lock();
    }
}

void RemoteTier::tag_pulled(const std::vector<std::string>& entries) {
    if (m_job_tag.empty() || entries.empty()) return;
    if (auto s = m_remote->add_to_job(m_job_tag, entries); !s && may_warn()) {
        log::warning(
            "remote: adding {} pulled entries to job {}: {} (further failures are counted, not "
            "logged, for 10 s)",
            entries.size(), m_job_tag, s.error().message);
    }
}

bool RemoteTier::may_warn() {
    const std::int64_t now_ns = m_store.now_ns();
    std::int64_t last = m_last_warning_ns.load();
    return now_ns - last > 10'000'000'000 &&
           m_last_warning_ns.compare_exchange_strong(last, now_ns);
}

void RemoteTier::remember_pulled(const std::string& entry) {
    if (m_pulled.size() >= kMaxPulled)
        m_pulled.clear();  // a bound: at worst an upload is skipped by Redis
    m_pulled.insert(entry);
}

void RemoteTier::run_prefetch() {
    const auto begin = Clock::now();
    log::info("remote: prefetching job {}", m_prefetch_tag);
    // Entries of another job pulled here join --job-tag's set, a batch at a time.
    std::vector<std::string> to_tag;
    const bool tagging = !m_job_tag.empty() && m_job_tag != m_prefetch_tag;
    auto summary = m_remote->pull_job(
        m_store, m_prefetch_tag,
        [&](const std::string& entry, const core::Result<remote::EntryResult>& result) {
            const bool pulled = result && result->outcome == remote::Outcome::pulled;
            if (pulled && tagging) {
                to_tag.push_back(entry);
                if (to_tag.size() >= remote::Remote::kPullBatch) {
                    tag_pulled(to_tag);
                    to_tag.clear();
                }
            }
            MutexLock lock(m_mutex);
            if (pulled) {
                remember_pulled(entry);
                m_prefetched.fetch_add(1);
                m_prefetched_bytes.fetch_add(result->bytes);
            }
            return !m_stop;
        });
    tag_pulled(to_tag);
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    if (!summary) {
        log::warning(
            "remote: prefetching job {}: {} (entries are read through as they are asked for)",
            m_prefetch_tag, summary.error().message);
        return;
    }
    log::info(
        "remote: prefetched job {} in {:.3f} s: {} pulled ({} bytes), {} already local, {} not "
        "available, "
        "{} failed",
        m_prefetch_tag, seconds, summary->pulled, summary->pulled_bytes, summary->already_local,
        summary->missing, summary->failed);
}

void RemoteTier::run_timer() {
    MutexLock lock(m_mutex);
    while (!m_stop) {
        std::optional<Clock::time_point> next;
        for (const auto& [name, flight] : m_flights) {
            if (!flight.overdue && (!next || flight.deadline < *next)) next = flight.deadline;
            if (flight.lease_wait && !flight.fetching && (!next || flight.next_poll < *next))
                next = flight.next_poll;
        }
        if (next) {
            m_timer_wake.wait_until(m_mutex, *next);
        } else {
            m_timer_wake.wait(m_mutex);
        }
        if (m_stop) return;
        std::vector<std::function<void()>> answer;
        const auto now = Clock::now();
        bool polls = false;
        for (auto it = m_flights.begin(); it != m_flights.end();) {
            Flight& flight = it->second;
            if (!flight.overdue && flight.deadline <= now) {
                flight.overdue = true;
                for (auto& w : flight.waiters) answer.push_back(std::move(w));
                flight.waiters.clear();
                if (flight.lease_wait) {
                    m_lease_timeouts.fetch_add(1);  // compiled here, as a miss
                    if (!flight.fetching) {         // no pull to finish it: done
                        m_missed[it->first] = now + kMissMemo;
                        it = m_flights.erase(it);
                        continue;
                    }
                }
            } else if (!flight.overdue && flight.lease_wait && !flight.fetching &&
                       flight.next_poll <= now) {
                flight.fetching = true;  // pulled again: its manifest may be there now
                m_fetch_queue.push_back(it->first);
                polls = true;
            }
            ++it;
        }
        if (polls) m_fetch_wake.notify_all();
        if (answer.empty()) continue;
        lock.unlock();
        for (auto& done : answer) done();
        lock.lock();
    }
}

}  // namespace kcache::fsd
