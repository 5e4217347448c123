// The session cache: kernels already loaded in this process, by (entry, kernel,
// device), so that a launch that hits costs about one hash lookup.
//
// Thread-safe. Bounded: beyond `capacity` values, the least recently used one goes,
// chosen by the CLOCK algorithm (a hit only sets a flag; no list to reorder on the
// hot path). Values are shared: one evicted while a caller still holds it (a module
// in use by a launch) lives until the last holder lets go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kcache/core/thread_annotations.hpp"

namespace kcache::loader {

struct KernelKey {
    std::string entry;   // the cache entry (kernel hash directory)
    std::string kernel;  // the kernel's (mangled) name
    int device = 0;
    friend bool operator==(const KernelKey&, const KernelKey&) = default;
};

struct KernelKeyHash {
    std::size_t operator()(const KernelKey& k) const noexcept {
        const std::size_t a = std::hash<std::string>{}(k.entry);
        const std::size_t b = std::hash<std::string>{}(k.kernel);
        return a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2)) ^
               static_cast<std::size_t>(k.device);
    }
};

struct SessionCacheStats {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::uint64_t evictions = 0;
    std::size_t size = 0;
    std::size_t capacity = 0;
};

template <class Value>
class SessionCache {
  public:
    explicit SessionCache(std::size_t capacity) : m_slots(capacity ? capacity : 1) {
        m_index.reserve(m_slots.size());
    }

    // The value for `key`, or null; counts a hit or a miss.
    std::shared_ptr<const Value> find(const KernelKey& key) {
        MutexLock lock(m_mutex);
        auto it = m_index.find(key);
        if (it == m_index.end()) {
            ++m_stats.misses;
            return nullptr;
        }
        ++m_stats.hits;
        Slot& slot = m_slots[it->second];
        slot.referenced = true;
        return slot.value;
    }

    // Stores `value` for `key` (replacing one there), evicting if full. Returns it.
    std::shared_ptr<const Value> insert(const KernelKey& key, std::shared_ptr<const Value> value) {
        MutexLock lock(m_mutex);
        if (auto it = m_index.find(key); it != m_index.end()) {
            Slot& slot = m_slots[it->second];
            slot.value = value;
            slot.referenced = true;
            return value;
        }
        const std::size_t at = free_slot();
        Slot& slot = m_slots[at];
        slot.key = key;
        slot.value = value;
        slot.used = true;
        slot.referenced = false;  // a newcomer must be hit to earn a second chance
        m_index.emplace(key, at);
        return value;
    }

    // find(), and on a miss `load()` (called outside the lock: loading a module is
    // slow) and insert. Null when `load` fails (it keeps its own error). Two threads
    // missing together may both load; the last insert wins, both results are valid.
    std::shared_ptr<const Value> get_or_load(
        const KernelKey& key, const std::function<std::shared_ptr<const Value>()>& load) {
        if (auto hit = find(key)) return hit;
        auto loaded = load();
        return loaded ? insert(key, std::move(loaded)) : nullptr;
    }

    SessionCacheStats stats() const {
        MutexLock lock(m_mutex);
        SessionCacheStats s = m_stats;
        s.size = m_index.size();
        s.capacity = m_slots.size();
        return s;
    }

    void clear() {
        MutexLock lock(m_mutex);
        m_index.clear();
        for (Slot& slot : m_slots) slot = Slot{};
        m_hand = 0;
    }

  private:
    struct Slot {
        KernelKey key;
        std::shared_ptr<const Value> value;
        bool used = false;
        bool referenced = false;
    };

    // A free slot, or the first unreferenced one the clock hand finds (evicted).
    std::size_t free_slot() REQUIRES(m_mutex) {
        if (m_index.size() < m_slots.size()) {
            for (std::size_t i = 0; i < m_slots.size(); ++i) {
                const std::size_t at = (m_hand + i) % m_slots.size();
                if (!m_slots[at].used) return at;
            }
        }
        for (;;) {
            Slot& slot = m_slots[m_hand];
            const std::size_t at = m_hand;
            m_hand = (m_hand + 1) % m_slots.size();
            if (slot.referenced) {
                slot.referenced = false;  // second chance
                continue;
            }
            m_index.erase(slot.key);
            slot = Slot{};
            ++m_stats.evictions;
            return at;
        }
    }

    mutable Mutex m_mutex;
    std::vector<Slot> m_slots GUARDED_BY(m_mutex);
    std::unordered_map<KernelKey, std::size_t, KernelKeyHash> m_index GUARDED_BY(m_mutex);
    std::size_t m_hand GUARDED_BY(m_mutex) = 0;
    SessionCacheStats m_stats GUARDED_BY(m_mutex);
};

}  // namespace kcache::loader
