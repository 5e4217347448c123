#include "cli_harness.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include <catch2/catch.hpp>

#ifndef KCACHE_CLI_PATH
#error "KCACHE_CLI_PATH must name the kcache binary"
#endif

namespace kcache::test {

namespace {

template <class T>
T ok(core::Result<T> result) {
    INFO((result ? std::string() : result.error().message));
    REQUIRE(result.has_value());
    return std::move(*result);
}

void ok(const core::Status& status) {
    INFO((status ? std::string() : status.error().message));
    REQUIRE(status.has_value());
}

}  // namespace

CliResult run_kcache(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env) {
    std::vector<std::string> argv{KCACHE_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(argv, env, {"KCACHE_DB"});
}

CliDb::CliDb() = default;

core::Store& CliDb::store(core::Clock clock) {
    if (!m_store || clock) {
        m_store.reset();
        core::OpenOptions options;
        options.path = path();
        options.clock = std::move(clock);
        m_store = ok(core::Store::open(options));
    }
    return *m_store;
}

core::Ino CliDb::add_entry(const std::string& name, const Files& files) {
    core::Store& s = store();
    auto txn = ok(s.write());
    const core::Origin origin{4242, "cli-test"};
    if (files.size() == 1 && files.front().first.empty()) {
        const core::Attr file = ok(txn.create(core::kRootIno, name, 0644));
        ok(txn.write(file.ino, files.front().second, origin));
        ok(txn.commit());
        return file.ino;
    }
    const core::Ino entry = ok(txn.mkdir(core::kRootIno, name, 0755)).ino;
    for (const auto& [path, content] : files) {
        core::Ino dir = entry;
        std::string rest = path;
        for (auto slash = rest.find('/'); slash != std::string::npos; slash = rest.find('/')) {
            const std::string part = rest.substr(0, slash);
            auto existing = txn.lookup(dir, part);
            dir = existing ? existing->ino : ok(txn.mkdir(dir, part, 0755)).ino;
            rest = rest.substr(slash + 1);
        }
        const core::Attr file = ok(txn.create(dir, rest, 0644));
        ok(txn.write(file.ino, content, origin));
    }
    ok(txn.commit());
    return entry;
}

void CliDb::record_hits(const std::string& name, int hits) {
    auto txn = ok(store().write());
    const core::EntryInfo entry = ok(txn.find_entry(name));
    for (int i = 0; i < hits; ++i) ok(txn.record_hit(entry.ino));
    ok(txn.commit());
}

CliResult CliDb::run(std::vector<std::string> args) {
    close();
    args.insert(args.begin(), {"--db", path()});
    return run_kcache(args);
}

nlohmann::json CliDb::json(std::vector<std::string> args) {
    const CliResult result = run(std::move(args));
    INFO("stderr: " << result.err);
    REQUIRE(result.exit_code == 0);
    return nlohmann::json::parse(result.out);
}

std::vector<std::string> CliDb::ls_names(std::vector<std::string> args) {
    args.insert(args.begin(), "ls");
    args.push_back("--json");
    std::vector<std::string> names;
    for (const auto& entry : json(args)) names.push_back(entry.at("name").get<std::string>());
    return names;
}

std::string random_bytes(std::size_t n, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(gen() & 0xff);
    return bytes;
}

}  // namespace kcache::test
