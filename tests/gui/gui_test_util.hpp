// Helpers of the inspector tests: a db in a temporary directory, filled through core.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kcache/core/store.hpp"
#include "temp_dir.hpp"

namespace kcache::test {

// A clock the test moves by hand, shared by every Store that was given it.
struct ManualClock {
    std::shared_ptr<std::int64_t> now = std::make_shared<std::int64_t>(1'700'000'000'000'000'000);
    core::Clock clock() const {
        return [t = now] { return *t; };
    }
    void advance(std::int64_t ns) { *now += ns; }
};

inline constexpr std::int64_t kSecondNs = 1'000'000'000;
inline constexpr std::int64_t kDayNs = 86'400 * kSecondNs;

// Files of one entry: name -> content.
using Files = std::vector<std::pair<std::string, std::string>>;

class GuiDb {
  public:
    GuiDb();
    std::string path() const { return (m_dir / "db").string(); }
    core::Store& store() { return *m_store; }
    ManualClock& clock() { return m_clock; }
    const TempDir& dir() const { return m_dir; }

    // Entry directory `name` below the root with `files`; returns its ino.
    core::Ino add_entry(const std::string& name, const Files& files);
    void add_file(const std::string& entry, const std::string& file, const std::string& content);
    void hit(core::Ino entry, int times = 1);
    void evict(core::Ino entry);
    void pin(core::Ino entry, bool pinned = true);
    bool exists(const std::string& name);

  private:
    TempDir m_dir;
    ManualClock m_clock;
    std::unique_ptr<core::Store> m_store;
};

// "cubin-like" content: distinct per seed, so entries do not share blobs by accident.
std::string fake_cubin(int seed, std::size_t size = 600);

}  // namespace kcache::test
