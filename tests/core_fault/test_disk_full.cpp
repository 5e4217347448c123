// A full disk is an ENOSPC error, never corruption: the db lives on a small tmpfs.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "kcache/core/maintenance.hpp"
#include "kcache/core/store.hpp"
#include "temp_dir.hpp"
#include "tmpfs.hpp"

using namespace kcache::core;
using kcache::test::TempDir;

namespace {

std::string random_bytes(std::mt19937_64& rng, std::size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
}

}  // namespace

TEST_CASE("a full disk fails writes with ENOSPC, keeps every committed file, and recovers",
          "[core][fault]") {
    TempDir dir;
    kcache::test::Tmpfs small(dir.path() / "small", "6m");
    const std::string db = (small.path() / "db").string();
    // Ballast takes most of the space; removing it later frees the disk.
    const std::string ballast = (small.path() / "ballast").string();
    kcache::test::write_file(ballast, std::string(2 << 20, 'b'));

    std::mt19937_64 rng(42);
    std::vector<std::pair<std::string, std::string>> committed;  // name -> content
    int failure = 0;
    {
        auto store = Store::open({.path = db});
        REQUIRE(store);
        for (int i = 0; i < 200 && !failure; ++i) {
            const std::string name = "entry" + std::to_string(i);
            const std::string content = random_bytes(rng, 64 * 1024);  // incompressible
            auto txn = (*store)->write();
            REQUIRE(txn);
            auto d = txn->mkdir(kRootIno, name, 0755);
            REQUIRE(d);
            auto f = txn->create(d->ino, "k.cubin", 0644);
            REQUIRE(f);
            auto w = txn->write(f->ino, content, Origin::current());
            auto c = w ? txn->commit() : Status(tl::unexpected(w.error()));
            if (!c) {
                failure = c.error().code;
                INFO(c.error().message);
                CHECK(c.error().code == ENOSPC);
            } else {
                committed.emplace_back(name, content);
            }
        }
        REQUIRE(failure == ENOSPC);
        REQUIRE(committed.size() > 3);

        // Reads go on, and every committed file is intact.
        auto txn = (*store)->read();
        REQUIRE(txn);
        for (const auto& [name, content] : committed) {
            auto ino = txn->resolve(name + "/k.cubin");
            REQUIRE(ino);
            auto bytes = txn->read(*ino);
            REQUIRE(bytes);
            CHECK(bytes->bytes() == content);
        }
        auto report = verify(**store);
        REQUIRE(report);
        CHECK(report->ok());
    }

    // Space freed on the filesystem: writes succeed again, after a reopen too.
    std::filesystem::remove(ballast);
    auto store = Store::open({.path = db});
    REQUIRE(store);
    auto ok = (*store)->update([&](WriteTxn& txn) -> Status {
        auto d = txn.mkdir(kRootIno, "after", 0755);
        if (!d) return tl::unexpected(d.error());
        auto f = txn.create(d->ino, "k.cubin", 0644);
        if (!f) return tl::unexpected(f.error());
        auto w = txn.write(f->ino, "fresh", Origin::current());
        if (!w) return tl::unexpected(w.error());
        return {};
    });
    INFO((ok ? std::string() : ok.error().message));
    CHECK(ok);
    auto stats = (*store)->read().and_then([](const Txn& t) { return t.stats(); });
    REQUIRE(stats);
    CHECK(stats->get(Counter::entries) == committed.size() + 1);
    auto report = verify(**store);
    REQUIRE(report);
    CHECK(report->ok());
}
