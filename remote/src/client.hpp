// A Redis connection with kcache's own deadlines, over TCP, a Unix socket or TLS.
//
// hiredis 0.14's blocking mode cannot tell a timeout from an I/O error, its timeouts do
// not cover the whole exchange, and it has no TLS. So hiredis only opens the socket
// (non-blocking connect, TCP_NODELAY), formats commands and parses replies (its
// reader, limited by limit_replies); the connection moves the bytes itself, with
// send/recv or, for a `rediss://` endpoint, a TlsStream (tls.hpp), and every exchange
// (connect, TLS handshake, AUTH/SELECT, one pipeline of commands) runs under one
// deadline kept here with poll(2). Failures: ETIMEDOUT when the deadline passes, EIO (or
// the socket's errno) for a connection that fails or closes, EPROTO for a reply hiredis
// cannot parse or a TLS handshake that fails (a certificate refused: never a plaintext
// fallback). After any failure the connection is unusable (replies may be pending) and
// must be dropped. Error replies of the server are replies, not failures.
//
// Not thread-safe: one thread at a time (RedisPool::Server's mutex guards it).
// Internal to kcache_remote; tests use it to reach Redis directly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/remote/remote.hpp"

struct redisContext;
struct redisReply;
struct redisReader;

namespace kcache::remote {

class TlsContext;  // tls.hpp
class TlsStream;

using core::steady_ns;  // deadlines below are on this clock

struct Reply {
    enum class Type : std::uint8_t { string, array, integer, nil, status, error };
    Type type = Type::nil;
    std::string str;  // string, status, error
    long long integer = 0;
    std::vector<Reply> elements;

    bool is_error() const { return type == Type::error; }
    bool is_ok() const { return type == Type::status && str == "OK"; }
};

using Command = std::vector<std::string>;  // binary-safe arguments

// The whole replies in `bytes` (RESP, as a server sends them), parsed by hiredis's reader
// as Connection::exec parses a server's: EPROTO for bytes that are not RESP; a reply cut
// short at the end is left out. For the tests and fuzz targets of reply parsers.
Result<std::vector<Reply>> parse_replies(std::string_view bytes);
// hiredis's reply tree as ours (hiredis limits its depth to 7); adds the bytes of its
// values to `received` when given.
Reply reply_of(const redisReply* reply, std::uint64_t* received);
// Makes `reader` refuse an array of a negative count or over 2^20 elements (hiredis
// 0.14 would allocate its table first): the read fails instead (reply.cpp).
void limit_replies(redisReader* reader);

class Connection {
  public:
    // Connects and authenticates (AUTH [user] password when `password` is non-empty)
    // and selects the endpoint's db, all before `deadline_ns` (steady_ns clock).
    // EACCES when the server refuses the credentials. A `tls` endpoint needs `tls` (its
    // handshake is part of the connect, under the same deadline); EINVAL without it.
    static Result<std::unique_ptr<Connection>> open(const Endpoint& endpoint,
                                                    const std::string& password,
                                                    std::int64_t deadline_ns,
                                                    const TlsContext* tls = nullptr);
    ~Connection();
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Sends the commands as one pipeline and returns their replies in order.
    // `sent` / `received` add the bytes of arguments and reply values moved.
    Result<std::vector<Reply>> exec(const std::vector<Command>& commands, std::int64_t deadline_ns,
                                    std::uint64_t* sent = nullptr,
                                    std::uint64_t* received = nullptr);

  private:
    Connection(redisContext* context, std::string name);
    // Moves bytes one way: how many, or 0 with `want` set to what poll(2) must wait
    // for; an error when the connection failed or closed.
    Result<std::size_t> send_some(const char* data, std::size_t size, short& want);
    Result<std::size_t> receive_some(char* buffer, std::size_t size, short& want);
    // Waits until the socket is ready for `events` or the deadline passes (ETIMEDOUT
    // saying `what`).
    Status wait(short events, std::int64_t deadline_ns, std::string_view what);
    redisContext* m_context = nullptr;  // the socket (closed by redisFree) and the reader
    std::unique_ptr<TlsStream> m_tls;   // rediss://: every byte goes through it
    std::string m_name;                 // the endpoint's id, for messages
    std::string m_out;                  // commands formatted, not yet sent
    std::unique_ptr<char[]> m_in;       // bytes read, before the reader has them
};

}  // namespace kcache::remote
