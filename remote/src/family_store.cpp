// Family members in Redis (remote.hpp's record_family_member and family_members; keys,
// values and the script in families.hpp). Nothing here holds an LMDB transaction.
#include <unistd.h>

#include <chrono>
#include <map>

#include <fmt/core.h>

#include "backend.hpp"
#include "client.hpp"
#include "families.hpp"
#include "kcache/remote/remote.hpp"

namespace kcache::remote {

Status Remote::record_family_member(const core::FamilyMember& member) {
    if (m_options.read_only)
        return core::fail(EROFS, "the remote is read-only (--remote-read-only): no family member");
    core::FamilyMember m = member;
    char host[256] = {};
    if (m.host.empty() && gethostname(host, sizeof host - 1) == 0) m.host = host;
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    if (m.time_ns == 0)
        m.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
    const std::string key = families::member_key(m_options.ns, m.family);
    Shard& server = shard(key);  // the order key shares its tag: the same server or slot
    const auto replies = KCACHE_TRY(exec(
        server,
        {{"EVAL", families::kRecordScript, "2", key, families::order_key(m_options.ns, m.family),
          m.entry, families::encode_member(m), std::to_string(m.time_ns / 1'000'000),
          std::to_string(families::kMaxMembers), std::to_string(families::kTtlSeconds)}}));
    const Reply& r = replies.front();
    if (r.type != Reply::Type::integer)
        return tl::unexpected(reply_error(server, r, "family member"));
    return {};
}

Result<std::vector<std::vector<core::FamilyMember>>> Remote::family_members(
    const std::vector<std::string>& families) {
    std::vector<std::vector<core::FamilyMember>> out(families.size());
    std::map<Shard*, std::vector<std::size_t>> by_server;  // family indexes per server
    for (std::size_t i = 0; i < families.size(); ++i)
        by_server[&shard(families::member_key(m_options.ns, families[i]))].push_back(i);
    for (const auto& [server, indexes] : by_server) {
        std::vector<Command> commands;
        for (std::size_t i : indexes)
            commands.push_back({"HGETALL", families::member_key(m_options.ns, families[i])});
        const auto replies = KCACHE_TRY(exec(*server, commands));
        for (std::size_t k = 0; k < indexes.size(); ++k) {
            const Reply& r = replies[k];
            if (r.is_error() && r.str.starts_with("WRONGTYPE")) {  // not a hash: hostile
                m_counts.corrupt.fetch_add(1);
                continue;
            }
            if (r.type != Reply::Type::array)
                return tl::unexpected(reply_error(*server, r, "family members"));
            auto& members = out[indexes[k]];
            for (std::size_t e = 0; e + 1 < r.elements.size(); e += 2) {
                const Reply& field = r.elements[e];
                const Reply& value = r.elements[e + 1];
                if (field.type != Reply::Type::string || value.type != Reply::Type::string) {
                    m_counts.corrupt.fetch_add(1);
                    continue;
                }
                auto m = families::decode_member(field.str, value.str);
                if (!m || m->family != families[indexes[k]]) {  // hostile or another's
                    m_counts.corrupt.fetch_add(1);
                    continue;
                }
                members.push_back(std::move(*m));
            }
        }
    }
    return out;
}

Result<ExplainPass> explain_first_misses(Remote& remote, core::Store& store,
                                         std::uint64_t& after_seq, std::size_t max_families) {
    constexpr std::size_t kScan = 512;  // misses read per pass, at most
    ExplainPass pass;
    std::vector<core::Miss> misses;
    {
        auto txn = KCACHE_TRY(store.read());
        misses = KCACHE_TRY(core::first_misses(txn, after_seq, kScan));
    }  // the snapshot ends before Redis is asked
    std::vector<std::string> families;
    std::map<std::string, std::size_t> index;
    std::size_t asked = 0;
    for (; asked < misses.size(); ++asked) {
        const std::string& family = misses[asked].family;
        if (index.count(family)) continue;
        if (families.size() >= max_families) break;
        index.emplace(family, families.size());
        families.push_back(family);
    }
    misses.resize(asked);
    if (misses.empty()) return pass;
    auto members = remote.family_members(families);
    if (!members) {
        remote.count_family_error();
        return tl::unexpected(members.error());
    }
    pass.families = families.size();
    for (const core::Miss& m : misses) {
        const bool explained = KCACHE_TRY(core::explain_with_members(
            store, m.seq, (*members)[index.at(m.family)], remote.options().ns));
        pass.explained += explained ? 1 : 0;
        ++pass.misses;
        after_seq = m.seq;
    }
    return pass;
}

}  // namespace kcache::remote
