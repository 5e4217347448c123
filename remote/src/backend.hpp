// The shared tier's transport seam (internal to kcache_remote): where the tier's keys
// live and how its commands reach them. The tier (push, pull, leases, jobs, families:
// transfer.cpp, pull.cpp, family_store.cpp) reaches storage only through a Backend;
// RedisPool (redis_pool.hpp: servers, a cluster's slots and redirections, circuit
// breakers, deadlines) is the product's one, and tests run the tier on an in-memory one
// (tests/remote/fake_backend.hpp).
//
// The vocabulary is the Redis commands the tier sends (client.hpp's Command and Reply),
// pipelined per shard: GET, SET key value [NX] [PX ms], EXISTS, DEL key..., SADD, SCARD,
// SMEMBERS, HGETALL, EVAL of the tier's scripts (compile leases, family members) and
// PING. The tier needs pipelines (a batch's manifests or blobs in one round trip per
// shard) and atomic scripts (take a lease only while the manifest is absent), so the
// seam passes commands rather than one get/put/remove call per key: a backend that is
// not Redis answers those commands as Redis would.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "client.hpp"
#include "kcache/remote/remote.hpp"

namespace kcache::remote {

// One place that holds keys (a Redis server, a cluster node): its id names it in
// messages. A Backend owns its shards; a Shard& stays valid while the Backend lives.
struct Shard {
    std::string id;
};

class Backend {
  public:
    virtual ~Backend() = default;
    // The shard that holds `key`. Keys sharing a hash tag (the text between '{' and '}',
    // cluster.hpp) share a shard, so that one pipeline or script reaches them all.
    virtual Shard& shard(std::string_view key) = 0;
    // Runs `commands` as one pipeline on `shard` (each command's keys are that shard's)
    // and returns their replies in order. Error replies are replies; a failure (ETIMEDOUT,
    // EIO, EAGAIN while a circuit is open, ...) fails the whole pipeline, and the backend
    // counts it (AtomicCounts::errors / timeouts), as it counts bytes moved.
    virtual Result<std::vector<Reply>> exec(Shard& shard, const std::vector<Command>& commands) = 0;
    // Whether `shard` refuses uploads for now (RedisPool: for a while after an OOM reply).
    virtual bool uploads_paused(Shard& shard) = 0;

    // For `kcache remote ping / stats` and idle recovery: the shards serving keys now
    // (sorted by id), each one's state, and the trial operation of each shard whose
    // circuit is open and whose cool-down has passed (how many were tried).
    virtual std::vector<Shard*> serving() = 0;
    virtual std::vector<ServerState> states() = 0;
    virtual std::size_t probe() = 0;
};

}  // namespace kcache::remote
