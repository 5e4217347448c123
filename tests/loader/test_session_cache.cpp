// The session cache of loaded kernels: hits, misses, bounded size, CLOCK eviction,
// values outliving eviction, and concurrent use.
#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kcache/loader/session_cache.hpp"

using kcache::loader::KernelKey;
using kcache::loader::SessionCache;

namespace {
KernelKey key(int i, int device = 0) {
    return {"entry" + std::to_string(i), "kernel", device};
}
std::shared_ptr<const int> value(int v) {
    return std::make_shared<const int>(v);
}
}  // namespace

TEST_CASE("session cache: a hit returns what was inserted and counts", "[loader][session]") {
    SessionCache<int> cache(4);
    CHECK(cache.find(key(1)) == nullptr);
    cache.insert(key(1), value(10));
    auto hit = cache.find(key(1));
    REQUIRE(hit);
    CHECK(*hit == 10);
    CHECK(cache.find(key(1, 1)) == nullptr);  // another device is another kernel
    const auto s = cache.stats();
    CHECK(s.hits == 1);
    CHECK(s.misses == 2);
    CHECK(s.size == 1);
    CHECK(s.capacity == 4);
}

TEST_CASE("session cache: beyond capacity the least recently used goes", "[loader][session]") {
    SessionCache<int> cache(2);
    cache.insert(key(1), value(1));
    cache.insert(key(2), value(2));
    REQUIRE(cache.find(key(1)));     // 1 is used again; 2 is not
    cache.insert(key(3), value(3));  // evicts 2
    CHECK(cache.find(key(1)));
    CHECK(cache.find(key(2)) == nullptr);
    CHECK(cache.find(key(3)));
    CHECK(cache.stats().evictions == 1);
    CHECK(cache.stats().size == 2);
}

TEST_CASE("session cache: a value evicted while held stays valid", "[loader][session]") {
    SessionCache<std::string> cache(1);
    auto held = cache.insert(key(1), std::make_shared<const std::string>("module"));
    cache.insert(key(2), std::make_shared<const std::string>("other"));
    CHECK(cache.find(key(1)) == nullptr);
    CHECK(*held == "module");
}

TEST_CASE("session cache: get_or_load loads once per key and not on failure", "[loader][session]") {
    SessionCache<int> cache(8);
    int loads = 0;
    auto load = [&] {
        ++loads;
        return value(42);
    };
    CHECK(*cache.get_or_load(key(1), load) == 42);
    CHECK(*cache.get_or_load(key(1), load) == 42);
    CHECK(loads == 1);
    CHECK(cache.get_or_load(key(2), [] { return std::shared_ptr<const int>(); }) == nullptr);
    CHECK(cache.find(key(2)) == nullptr);
}

TEST_CASE("session cache: concurrent finds and inserts stay consistent", "[loader][session]") {
    SessionCache<int> cache(64);
    std::atomic<std::uint64_t> finds{0}, wrong{0};  // (Catch2 asserts are not thread-safe)
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < 20000; ++i) {
                const int k = (i * 7 + t) % 100;
                if (auto v = cache.find(key(k))) {
                    if (*v != k) ++wrong;  // never another key's value
                } else {
                    cache.insert(key(k), value(k));
                }
                ++finds;
            }
        });
    }
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
    const auto s = cache.stats();
    CHECK(s.hits + s.misses == finds.load());
    CHECK(s.size <= 64);
    CHECK(s.evictions > 0);
}
