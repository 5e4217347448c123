// An in-memory Backend (remote/src/backend.hpp) for tests of the shared tier without
// Redis: strings, sets and hashes in maps over two shards (keys sharing a hash tag share
// one, as on Redis), answering the commands the tier sends as Redis would, and
// failures a test injects. One thread at a time (the tests call the Remote from one).
#pragma once

#include <cerrno>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend.hpp"
#include "cluster.hpp"
#include "kcache/remote/remote.hpp"

namespace kcache::test {

class FakeBackend final : public remote::Backend {
  public:
    // What the fake holds and saw: shared with the test, which reads and changes it.
    struct State {
        std::map<std::string, std::string> strings;
        std::map<std::string, std::set<std::string>> sets;
        std::map<std::string, std::map<std::string, std::string>> hashes;
        std::vector<remote::Command> log;  // every command received, in order
        std::size_t pipelines = 0;
        // Injected: an error for a pipeline that holds `command` (nullopt: it runs), as a
        // dead or frozen server fails it: the whole pipeline, counted.
        std::function<std::optional<core::Error>(const remote::Command& command)> fail;
        bool has(const std::string& key) const {
            return strings.count(key) || sets.count(key) || hashes.count(key);
        }
    };

    FakeBackend(std::shared_ptr<State> state, remote::AtomicCounts& counts)
        : m_state(std::move(state)), m_counts(counts) {
        m_shards[0].id = "fake-0";
        m_shards[1].id = "fake-1";
    }
    // A Remote::MakeBackend making a FakeBackend on `state`.
    static remote::Remote::MakeBackend maker(std::shared_ptr<State> state) {
        return [state](
                   const remote::Options&,
                   remote::AtomicCounts& counts) -> core::Result<std::unique_ptr<remote::Backend>> {
            return std::make_unique<FakeBackend>(state, counts);
        };
    }

    remote::Shard& shard(std::string_view key) override {
        return m_shards[remote::cluster::key_slot(key) % 2];
    }

    core::Result<std::vector<remote::Reply>> exec(
        remote::Shard&, const std::vector<remote::Command>& commands) override {
        ++m_state->pipelines;
        if (m_state->fail) {
            for (const remote::Command& c : commands) {
                if (auto e = m_state->fail(c)) {
                    (e->code == ETIMEDOUT ? m_counts.timeouts : m_counts.errors).fetch_add(1);
                    return tl::unexpected(*e);
                }
            }
        }
        std::vector<remote::Reply> replies;
        for (const remote::Command& c : commands) {
            m_state->log.push_back(c);
            replies.push_back(run(c));
        }
        return replies;
    }
    bool uploads_paused(remote::Shard&) override { return false; }
    std::vector<remote::Shard*> serving() override { return {&m_shards[0], &m_shards[1]}; }
    std::vector<remote::ServerState> states() override {
        return {{m_shards[0].id, "closed", false, 0}, {m_shards[1].id, "closed", false, 0}};
    }
    std::size_t probe() override { return 0; }

  private:
    using Reply = remote::Reply;
    static Reply status(std::string s) { return {Reply::Type::status, std::move(s), 0, {}}; }
    static Reply error(std::string s) { return {Reply::Type::error, std::move(s), 0, {}}; }
    static Reply integer(long long n) { return {Reply::Type::integer, {}, n, {}}; }
    static Reply string(std::string s) { return {Reply::Type::string, std::move(s), 0, {}}; }
    static Reply nil() { return {}; }
    static Reply array(std::vector<Reply> elements) {
        return {Reply::Type::array, {}, 0, std::move(elements)};
    }

    Reply run(const remote::Command& c) {
        State& s = *m_state;
        const std::string& op = c.at(0);
        if (op == "PING") return status("PONG");
        if (op == "GET") {
            auto it = s.strings.find(c.at(1));
            return it == s.strings.end() ? nil() : string(it->second);
        }
        if (op == "SET") {  // SET key value [NX] [PX ms]: the expiry is not kept
            bool nx = false;
            for (std::size_t i = 3; i < c.size(); ++i) nx = nx || c[i] == "NX";
            if (nx && s.has(c.at(1))) return nil();
            s.strings[c.at(1)] = c.at(2);
            return status("OK");
        }
        if (op == "EXISTS" || op == "DEL") {
            long long n = 0;
            for (std::size_t i = 1; i < c.size(); ++i) {
                if (!s.has(c[i])) continue;
                ++n;
                if (op != "DEL") continue;
                s.strings.erase(c[i]);
                s.sets.erase(c[i]);
                s.hashes.erase(c[i]);
            }
            return integer(n);
        }
        if (op == "SADD") {
            long long n = 0;
            for (std::size_t i = 2; i < c.size(); ++i) n += s.sets[c.at(1)].insert(c[i]).second;
            return integer(n);
        }
        if (op == "SCARD") return integer(static_cast<long long>(s.sets[c.at(1)].size()));
        if (op == "SMEMBERS") {
            std::vector<Reply> members;
            for (const std::string& m : s.sets[c.at(1)]) members.push_back(string(m));
            return array(std::move(members));
        }
        if (op == "HGETALL") {
            std::vector<Reply> fields;
            for (const auto& [k, v] : s.hashes[c.at(1)]) {
                fields.push_back(string(k));
                fields.push_back(string(v));
            }
            return array(std::move(fields));
        }
        // EVAL of the one script the fake knows: pull's lease taken while the manifest
        // (KEYS[1]) is absent. Others are refused as an unknown script would be.
        if (op == "EVAL" && c.size() >= 6 && c[2] == "2" &&
            c[1].starts_with("if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end")) {
            if (s.has(c[3])) return integer(-1);
            if (s.has(c[4])) return integer(0);
            s.strings[c[4]] = c[5];
            return integer(1);
        }
        return error("ERR the fake backend does not run '" + op + "' this way");
    }

    std::shared_ptr<State> m_state;
    remote::AtomicCounts& m_counts;
    remote::Shard m_shards[2];
};

}  // namespace kcache::test
