// Maintenance: compaction, garbage collection, stale reader slots.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <optional>
#include <string>

#include "core_test_util.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;

namespace {

// A child process that opens the db (and optionally a read snapshot), tells the
// parent, and waits to be told to exit; then exits without closing anything, like a
// crash. The parent must not have the db open across the fork().
class DbChild {
  public:
    DbChild(const std::string& db, bool hold_snapshot) {
        REQUIRE(pipe(m_ready) == 0);
        REQUIRE(pipe(m_release) == 0);
        m_pid = fork();
        REQUIRE(m_pid >= 0);
        if (m_pid == 0) {
            core::OpenOptions options;
            options.path = db;
            auto store = core::Store::open(options);
            if (!store) _exit(4);
            std::optional<core::ReadTxn> snapshot;
            if (hold_snapshot) {
                auto txn = (*store)->read();
                if (!txn) _exit(5);
                snapshot.emplace(std::move(*txn));
            }
            char c = 1;
            if (::write(m_ready[1], &c, 1) != 1) _exit(6);
            if (::read(m_release[0], &c, 1) != 1) _exit(7);
            _exit(0);
        }
        char c = 0;
        REQUIRE(::read(m_ready[0], &c, 1) == 1);
    }
    int finish() {
        char c = 1;
        (void)!::write(m_release[1], &c, 1);
        int status = 0;
        waitpid(m_pid, &status, 0);
        m_pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    ~DbChild() {
        if (m_pid > 0) {
            kill(m_pid, SIGKILL);
            waitpid(m_pid, nullptr, 0);
        }
        for (int fd : {m_ready[0], m_ready[1], m_release[0], m_release[1]}) close(fd);
    }
    DbChild(const DbChild&) = delete;
    DbChild& operator=(const DbChild&) = delete;

  private:
    pid_t m_pid = -1;
    int m_ready[2] = {-1, -1};
    int m_release[2] = {-1, -1};
};

}  // namespace

TEST_CASE("maintenance: compact keeps every byte and needs the db to itself", "[maintenance]") {
    TestStore ts;
    for (int i = 0; i < 30; ++i) {
        ts.clock().advance();
        ts.put("e" + std::to_string(i) + "/kernel.cubin",
               random_bytes(32 << 10, static_cast<std::uint64_t>(i)));
    }
    KC_MUST(ts->evict(down_to_entries(5)));
    const auto before = tree_snapshot(ts.read());
    const auto stats_before = KC_MUST(ts.read().stats()).values;

    SECTION("refused with EBUSY while this process has it open") {
        CHECK(err(core::compact(ts.db_path())) == EBUSY);
        CHECK(tree_snapshot(ts.read()) == before);
    }
    SECTION("refused with EBUSY while another process has it open") {
        ts.close();
        {
            DbChild other(ts.db_path(), false);
            CHECK(err(core::compact(ts.db_path())) == EBUSY);
            CHECK(other.finish() == 0);
        }
        ts.reopen();
        CHECK(tree_snapshot(ts.read()) == before);
    }
    SECTION("alone, it shrinks data.mdb and keeps the content") {
        ts.close();
        auto report = KC_MUST(core::compact(ts.db_path()));
        CHECK(report.bytes_before > 0);
        CHECK(report.bytes_after < report.bytes_before);
        ts.reopen();
        CHECK(ts->data_file_bytes() == report.bytes_after);
        auto after = tree_snapshot(ts.read());
        CHECK(after == before);
        CHECK(KC_MUST(ts.read().stats()).values == stats_before);
        ts.put("new/kernel.cubin", "after compaction");
        check_consistent(ts.store());
    }
    SECTION("a missing db is an error") {
        CHECK_FALSE(core::compact((ts.dir() / "nope").string()).has_value());
    }
}

TEST_CASE("maintenance: collect_garbage reports the data file", "[maintenance]") {
    TestStore ts;
    ts.put("k/a", random_bytes(64 << 10, 1));
    {
        auto txn = ts.write();
        KC_MUST(txn.evict_entry(KC_MUST(txn.resolve("k"))));
        KC_MUST(txn.commit());
    }
    auto gc = KC_MUST(core::collect_garbage(ts.store()));
    CHECK(gc.file_bytes == ts->data_file_bytes());
    CHECK(gc.stale_leases == 0);
    CHECK(gc.free_pages > 0);
}

TEST_CASE("maintenance: reader slots of a dead process are cleared", "[maintenance]") {
    TestStore ts;
    ts.put("k/a", "x");
    ts.close();
    {
        DbChild crashed(ts.db_path(), true);
        ts.reopen();  // while the child holds its snapshot
        CHECK(crashed.finish() == 0);
    }
    auto cleared = KC_MUST(ts->clear_stale_readers());
    CHECK(cleared == 1);
    CHECK(KC_MUST(ts->clear_stale_readers()) == 0);
    ts.put("k/b", "writes still work");
    CHECK(ts.get("k/b") == "writes still work");
}
