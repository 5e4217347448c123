// Redis Cluster's pure parts: key slots, CLUSTER SLOTS and MOVED / ASK (cluster.hpp).
#include "cluster.hpp"

#include <cerrno>
#include <charconv>

#include <fmt/core.h>

namespace kcache::remote {

namespace cluster {

namespace {

tl::unexpected<core::Error> bad(std::string_view what) {
    return core::fail(EBADMSG, fmt::format("bad CLUSTER SLOTS reply: {}", what));
}

template <class T>
bool parse_number(std::string_view s, T& out) {
    if (s.empty()) return false;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
}

// "host:port", the host possibly an IPv6 address (the port is after the last ':').
bool split_address(std::string_view address, std::string_view asked_host, std::string& host,
                   std::uint16_t& port) {
    const std::size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return false;
    if (!parse_number(address.substr(colon + 1), port) || port == 0) return false;
    std::string_view h = address.substr(0, colon);
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    if (h == "?") return false;
    host = std::string(h.empty() ? asked_host : h);
    return !host.empty();
}

}  // namespace

std::string_view hash_tag(std::string_view key) {
    const std::size_t open = key.find('{');
    if (open == std::string_view::npos) return key;
    const std::size_t close = key.find('}', open + 1);
    if (close == std::string_view::npos || close == open + 1) return key;
    return key.substr(open + 1, close - open - 1);
}

std::uint16_t key_slot(std::string_view key) {
    std::uint16_t crc = 0;  // CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0
    for (const char ch : hash_tag(key)) {
        crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(ch) << 8);
        for (int bit = 0; bit < 8; ++bit)
            crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return static_cast<std::uint16_t>(crc % kSlots);
}

core::Result<std::vector<SlotRange>> parse_slots(const Reply& reply, std::string_view asked_host) {
    if (reply.is_error()) return bad(reply.str);
    if (reply.type != Reply::Type::array) return bad("not an array");
    std::vector<SlotRange> out;
    for (const Reply& range : reply.elements) {
        // [first, last, [host, port, id, ...] (the master), [replica]...]
        if (range.type != Reply::Type::array || range.elements.size() < 3)
            return bad("a range is not [first, last, master, ...]");
        const Reply& first = range.elements[0];
        const Reply& last = range.elements[1];
        const Reply& master = range.elements[2];
        if (first.type != Reply::Type::integer || last.type != Reply::Type::integer ||
            first.integer < 0 || last.integer < first.integer || last.integer >= kSlots) {
            return bad("a slot range is out of 0..16383 or reversed");
        }
        if (master.type != Reply::Type::array || master.elements.size() < 2 ||
            master.elements[0].type != Reply::Type::string ||
            master.elements[1].type != Reply::Type::integer) {
            return bad("a master is not [host, port, ...]");
        }
        const long long port = master.elements[1].integer;
        if (port < 1 || port > 65535) return bad("a port is out of 1..65535");
        const std::string& host = master.elements[0].str;
        if (host == "?") continue;  // the address is unknown for now
        SlotRange r;
        r.first = static_cast<std::uint16_t>(first.integer);
        r.last = static_cast<std::uint16_t>(last.integer);
        r.host = host.empty() ? std::string(asked_host) : host;
        r.port = static_cast<std::uint16_t>(port);
        if (r.host.empty()) continue;
        out.push_back(std::move(r));
    }
    return out;
}

std::optional<Redirect> parse_redirect(std::string_view error, std::string_view asked_host) {
    Redirect r;
    if (error.starts_with("MOVED ")) {
        error.remove_prefix(6);
    } else if (error.starts_with("ASK ")) {
        r.ask = true;
        error.remove_prefix(4);
    } else {
        return std::nullopt;
    }
    const std::size_t space = error.find(' ');
    if (space == std::string_view::npos) return std::nullopt;
    if (!parse_number(error.substr(0, space), r.slot) || r.slot >= kSlots) return std::nullopt;
    if (!split_address(error.substr(space + 1), asked_host, r.host, r.port)) return std::nullopt;
    return r;
}

}  // namespace cluster

}  // namespace kcache::remote
