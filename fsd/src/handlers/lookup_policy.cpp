#include "lookup_policy.hpp"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "kcache/core/layout.hpp"
#include "kernel_attrs.hpp"

namespace kcache::fsd {
namespace {

using Kind = LookupAction::Kind;

LookupAction act(Kind kind) {
    LookupAction a;
    a.kind = kind;
    return a;
}

// Single flight's step 1 for a name missing in `request.parent`: true when it is to be
// answered ESTALE. Sets *negative_timeout for a name inside an entry that is
// unpopulated or being filled: 0, so that a later probe reaches the daemon.
bool first_miss(LookupView& view, const LookupRequest& request, double* negative_timeout) {
    auto dir = view.parent();
    if (!dir || !dir->is_dir() || dir->entry == 0 || dir->bookkeeping) return false;
    if (core::is_bookkeeping_name(request.name)) return false;
    const bool active = view.filling(dir->entry);
    if (!active) {
        auto entry = view.entry(dir->entry);
        if (!entry || entry->kind != core::EntryKind::node) return false;
        if (!entry->populated) *negative_timeout = 0;
        return false;
    }
    *negative_timeout = 0;
    // Just after a takeover a walk may be the retry of an ESTALE the dead daemon gave
    // (step 1), which this one does not know of: a second ESTALE would reach the caller.
    if (view.just_taken_over()) return false;
    if (view.retried()) return false;  // step 3: as it stands
    // Step 1: the kernel holds this directory's lock for this LOOKUP; ESTALE lets it go,
    // and the kernel retries the walk, whose lookup of the directory waits (step 2).
    return view.retry_first(dir->entry);
}

}  // namespace

LookupAction decide_lookup(LookupView& view, const LookupRequest& request) {
    double negative_timeout = kernel::kNegativeTimeout;
    auto attr = view.lookup();
    if (attr && request.may_wait && attr->is_dir() && request.flights) {
        // Single flight, step 2: the retried walk of a thread answered ESTALE looks
        // up the directory of the name it missed, holding no directory lock: wait.
        if (auto awaited = view.retrying(attr->ino)) {
            LookupAction a = act(Kind::wait);
            a.awaited = std::move(*awaited);
            return a;
        }
    }
    if (attr) {
        LookupAction a = act(Kind::found);
        a.attr = *attr;
        return a;
    }
    if (attr.error().code != ENOENT) {
        LookupAction a = act(Kind::error);
        a.error = attr.error();
        return a;
    }
    if (request.flights && first_miss(view, request, &negative_timeout)) return act(Kind::estale);
    // The shared tier (remote_tier.hpp): a name that could be an entry is fetched
    // on a tier thread, which answers this request; a container the tier holds
    // entries below is made here, so the compiler's walk goes on to its entry. The
    // kernel keeps a negative answer briefly, so what another node publishes is found.
    if (request.remote) {
        using Found = RemoteTier::Found::Kind;
        auto found = view.find();
        if (found.may_appear)
            negative_timeout = std::min(negative_timeout, RemoteTier::kNegativeTimeoutS);
        if (found.kind == Found::container) return act(Kind::make_container);
        if (request.read_through && (found.kind == Found::entry || found.kind == Found::unknown)) {
            if (found.kind == Found::unknown) return act(Kind::containers);
            LookupAction a = act(Kind::fetch);
            a.remote_name = std::move(found.name);
            return a;
        }
    }
    LookupAction a = act(Kind::negative);
    a.negative_timeout = negative_timeout;
    return a;
}

}  // namespace kcache::fsd
