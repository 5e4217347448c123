// Several processes on one db: concurrent writers, and write leases of dead processes.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "core_test_util.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;

namespace {

// fork() + a child body that never returns into Catch: exit code 0 on success.
// The parent must not have the db open across fork().
class Child {
  public:
    template <class Fn>
    explicit Child(Fn&& body) {
        m_pid = fork();
        REQUIRE(m_pid >= 0);
        if (m_pid == 0) {
            int code = 1;
            try {
                code = body();
            } catch (...) {
                code = 2;
            }
            _exit(code);
        }
    }
    // Waits for the child; returns its exit code, or -signal.
    int wait() {
        int status = 0;
        while (waitpid(m_pid, &status, 0) < 0 && errno == EINTR) {
        }
        m_pid = -1;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return -WTERMSIG(status);
    }
    pid_t pid() const { return m_pid; }
    ~Child() {
        if (m_pid > 0) {
            kill(m_pid, SIGKILL);
            waitpid(m_pid, nullptr, 0);
        }
    }
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;

  private:
    pid_t m_pid = -1;
};

struct Pipe {
    int fds[2] = {-1, -1};
    Pipe() { REQUIRE(pipe(fds) == 0); }
    ~Pipe() {
        for (int fd : fds) {
            if (fd >= 0) close(fd);
        }
    }
    void signal() const {
        char c = 1;
        (void)!::write(fds[1], &c, 1);
    }
    bool wait() const {
        char c = 0;
        return ::read(fds[0], &c, 1) == 1;
    }
};

std::string content_of(int child, int n) {
    return "child " + std::to_string(child) + " entry " + std::to_string(n) + "\n" +
           std::string(static_cast<std::size_t>(n % 7) * 100, static_cast<char>('a' + child));
}

// Opens the db in a forked child: an environment of the child's own, default options.
auto open_store(const std::string& db) {
    core::OpenOptions options;
    options.path = db;
    return core::Store::open(options);
}

// Stores 200 entries, each in its own transaction. Returns an exit code.
int store_entries(const std::string& db, int child, const Pipe& start) {
    if (!start.wait()) return 3;
    auto store = open_store(db);
    if (!store) return 4;
    for (int n = 0; n < 200; ++n) {
        auto txn = (*store)->write();
        if (!txn) return 5;
        auto name = "c" + std::to_string(child) + "-" + std::to_string(n);
        auto dir = txn->mkdir(core::kRootIno, name, 0755);
        if (!dir) return 6;
        auto file = txn->create(dir->ino, "kernel.cubin", 0644);
        if (!file) return 7;
        auto origin = core::Origin::current();
        if (!txn->write(file->ino, content_of(child, n), origin)) return 8;
        if (!txn->commit()) return 9;
    }
    return 0;
}

}  // namespace

TEST_CASE("multiprocess: two processes writing one db at once lose nothing", "[multiprocess]") {
    TestStore ts;
    const auto db = ts.db_path();
    ts.close();  // created; not open across fork()

    Pipe start;
    Child first([&] { return store_entries(db, 1, start); });
    Child second([&] { return store_entries(db, 2, start); });
    start.signal();
    start.signal();
    CHECK(first.wait() == 0);
    CHECK(second.wait() == 0);

    ts.reopen();
    CHECK(ts.counter(Counter::entries) == 400);
    CHECK(ts.counter(Counter::files) == 400);
    CHECK(ts.counter(Counter::misses) == 400);
    CHECK(ts.counter(Counter::stores) == 400);
    auto txn = ts.read();
    int missing = 0, wrong = 0;
    for (int child = 1; child <= 2; ++child) {
        for (int n = 0; n < 200; ++n) {
            auto name = "c" + std::to_string(child) + "-" + std::to_string(n);
            auto ino = txn.resolve(name + "/kernel.cubin");
            if (!ino) {
                ++missing;
                continue;
            }
            auto content = txn.read(*ino);
            if (!content || content->bytes() != content_of(child, n)) ++wrong;
        }
    }
    CHECK(missing == 0);
    CHECK(wrong == 0);
    check_consistent(ts.store());
}

TEST_CASE("multiprocess: a name one process makes is visible to another at once",
          "[multiprocess]") {
    TestStore ts;
    const auto db = ts.db_path();
    ts.close();

    Pipe written, checked;
    Child writer([&] {
        auto store = open_store(db);
        if (!store) return 4;
        auto txn = (*store)->write();
        if (!txn) return 5;
        auto dir = txn->mkdir(core::kRootIno, "shared", 0755);
        if (!dir || !txn->commit()) return 6;
        written.signal();
        return checked.wait() ? 0 : 7;
    });
    ts.reopen();  // after fork(): the child does not inherit this environment
    REQUIRE(written.wait());
    CHECK(ts.exists("shared"));
    checked.signal();
    CHECK(writer.wait() == 0);
}

TEST_CASE("multiprocess: a write lease counts while its process lives and not after",
          "[multiprocess][evict]") {
    TestStore ts;
    for (int i = 0; i < 3; ++i) {
        ts.clock().advance();
        ts.put("e" + std::to_string(i) + "/kernel.cubin", "k" + std::to_string(i));
    }
    const auto file = ts.ino("e0/kernel.cubin");
    const auto entry = ts.ino("e0");
    const auto db = ts.db_path();
    ts.close();

    Pipe leased, release;
    Child holder([&] {
        auto store = open_store(db);
        if (!store) return 4;
        auto txn = (*store)->write();
        if (!txn || !txn->begin_write(file) || !txn->commit()) return 5;
        leased.signal();
        release.wait();
        _exit(0);  // dies holding the lease
    });
    ts.reopen();
    REQUIRE(leased.wait());
    CHECK(KC_MUST(ts.read().in_flight(entry)));
    auto report = KC_MUST(ts->evict(down_to_entries(0)));
    CHECK(report.entries == 2);
    CHECK(report.skipped_in_flight == 1);
    CHECK(ts.exists("e0"));

    release.signal();
    CHECK(holder.wait() == 0);
    CHECK_FALSE(KC_MUST(ts.read().in_flight(entry)));
    report = KC_MUST(ts->evict(down_to_entries(0)));
    CHECK(report.entries == 1);
    CHECK(report.satisfied);
    CHECK(ts.counter(Counter::entries) == 0);
}

TEST_CASE("multiprocess: collect_garbage reports a dead process's lease", "[multiprocess]") {
    TestStore ts;
    ts.put("e0/kernel.cubin", "k");
    const auto file = ts.ino("e0/kernel.cubin");
    const auto db = ts.db_path();
    ts.close();
    Pipe go;
    Child holder([&] {
        if (!go.wait()) return 3;
        auto store = open_store(db);
        if (!store) return 4;
        auto txn = (*store)->write();
        if (!txn || !txn->begin_write(file) || !txn->commit()) return 5;
        _exit(0);
    });
    ts.reopen();  // open before the lease is taken: only gc can drop it
    go.signal();
    CHECK(holder.wait() == 0);
    CHECK_FALSE(KC_MUST(ts.read().in_flight(ts.ino("e0"))));
    auto gc = KC_MUST(core::collect_garbage(ts.store()));
    CHECK(gc.stale_leases == 1);
    CHECK(gc.file_bytes == ts->data_file_bytes());
    CHECK(KC_MUST(core::collect_garbage(ts.store())).stale_leases == 0);
    CHECK(KC_MUST(core::verify(ts.store())).ok());
}

TEST_CASE("multiprocess: a child forked after the parent opened the db can use it",
          "[multiprocess]") {
    // Python compile workers fork from a parent that already has the cache open; the
    // child must get an environment of its own (LMDB's are not usable across fork()).
    TestStore ts;
    ts.put("parent/a", "from the parent");
    const auto db = ts.db_path();
    Child child([&] {
        auto store = open_store(db);
        if (!store) return 4;
        for (int n = 0; n < 20; ++n) {
            auto txn = (*store)->write();
            if (!txn) return 5;
            auto dir = txn->mkdir(core::kRootIno, "child" + std::to_string(n), 0755);
            if (!dir) return 6;
            auto f = txn->create(dir->ino, "a", 0644);
            if (!f || !txn->write(f->ino, "from the child", core::Origin::current())) return 7;
            if (!txn->commit()) return 8;
        }
        auto r = (*store)->read();
        if (!r) return 9;
        auto ino = r->resolve("parent/a");
        if (!ino) return 10;
        auto content = r->read(*ino);
        return content && content->bytes() == "from the parent" ? 0 : 11;
    });
    for (int n = 0; n < 20; ++n) ts.put("parent/f" + std::to_string(n), "parent writes meanwhile");
    CHECK(child.wait() == 0);
    CHECK(ts.counter(Counter::entries) == 21);
    CHECK(ts.get("child19/a") == "from the child");
    check_consistent(ts.store());
}

TEST_CASE("multiprocess: threads share one Store and move snapshots between them",
          "[multiprocess][threads]") {
    TestStore ts;
    auto writer = [&](int id) {
        for (int n = 0; n < 100; ++n) {
            auto txn = ts->write();
            if (!txn) return false;
            auto dir = txn->mkdir(core::kRootIno,
                                  "t" + std::to_string(id) + "-" + std::to_string(n), 0755);
            if (!dir) return false;
            auto f = txn->create(dir->ino, "kernel.cubin", 0644);
            if (!f || !txn->write(f->ino, "thread " + std::to_string(id), test_origin()))
                return false;
            if (!txn->commit()) return false;
        }
        return true;
    };
    bool ok1 = false, ok2 = false;
    std::thread t1([&] { ok1 = writer(1); });
    std::thread t2([&] { ok2 = writer(2); });
    t1.join();
    t2.join();
    CHECK(ok1);
    CHECK(ok2);
    CHECK(ts.counter(Counter::entries) == 200);

    auto snapshot = ts.read();
    std::string seen;
    std::thread reader([&] {
        auto ino = snapshot.resolve("t2-99/kernel.cubin");
        if (ino) {
            if (auto c = snapshot.read(*ino)) seen = std::string(c->bytes());
        }
    });
    reader.join();
    CHECK(seen == "thread 2");
    check_consistent(ts.store());
}

TEST_CASE("multiprocess: a forked child that dies holding a snapshot leaves a stale slot",
          "[multiprocess]") {
    // The parent has the db open when it forks. The child's reader slot must carry the
    // child's pid, so that it is recognised as stale once the child is gone; otherwise
    // the dead child's snapshot pins old pages for as long as the parent lives.
    TestStore ts;
    ts.put("k/a", "x");
    const auto db = ts.db_path();
    Pipe holding, release;
    Child child([&] {
        auto store = open_store(db);
        if (!store) return 4;
        auto snapshot = (*store)->read();
        if (!snapshot) return 5;
        holding.signal();
        release.wait();
        _exit(0);  // dies without ending the snapshot
    });
    REQUIRE(holding.wait());
    release.signal();
    CHECK(child.wait() == 0);
    CHECK(KC_MUST(ts->clear_stale_readers()) == 1);
}

TEST_CASE("multiprocess: a config another process sets is the next snapshot's config",
          "[multiprocess][config]") {
    // The decoded config is cached per environment (txn.cpp): a transaction reads the
    // stored bytes and decodes them again only when they changed, here in another process.
    TestStore ts;
    const auto db = ts.db_path();
    auto before = ts.read();  // decodes the config; this snapshot keeps it
    const std::uint64_t initial = before.config().max_bytes;
    REQUIRE(initial != 12345);
    Pipe changed;
    Child child([&] {
        auto store = open_store(db);
        if (!store) return 4;
        auto txn = (*store)->write();
        if (!txn) return 5;
        core::Config config = txn->config();
        config.max_bytes = 12345;
        config.low_mark_percent = 50;
        if (!txn->set_config(config) || !txn->commit()) return 6;
        changed.signal();
        return 0;
    });
    REQUIRE(changed.wait());
    CHECK(child.wait() == 0);
    CHECK(before.config().max_bytes == initial);  // a snapshot keeps the config it began with
    auto after = ts.read();
    CHECK(after.config().max_bytes == 12345);
    CHECK(after.config().low_mark_percent == 50);
    // And back, in this process: a write transaction's change is every later snapshot's.
    {
        auto txn = ts.write();
        core::Config config = txn.config();
        config.max_bytes = initial;
        REQUIRE(txn.set_config(config));
        CHECK(txn.config().max_bytes == initial);
        REQUIRE(txn.commit());
    }
    CHECK(ts.read().config().max_bytes == initial);
    CHECK(ts.read().config().low_mark_percent == 50);
    CHECK(after.config().max_bytes == 12345);
}
