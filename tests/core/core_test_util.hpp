// Helpers shared by the core tests: a store opened in a private temp dir with a fake
// clock, one-call "mkdir -p + create + write", error matchers that print errno names,
// deterministic test data, and an independent recount of the store's accounting.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/maintenance.hpp"
#include "kcache/core/store.hpp"
#include "temp_dir.hpp"

namespace kcache::test {

inline constexpr std::int64_t kSecond = 1'000'000'000;

// ---- results ------------------------------------------------------------------------

std::string describe(const core::Error& error);  // "ENOENT (No such file ...): message"
std::string errno_name(int code);                // "ENOENT"; "0" for success

// Fails the current test (with the error) unless `result` holds a value.
template <class T>
T must(core::Result<T> result, std::string_view what) {
    if (!result) FAIL(what << " failed: " << describe(result.error()));
    return std::move(*result);
}
void must(core::Status status, std::string_view what);

#define KC_MUST(expr) ::kcache::test::must((expr), #expr)

// The outcome of a call, for CHECK(err(call) == ENOENT); prints as "EEXIST: message".
struct Outcome {
    int code = 0;  // 0: success
    std::string message;
    friend bool operator==(const Outcome& o, int code) { return o.code == code; }
    friend bool operator!=(const Outcome& o, int code) { return o.code != code; }
};
template <class T>
Outcome err(const core::Result<T>& result) {
    if (result) return {};
    return {result.error().code, result.error().message};
}

// ---- a store in a temp dir ------------------------------------------------------------

// A clock the test moves by hand. Copies share the same time.
class FakeClock {
  public:
    explicit FakeClock(std::int64_t start = 1000 * kSecond)
        : m_now(std::make_shared<std::atomic<std::int64_t>>(start)) {}
    core::Clock clock() const {
        auto now = m_now;
        return [now] { return now->load(); };
    }
    std::int64_t now() const { return m_now->load(); }
    void set(std::int64_t ns) { m_now->store(ns); }
    std::int64_t advance(std::int64_t ns = kSecond) { return m_now->fetch_add(ns) + ns; }

  private:
    std::shared_ptr<std::atomic<std::int64_t>> m_now;
};

core::Origin test_origin();  // {4242, "kc-test-writer"}

// A store at <tempdir>/db, opened with a FakeClock. Helpers commit their own write
// transactions: do not call them while a WriteTxn of this thread is open.
class TestStore {
  public:
    using Tweak = std::function<void(core::OpenOptions&)>;
    explicit TestStore(const Tweak& tweak = {});

    core::Store& store() { return *m_store; }
    core::Store* operator->() { return m_store.get(); }
    const TempDir& dir() const { return m_dir; }
    std::string db_path() const { return m_options.path; }
    FakeClock& clock() { return m_clock; }
    core::OpenOptions& options() { return m_options; }

    void close() { m_store.reset(); }
    void reopen();  // close and open again with the same options

    core::ReadTxn read();
    core::WriteTxn write();

    // mkdir -p of `path`'s parents, create, publish `content`, commit. Returns the file.
    core::Ino put(std::string_view path, std::string_view content,
                  const core::Origin& origin = test_origin());
    core::Ino mkdirs(std::string_view path);  // mkdir -p, committed
    std::string get(std::string_view path);   // whole content of a file
    core::Ino ino(std::string_view path);     // resolve, failing the test if missing
    bool exists(std::string_view path);
    core::Attr attr(std::string_view path);
    core::EntryInfo entry(std::string_view name);
    std::uint64_t counter(core::Counter c);
    std::vector<std::string> entry_names();                        // for_each_entry order
    std::vector<std::string> lru_names();                          // for_each_lru order
    std::vector<std::string> children(std::string_view dir_path);  // readdir order

  private:
    TempDir m_dir;
    FakeClock m_clock;
    core::OpenOptions m_options;
    std::unique_ptr<core::Store> m_store;
};

// The same helpers on an open write transaction (nothing is committed).
core::Ino mkdirs(core::WriteTxn& txn, std::string_view path);
core::Ino put(core::WriteTxn& txn, std::string_view path, std::string_view content,
              const core::Origin& origin = test_origin());

// Builders for the structs of optional fields (g++ 12 warns on designated
// initializers that leave fields out).
inline core::SetAttr set_size(std::uint64_t size) {
    core::SetAttr s;
    s.size = size;
    return s;
}
inline core::SetAttr set_mode(std::uint32_t mode) {
    core::SetAttr s;
    s.mode = mode;
    return s;
}
inline core::SetAttr set_owner(std::uint32_t uid, std::uint32_t gid) {
    core::SetAttr s;
    s.uid = uid;
    s.gid = gid;
    return s;
}
inline core::SetAttr set_times(std::int64_t atime_ns, std::int64_t mtime_ns) {
    core::SetAttr s;
    s.atime_ns = atime_ns;
    s.mtime_ns = mtime_ns;
    return s;
}
inline core::SetAttr set_mtime(std::int64_t mtime_ns) {
    core::SetAttr s;
    s.mtime_ns = mtime_ns;
    return s;
}
inline core::EvictRequest down_to_entries(std::uint64_t n) {
    core::EvictRequest r;
    r.max_entries = n;
    return r;
}
inline core::EvictRequest down_to_bytes(std::uint64_t n) {
    core::EvictRequest r;
    r.max_bytes = n;
    return r;
}
inline core::EvictRequest idle_longer_than(std::int64_t ns) {
    core::EvictRequest r;
    r.older_than_ns = ns;
    return r;
}

// ---- data -----------------------------------------------------------------------------

std::string random_bytes(std::size_t size, std::uint64_t seed);  // incompressible
std::string compressible_text(std::size_t size);                 // repetitive text
std::string all_byte_values();                                   // 0x00..0xff twice, NULs included

// A db written by an older schema (`data_mdb`, a fixture's data.mdb under
// tests/core/data), copied into `dir`/db as `kcache init` leaves a db; returns its path.
std::string copy_fixture_db(const TempDir& dir, const std::string& data_mdb);

// ---- independent checks ---------------------------------------------------------------

struct Node {
    core::FileType type = core::FileType::regular;
    std::uint32_t mode = 0;
    std::string data;  // file content or symlink target
    std::int64_t mtime_ns = 0;
    friend bool operator==(const Node&, const Node&) = default;
};
// Every node below the root by path ("a", "a/b"), read through the public API.
std::map<std::string, Node> tree_snapshot(const core::Txn& txn);
std::string describe_tree(const std::map<std::string, Node>& tree);

// Recomputes from the tree what the store reports: per-entry bytes and files, the
// entries/bytes/files/blobs/blob_raw_bytes gauges; and runs core::verify. Adds a
// failed CHECK for every disagreement.
void check_consistent(core::Store& store);

}  // namespace kcache::test

namespace Catch {
template <>
struct StringMaker<kcache::test::Outcome> {
    static std::string convert(const kcache::test::Outcome& o) {
        if (o.code == 0) return "success";
        return kcache::test::errno_name(o.code) + " (\"" + o.message + "\")";
    }
};
}  // namespace Catch
