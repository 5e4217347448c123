// The lookup policy: what a LOOKUP of `name` in `parent` is answered, decided in one
// place (decide_lookup) and carried out elsewhere (Filesystem::answer_lookup,
// attributes.cpp: the replies, the waits, the counters). In order:
//  1. found, a directory, and this thread's retried walk revalidating the directory
//     of a name it was answered ESTALE for: wait for the filler (single flight, step 2;
//     single_flight.hpp), then answer again without waiting;
//  2. found: the entry;
//  3. an error of the db other than ENOENT: that error;
//  4. missing inside an entry another compile is filling: ESTALE (single flight,
//     step 1), unless just after a takeover or this is the thread's retry (step 3);
//  5. with the shared tier (remote_tier.hpp): a container it holds entries below is
//     made; a name that could be an entry is fetched (read_through: answer again once
//     pulled), or, the containers not read yet, answer again once they are (then with
//     read-through);
//  6. else a negative entry, for kernel::kNegativeTimeout, 0 inside an entry being
//     filled or unpopulated (a later probe reaches the daemon), at most
//     RemoteTier::kNegativeTimeoutS for a name another node may publish soon.
//
// decide_lookup reads only what LookupView answers, asked lazily in this order (each at
// most once): some questions record state (SingleFlight's retrying, retried and
// retry_first), so which are asked is part of the policy. It replies nothing, waits for
// nothing and takes no lock of its own; a test answers LookupView from a script
// (tests/fsd/test_fsd_lookup_policy.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kcache/core/store.hpp"
#include "remote_tier.hpp"
#include "single_flight.hpp"

namespace kcache::fsd {

// The request's facts.
struct LookupRequest {
    core::Ino parent = 0;
    std::string_view name;
    bool read_through = false;  // the shared tier may be asked (at most once per LOOKUP)
    bool may_wait = false;      // single flight may make it wait (at most once)
    bool flights = false;       // single flight is enabled
    bool remote = false;        // a shared tier is attached
};

// What the decision reads: the read transaction's view of the db and the units'
// state. Filesystem's answers from a read transaction, SingleFlight and RemoteTier.
class LookupView {
  public:
    virtual ~LookupView() = default;
    // The name in the read transaction.
    virtual core::Result<core::Attr> lookup() = 0;
    // SingleFlight::retrying for this request's thread and directory `dir` (records
    // that the thread waited).
    virtual std::optional<SingleFlight::Awaited> retrying(core::Ino dir) = 0;
    // The parent directory in the read transaction.
    virtual core::Result<core::Attr> parent() = 0;
    // An entry record in the read transaction.
    virtual core::Result<core::EntryInfo> entry(core::Ino entry) = 0;
    // SingleFlight::active: some process is at work in `entry`.
    virtual bool filling(core::Ino entry) = 0;
    // Just after a takeover (Filesystem::adopt_handles): no walk waits yet.
    virtual bool just_taken_over() = 0;
    // SingleFlight::retried: this LOOKUP is the retry of this thread's (forgets it).
    virtual bool retried() = 0;
    // SingleFlight::retry_first for this thread and the name in `entry` (records the
    // retry): true when another compile fills the entry.
    virtual bool retry_first(core::Ino entry) = 0;
    // RemoteTier::find.
    virtual RemoteTier::Found find() = 0;
};

struct LookupAction {
    enum class Kind : std::uint8_t {
        found,           // reply `attr`
        error,           // reply `error`
        wait,            // single flight, step 2: wait for `awaited`, then answer again
        estale,          // single flight, step 1: ESTALE
        make_container,  // the shared tier holds entries below: make the directory
        fetch,           // read the entry `remote_name` through, then answer again
        containers,      // answer again once the shared tier's containers are known
        negative,        // a negative entry for `negative_timeout`
    };
    Kind kind = Kind::negative;
    core::Attr attr{};
    core::Error error{};
    SingleFlight::Awaited awaited{};
    std::string remote_name;
    double negative_timeout = 0;
};

LookupAction decide_lookup(LookupView& view, const LookupRequest& request);

}  // namespace kcache::fsd
