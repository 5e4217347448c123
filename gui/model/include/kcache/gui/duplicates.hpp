// Finding one binary stored under several entry keys: the sign of an unstable cache
// key (a compiler hashing something that does not change the code, so the same
// kernel lands under a new key again and again).
//
// Groups entries by the content digest (XXH3-128, core::Attr::digest) of their
// binary-role files (core::role_of: .cubin, .fatbin, .hsaco, .so, ...). Reading every
// entry's files takes a while on a large db, so the scan runs in slices: start(), then
// step() once per frame with a time budget, until done(). The scan reads one MVCC
// snapshot from start to end (it never blocks writers; it shows the db as it was at
// start).
//
// Thread: one thread (the UI thread). Failures: start() and step() return core's
// errors; the scan then stops and keeps what it found so far.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::gui {

struct DuplicateGroup {
    core::Digest digest;
    std::uint64_t size = 0;          // bytes of the binary
    std::string file_name;           // its name in the first entry ("kernel.cubin")
    std::vector<core::Ino> entries;  // distinct entries holding it, in ino order
    std::vector<std::string> keys;   // their keys, same order
    // Logical bytes of the extra copies (the store keeps the content once; the cost
    // is the compile and the cache entry, not the disk).
    std::uint64_t wasted_bytes() const { return size * (entries.size() - 1); }
};

class DuplicateScan {
  public:
    // Starts over on a fresh snapshot, scanning the given entries (in that order).
    core::Status start(const core::Store& store, std::vector<core::Ino> entries);
    // Scans for about `budget_ns` (at least one entry). Returns done().
    core::Result<bool> step(std::int64_t budget_ns);
    // Scans to the end (tests, benchmarks).
    core::Status run_to_end();

    bool started() const { return m_started; }
    bool running() const { return m_txn != nullptr; }
    bool done() const { return m_started && !m_txn; }
    std::size_t scanned() const { return m_next; }
    std::size_t total() const { return m_entries.size(); }
    std::uint64_t txn_id() const { return m_txn_id; }  // the snapshot scanned
    // Groups of two or more entries, most entries first (then most bytes wasted).
    // Complete once done().
    const std::vector<DuplicateGroup>& groups() const { return m_groups; }

  private:
    // One binary file seen: 40 bytes, sorted by digest at the end (a hash map of a
    // million digests costs several times more).
    struct Seen {
        core::Digest digest;
        core::Ino entry = 0;
        std::uint64_t size = 0;
        std::uint32_t name = 0;  // index into m_names
    };
    core::Status scan_entry(core::Ino entry);
    core::Status scan_dir(core::Ino entry, core::Ino dir);
    void note_binary(core::Ino entry, std::string_view name, const core::Attr& attr);
    core::Status finish();

    std::unique_ptr<core::Txn> m_txn;  // the snapshot, alive while running
    std::vector<core::Ino> m_entries;
    std::size_t m_next = 0;
    bool m_started = false;
    std::uint64_t m_txn_id = 0;
    std::vector<Seen> m_seen;
    std::vector<std::string> m_names;  // binary file names, each once ("kernel.cubin")
    std::unordered_map<std::string, std::uint32_t> m_name_ids;
    std::vector<DuplicateGroup> m_groups;
};

}  // namespace kcache::gui
