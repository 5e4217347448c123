// Store::open: creating, reopening, and refusing missing, corrupt or unwritable dbs.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "core_test_util.hpp"
#include "scoped_env.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
namespace fs = std::filesystem;

namespace {

// The bytes this process maps of `file`: LMDB maps data.mdb once, the length of its
// map size, so this is the reservation the environment got.
std::uint64_t mapped_bytes(const fs::path& file) {
    const std::string name = fs::canonical(file).string();
    std::ifstream maps("/proc/self/maps");
    std::uint64_t total = 0;
    for (std::string line; std::getline(maps, line);) {
        if (line.size() < name.size() ||
            line.compare(line.size() - name.size(), name.size(), name) != 0) {
            continue;
        }
        const auto dash = line.find('-');
        const auto space = line.find(' ');
        total += std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16) -
                 std::stoull(line.substr(0, dash), nullptr, 16);
    }
    return total;
}

core::OpenOptions options_for(const fs::path& path) {
    core::OpenOptions o;
    o.path = path.string();
    return o;
}

}  // namespace

TEST_CASE("open: create makes the directory and an empty db", "[open]") {
    TempDir dir;
    auto path = dir / "nested" / "db";
    auto store = KC_MUST(core::Store::open(options_for(path)));
    CHECK(fs::is_directory(path));
    CHECK(fs::exists(path / "data.mdb"));
    CHECK(store->path() == path.string());
    CHECK_FALSE(store->read_only());
    CHECK(store->data_file_bytes() > 0);
    auto txn = KC_MUST(store->read());
    CHECK(txn.config().entry_depth == 1);
    CHECK(txn.config().max_bytes == core::kDefaultMaxBytes);  // bounded by default: 10 GiB
    CHECK(txn.config().max_events == 100000);
}

TEST_CASE("open: a db kcache makes is private to its owner and an existing db keeps its mode",
          "[open]") {
    TempDir dir;
    auto mode_of = [](const fs::path& p) {
        struct stat st {};
        REQUIRE(::stat(p.c_str(), &st) == 0);
        return st.st_mode & 07777;
    };
    const auto made = dir / "made";
    { KC_MUST(core::Store::open(options_for(made))); }
    CHECK(mode_of(made) == 0700);  // cache contents are code: no other user reads them

    const auto shared = dir / "shared";
    fs::create_directories(shared);
    REQUIRE(::chmod(shared.c_str(), 0750) == 0);  // shared with a group on purpose
    { KC_MUST(core::Store::open(options_for(shared))); }
    CHECK(mode_of(shared) == 0750);
}

TEST_CASE("open: a db reopens with its content, config and entry depth", "[open]") {
    TestStore ts([](core::OpenOptions& o) { o.entry_depth = 2; });
    ts.put("ab/cdef/kernel.cubin", "bin");
    {
        auto txn = ts.write();
        auto config = txn.config();
        config.max_bytes = 123456789;
        config.max_entries = 77;
        config.low_mark_percent = 80;
        config.max_events = 500;
        KC_MUST(txn.set_config(config));
        KC_MUST(txn.commit());
    }
    ts.options().entry_depth = 1;  // ignored for an existing db
    ts.reopen();
    auto txn = ts.read();
    CHECK(txn.config().entry_depth == 2);
    CHECK(txn.config().max_bytes == 123456789);
    CHECK(txn.config().max_entries == 77);
    CHECK(txn.config().low_mark_percent == 80);
    CHECK(txn.config().max_events == 500);
    CHECK(ts.get("ab/cdef/kernel.cubin") == "bin");
    CHECK(ts.entry("ab/cdef").files == 1);
}

TEST_CASE("open: a missing db with create=false is ENOENT and creates nothing", "[open]") {
    TempDir dir;
    auto path = dir / "db";
    auto options = options_for(path);
    options.create = false;
    auto r = core::Store::open(options);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ENOENT);
    CHECK(r.error().message.find(path.string()) != std::string::npos);
    CHECK_FALSE(fs::exists(path));

    SECTION("an existing empty directory is not a db either") {
        fs::create_directory(path);
        auto r2 = core::Store::open(options);
        REQUIRE_FALSE(r2.has_value());
        CHECK(r2.error().code == ENOENT);
        CHECK_FALSE(fs::exists(path / "data.mdb"));
    }
    SECTION("read_only never creates") {
        options.read_only = true;
        options.create = true;
        CHECK(err(core::Store::open(options)) == ENOENT);
        CHECK_FALSE(fs::exists(path));
    }
}

TEST_CASE("open: a corrupt data.mdb is a clear error naming the path", "[open]") {
    TempDir dir;
    auto path = dir / "db";
    SECTION("garbage instead of a db") {
        fs::create_directory(path);
        write_file(path / "data.mdb", random_bytes(64 << 10, 5));
    }
    SECTION("a real db overwritten with garbage") {
        { auto store = KC_MUST(core::Store::open(options_for(path))); }
        const auto size = fs::file_size(path / "data.mdb");
        write_file(path / "data.mdb", std::string(size, '\xab'));
    }
    SECTION("a text file") {
        fs::create_directory(path);
        write_file(path / "data.mdb", std::string(20000, 'x'));
    }
    auto r = core::Store::open(options_for(path));
    REQUIRE_FALSE(r.has_value());
    INFO(describe(r.error()));
    CHECK(r.error().code == EUCLEAN);  // kCorruptDb (kcache/core/integrity.hpp)
    CHECK(r.error().message.find(path.string()) != std::string::npos);
}

TEST_CASE("open: read_only opens for reading and refuses writes with EROFS", "[open]") {
    TestStore ts;
    ts.put("k/a", "content");
    ts.options().read_only = true;
    ts.reopen();
    CHECK(ts->read_only());
    CHECK(ts.get("k/a") == "content");
    CHECK(err(ts->write()) == EROFS);
    CHECK(err(ts->update([](core::WriteTxn&) -> core::Status { return {}; })) == EROFS);
    CHECK(ts.counter(Counter::files) == 1);
}

TEST_CASE("open: a db in an unwritable directory is refused or opened read-only", "[open]") {
    TestStore ts;
    ts.put("k/a", "content");
    ts.close();
    if (geteuid() == 0) {
        WARN("running as root: permissions do not apply, unwritable-dir case skipped");
        return;
    }
    const auto db = fs::path(ts.db_path());
    fs::permissions(db / "data.mdb", fs::perms::owner_read | fs::perms::group_read);
    fs::permissions(db / "lock.mdb", fs::perms::owner_read | fs::perms::group_read);
    fs::permissions(db, fs::perms::owner_read | fs::perms::owner_exec);
    auto r = core::Store::open(ts.options());
    if (r) {
        // Accepted only as a read-only store.
        CHECK((*r)->read_only());
        CHECK(err((*r)->write()) == EROFS);
    } else {
        INFO(describe(r.error()));
        CHECK((r.error().code == EACCES || r.error().code == EROFS || r.error().code == EPERM));
        CHECK(r.error().message.find(ts.db_path()) != std::string::npos);
    }
}

TEST_CASE("open: two Stores on one db in one process work side by side", "[open]") {
    TestStore ts;
    ts.put("k/a", "from the first");
    auto second = KC_MUST(core::Store::open(ts.options()));
    {
        auto txn = KC_MUST(second->read());
        CHECK(KC_MUST(txn.read(KC_MUST(txn.resolve("k/a")))).bytes() == "from the first");
    }
    KC_MUST(second->update([](core::WriteTxn& txn) -> core::Status {
        auto f = txn.create(core::kRootIno, "flat", 0644);
        if (!f) return tl::unexpected(f.error());
        return txn.write(f->ino, "from the second", test_origin()).map([](auto&&) {});
    }));
    CHECK(ts.get("flat") == "from the second");

    SECTION("closing the first leaves the second working") {
        ts.close();
        KC_MUST(second->update([](core::WriteTxn& txn) -> core::Status {
            return txn.mkdir(core::kRootIno, "late", 0755).map([](auto&&) {});
        }));
        auto txn = KC_MUST(second->read());
        CHECK(KC_MUST(txn.resolve("late")) > core::kRootIno);
    }
    SECTION("closing the second leaves the first working") {
        second.reset();
        ts.put("k/b", "still works");
        CHECK(ts.get("k/b") == "still works");
    }
}

TEST_CASE("open: a db open read-only in this process can also be opened for writing", "[open]") {
    TestStore ts;
    ts.put("k/a", "content");
    auto options = ts.options();
    ts.close();
    options.read_only = true;
    auto reader = KC_MUST(core::Store::open(options));
    options.read_only = false;
    auto writer = core::Store::open(options);
    INFO((writer ? std::string("opened") : describe(writer.error())));
    REQUIRE(writer.has_value());
    KC_MUST((*writer)->update([](core::WriteTxn& txn) -> core::Status {
        return txn.mkdir(core::kRootIno, "written", 0755).map([](auto&&) {});
    }));
    CHECK(err(reader->write()) == EROFS);
    auto txn = KC_MUST(reader->read());
    CHECK(txn.resolve("written").has_value());
}

TEST_CASE("open: every durability mode works and sync succeeds", "[open]") {
    for (auto d :
         {core::Durability::full, core::Durability::no_meta_sync, core::Durability::none}) {
        INFO("durability " << static_cast<int>(d));
        TestStore ts([d](core::OpenOptions& o) { o.durability = d; });
        ts.put("k/a", "x");
        KC_MUST(ts->sync());
        ts.reopen();
        CHECK(ts.get("k/a") == "x");
    }
}

TEST_CASE("open: KCACHE_MAP_SIZE is a size as people write it", "[open]") {
    TempDir dir;
    SECTION("1T is a tebibyte") {
        ScopedEnv env("KCACHE_MAP_SIZE", "1T");
        auto store = KC_MUST(core::Store::open(options_for(dir / "db")));
        CHECK(mapped_bytes(dir / "db" / "data.mdb") == std::uint64_t{1} << 40);
    }
    SECTION("3G is three gibibytes") {
        ScopedEnv env("KCACHE_MAP_SIZE", "3G");
        auto store = KC_MUST(core::Store::open(options_for(dir / "db")));
        CHECK(mapped_bytes(dir / "db" / "data.mdb") == std::uint64_t{3} << 30);
    }
    SECTION("what is not a size is an error naming the variable, not another reservation") {
        ScopedEnv env("KCACHE_MAP_SIZE", "lots");
        auto store = core::Store::open(options_for(dir / "db"));
        REQUIRE_FALSE(store);
        CHECK(store.error().code == EINVAL);
        CHECK_THAT(store.error().message, Catch::Contains("KCACHE_MAP_SIZE"));
    }
}

TEST_CASE("open: the injected clock is the store's clock", "[open]") {
    TestStore ts;
    ts.clock().set(42 * kSecond);
    CHECK(ts->now_ns() == 42 * kSecond);
    auto before = core::system_clock_ns();
    core::OpenOptions o;
    o.path = (ts.dir() / "db2").string();
    auto store = KC_MUST(core::Store::open(o));
    CHECK(store->now_ns() >= before);
}

TEST_CASE("open: default_db_path follows KCACHE_DB, XDG_CACHE_HOME, HOME", "[open]") {
    SECTION("KCACHE_DB wins") {
        ScopedEnv db("KCACHE_DB", "/some/where/db");
        ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
        CHECK(core::default_db_path() == "/some/where/db");
    }
    SECTION("then XDG_CACHE_HOME") {
        ScopedEnv db("KCACHE_DB", nullptr);
        ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
        CHECK(core::default_db_path() == "/xdg/kcache/db");
    }
    SECTION("then HOME") {
        ScopedEnv db("KCACHE_DB", nullptr);
        ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
        ScopedEnv home("HOME", "/home/user");
        CHECK(core::default_db_path() == "/home/user/.cache/kcache/db");
    }
}

TEST_CASE("open: the data file does not keep growing under fill-evict churn", "[open][evict]") {
    TestStore ts;
    std::uint64_t after_first = 0;
    for (int round = 0; round < 10; ++round) {
        for (int i = 0; i < 20; ++i) {
            ts.clock().advance();
            ts.put("r" + std::to_string(round) + "e" + std::to_string(i) + "/kernel.cubin",
                   random_bytes(16 << 10, static_cast<std::uint64_t>(round * 100 + i)));
        }
        KC_MUST(ts->evict(down_to_entries(0)));
        if (round == 0) after_first = ts->data_file_bytes();
    }
    INFO("data.mdb after round 1: " << after_first
                                    << ", after round 10: " << ts->data_file_bytes());
    CHECK(ts->data_file_bytes() <= 2 * after_first);
    CHECK(ts.counter(Counter::entries) == 0);
}

TEST_CASE("open: errors keep their code and gain context", "[open]") {
    auto e = core::with_context(core::Error{ENOENT, "no such entry: k1"}, "export a.kcb");
    CHECK(e.code == ENOENT);
    CHECK(e.message.find("export a.kcb") == 0);
    CHECK(e.message.find("no such entry: k1") != std::string::npos);
    auto f = core::fail(EEXIST, "exists");
    CHECK(f.value().code == EEXIST);
    CHECK(f.value().message == "exists");
}
