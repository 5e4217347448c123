// Redis Cluster's client side, the pure parts (internal to kcache_remote): key slots
// with hash tags, the CLUSTER SLOTS reply and the MOVED / ASK redirections. Every
// input comes from the network or a key and is treated as hostile: a reply of the
// wrong shape is EBADMSG (or no redirection), never a crash (tests/remote fuzzes both).
// Routing, the slot map and following redirections are Remote's (cluster.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client.hpp"

namespace kcache::remote::cluster {

inline constexpr std::uint32_t kSlots = 16384;

// The part of `key` that picks its slot: the text between the first '{' and the next
// '}' when that is not empty, else the whole key (Redis Cluster's hash tags).
std::string_view hash_tag(std::string_view key);
// CRC16 (XMODEM) of hash_tag(key), modulo kSlots: the key's slot, as Redis computes it.
std::uint16_t key_slot(std::string_view key);

// One range of slots and the address of the master that serves it.
struct SlotRange {
    std::uint16_t first = 0, last = 0;  // inclusive
    std::string host;
    std::uint16_t port = 0;
};
// The masters of a CLUSTER SLOTS reply. An empty host means the node that was asked
// (`asked_host`); a range whose master's address is unknown ("?") is left out (its
// slots stay unmapped until the next refresh). EBADMSG for a reply of another shape:
// not an array, a range out of 0..16383 or reversed, a port out of 1..65535.
core::Result<std::vector<SlotRange>> parse_slots(const Reply& reply, std::string_view asked_host);

// "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>".
struct Redirect {
    bool ask = false;  // ASK: this command once, after ASKING; MOVED: the slot moved for good
    std::uint16_t slot = 0;
    std::string host;  // empty in the reply: the node that answered (`asked_host`)
    std::uint16_t port = 0;
};
// The redirection an error reply names; nullopt for any other error or a malformed one.
std::optional<Redirect> parse_redirect(std::string_view error, std::string_view asked_host);

}  // namespace kcache::remote::cluster
