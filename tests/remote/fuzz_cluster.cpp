// libFuzzer target for the Redis Cluster reply parsers (remote/src/cluster.cpp), run by
// tests/support/run_fuzz.sh with clang++-14 -fsanitize=fuzzer,address,undefined. The
// input is bytes a node might send: RESP through hiredis's reader (as a connection reads
// them), then every reply as CLUSTER SLOTS, and every error (and the raw input) as a
// MOVED / ASK redirection. Anything must give a result or an error; what parses must
// be in range, or the target aborts.

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "client.hpp"
#include "cluster.hpp"

namespace {

void check(bool condition) {
    if (!condition) std::abort();
}

void check_redirect(std::string_view error) {
    namespace cluster = kcache::remote::cluster;
    const auto r = cluster::parse_redirect(error, "asked");
    if (!r) return;
    check(r->slot < cluster::kSlots);
    check(r->port != 0);
    check(!r->host.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace cluster = kcache::remote::cluster;
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    check_redirect(bytes);
    check(cluster::key_slot(bytes) < cluster::kSlots);
    const auto replies = kcache::remote::parse_replies(bytes);
    if (!replies) {
        check(!replies.error().message.empty());
        return 0;
    }
    for (const kcache::remote::Reply& reply : *replies) {
        if (reply.is_error()) check_redirect(reply.str);
        const auto ranges = cluster::parse_slots(reply, "asked");
        if (!ranges) {
            check(!ranges.error().message.empty());
            continue;
        }
        for (const auto& r : *ranges) {
            check(r.first <= r.last);
            check(r.last < cluster::kSlots);
            check(r.port != 0);
            check(!r.host.empty());
        }
    }
    return 0;
}
