// What the shared tier tells of itself: its counts recorded in the db's statistics
// (record_counts) and its servers' states published for `kcache remote` (publish_servers),
// both from the uploader thread (remote_uploads.cpp). See remote_tier.hpp.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "log.hpp"
#include "remote_tier.hpp"

namespace kcache::fsd {

namespace {

std::string json_string(std::string_view text) {
    std::string out = "\"";
    for (const char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
            out += c;
        }
    }
    return out + "\"";
}

// Writes `content` to `path` whole or not at all (a temp file renamed over it).
bool write_file_atomically(const std::string& path, const std::string& content) {
    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return false;
    const bool written = std::fwrite(content.data(), 1, content.size(), f) == content.size();
    if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
        (void)std::remove(tmp.c_str());
        return false;
    }
    return true;
}

}  // namespace

void RemoteTier::record_counts() {
    MutexLock lock(m_record_mutex);
    const remote::Counts now = m_remote->counts();
    const remote::Counts delta = now - m_recorded;
    const std::uint64_t queued = m_queued.load(), dropped = m_dropped.load();
    const std::uint64_t dq = queued - m_recorded_queued, dd = dropped - m_recorded_dropped;
    const std::uint64_t prefetched = m_prefetched.load(),
                        prefetched_bytes = m_prefetched_bytes.load();
    const std::uint64_t dp = prefetched - m_recorded_prefetched,
                        dpb = prefetched_bytes - m_recorded_prefetched_bytes;
    const std::uint64_t lease_waits = m_lease_waits.load(),
                        lease_timeouts = m_lease_timeouts.load();
    const std::uint64_t dlw = lease_waits - m_recorded_lease_waits,
                        dlt = lease_timeouts - m_recorded_lease_timeouts;
    const bool any = dq || dd || dp || dpb || dlw || dlt || delta.any();
    if (!any) return;
    if (auto s = remote::record_counts(m_store, delta); !s) {
        log::warning("remote: recording statistics: {}", s.error().message);
        return;
    }
    m_recorded = now;
    if (dq || dd || dp || dpb || dlw || dlt) {
        auto s = m_store.update([&](core::WriteTxn& txn) -> core::Status {
            if (auto a = txn.add(core::Counter::remote_lease_waits, dlw); !a) return a;
            if (auto a = txn.add(core::Counter::remote_lease_timeouts, dlt); !a) return a;
            if (auto a = txn.add(core::Counter::remote_upload_queued, dq); !a) return a;
            if (auto a = txn.add(core::Counter::remote_prefetched, dp); !a) return a;
            if (auto a = txn.add(core::Counter::remote_prefetched_bytes, dpb); !a) return a;
            return txn.add(core::Counter::remote_upload_dropped, dd);
        });
        if (!s) {
            log::warning("remote: recording statistics: {}", s.error().message);
            return;
        }
        m_recorded_queued = queued;
        m_recorded_dropped = dropped;
        m_recorded_prefetched = prefetched;
        m_recorded_prefetched_bytes = prefetched_bytes;
        m_recorded_lease_waits = lease_waits;
        m_recorded_lease_timeouts = lease_timeouts;
    }
}

void RemoteTier::publish_servers(bool stopping) {
    MutexLock lock(m_record_mutex);
    std::vector<remote::ServerState> servers;
    if (!stopping) servers = m_remote->servers();
    std::uint64_t open = 0, half_open = 0;
    std::string list;
    for (const remote::ServerState& s : servers) {
        open += s.breaker == "open";
        half_open += s.breaker == "half-open";
        list += fmt::format(
            "{}{{\"id\": {}, \"breaker\": {}, \"failures\": {}, \"uploads_paused\": {}}}",
            list.empty() ? "" : ", ", json_string(s.id), json_string(s.breaker), s.failures,
            s.uploads_paused ? "true" : "false");
    }
    if (!stopping && list == m_published_servers) return;
    auto set = m_store.update([&](core::WriteTxn& txn) -> core::Status {
        const std::pair<core::Counter, std::uint64_t> gauges[] = {
            {core::Counter::remote_servers, servers.size()},
            {core::Counter::remote_breakers_open, open},
            {core::Counter::remote_breakers_half_open, half_open},
        };
        for (const auto& [counter, value] : gauges) {
            auto now = KCACHE_TRY(txn.counter(counter));
            if (auto a = txn.add(counter, value - now); !a) return a;  // modulo 2^64: sets it
        }
        return {};
    });
    if (!set) {
        log::warning("remote: publishing the servers' states: {}", set.error().message);
        return;
    }
    const std::string path = m_store.path() + "/" + kServerStateFile;
    if (stopping) {
        (void)::unlink(path.c_str());
    } else if (!write_file_atomically(
                   path, fmt::format("{{\"pid\": {}, \"updated_ns\": {}, \"servers\": [{}]}}\n",
                                     ::getpid(), m_store.now_ns(), list))) {
        log::warning("remote: cannot write {}", path);
        return;
    }
    m_published_servers = list;
}

}  // namespace kcache::fsd
