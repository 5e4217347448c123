// Entries: per-entry accounting, misses and hits, pinning, LRU eviction and bounds.
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/staged.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::kRootIno;
using Names = std::vector<std::string>;

namespace {

void record_hit(TestStore& ts, const std::string& entry) {
    auto txn = ts.write();
    KC_MUST(txn.record_hit(KC_MUST(txn.resolve(entry))));
    KC_MUST(txn.commit());
}

void set_pinned(TestStore& ts, const std::string& entry, bool pinned) {
    auto txn = ts.write();
    KC_MUST(txn.set_pinned(KC_MUST(txn.resolve(entry)), pinned));
    KC_MUST(txn.commit());
}

// Entries e0..e{n-1}, one incompressible 4 KiB file each (all different: no dedup),
// one second apart: e0 oldest.
void fill(TestStore& ts, int n, const std::string& prefix = "e") {
    static std::uint64_t seed = 1000;
    for (int i = 0; i < n; ++i) {
        ts.clock().advance();
        ts.put(prefix + std::to_string(i) + "/kernel.cubin", random_bytes(4096, ++seed));
    }
}

}  // namespace

TEST_CASE("entries: an entry counts the bytes and files below it", "[entries]") {
    TestStore ts;
    ts.put("k/a.cubin", std::string(10, 'a'));
    ts.put("k/sub/b.json", std::string(20, 'b'));
    ts.put("k/c.ptx", std::string(30, 'c'));
    ts.put("other/x", std::string(5, 'x'));
    {
        auto txn = ts.write();
        KC_MUST(txn.symlink(KC_MUST(txn.resolve("k")), "link", "a.cubin"));
        KC_MUST(txn.mkdir(KC_MUST(txn.resolve("k")), "emptydir", 0755));
        KC_MUST(txn.commit());
    }
    auto e = ts.entry("k");
    CHECK(e.name == "k");
    CHECK(e.ino == ts.ino("k"));
    CHECK(e.bytes == 60);
    CHECK(e.files == 3);
    CHECK(ts.counter(Counter::entries) == 2);
    CHECK(ts.counter(Counter::bytes) == 65);
    CHECK(ts.counter(Counter::files) == 4);

    SECTION("overwrite changes bytes, not files") {
        ts.put("k/a.cubin", std::string(100, 'A'));
        CHECK(ts.entry("k").bytes == 150);
        CHECK(ts.entry("k").files == 3);
    }
    SECTION("unlink takes the file out") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(KC_MUST(txn.resolve("k/sub")), "b.json"));
        KC_MUST(txn.commit());
        CHECK(ts.entry("k").bytes == 40);
        CHECK(ts.entry("k").files == 2);
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: an empty entry directory is an entry that is not populated", "[entries]") {
    TestStore ts;
    ts.mkdirs("k");
    auto e = ts.entry("k");
    CHECK(e.files == 0);
    CHECK(e.bytes == 0);
    CHECK_FALSE(e.populated);
    CHECK(ts.counter(Counter::misses) == 0);
    CHECK(ts.counter(Counter::entries) == 1);

    SECTION("an empty file created but never written does not populate it") {
        auto txn = ts.write();
        KC_MUST(txn.create(KC_MUST(txn.resolve("k")), "lock", 0644, 0, 0, true));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::misses) == 0);
    }
    SECTION("removing it takes it out of the entries") {
        auto txn = ts.write();
        KC_MUST(txn.rmdir(kRootIno, "k"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::entries) == 0);
        CHECK(ts.entry_names().empty());
        auto r = ts.read();
        CHECK_FALSE(r.find_entry("k").has_value());
    }
}

TEST_CASE("entries: created, last access and populated-by come from the clock and Origin",
          "[entries]") {
    TestStore ts;
    const auto t0 = ts.clock().now();
    ts.put("k/kernel.cubin", "bin", core::Origin{31337, "triton-worker"});
    auto e = ts.entry("k");
    CHECK(e.created_ns == t0);
    CHECK(e.last_access_ns == t0);
    CHECK(e.last_hit_ns == 0);
    CHECK(e.hits == 0);
    CHECK(e.populated);
    CHECK(e.populated_by_pid == 31337);
    CHECK(e.populated_by_name == "triton-worker");
    CHECK_FALSE(e.pinned);

    SECTION("a later publish by another process moves last access, not the populator") {
        const auto t1 = ts.clock().advance(5 * kSecond);
        ts.put("k/kernel.json", "{}", core::Origin{999, "other"});
        auto e2 = ts.entry("k");
        CHECK(e2.created_ns == t0);
        CHECK(e2.last_access_ns == t1);
        CHECK(e2.populated_by_pid == 31337);
        CHECK(e2.populated_by_name == "triton-worker");
    }
}

TEST_CASE("entries: Origin::current names this process", "[entries]") {
    auto origin = core::Origin::current();
    CHECK(origin.pid == static_cast<std::uint32_t>(getpid()));
    std::ifstream comm("/proc/self/comm");
    std::string name;
    std::getline(comm, name);
    CHECK(origin.name == name);
}

TEST_CASE("entries: a Triton-like populate counts exactly one miss per entry", "[entries][stats]") {
    TestStore ts;
    {
        auto txn = ts.write();
        auto k = KC_MUST(txn.mkdir(kRootIno, "4fd1a9", 0755));
        for (const char* name : {"add_kernel.cubin", "add_kernel.json", "add_kernel.ptx"}) {
            auto f = KC_MUST(txn.create(k.ino, name, 0644));
            KC_MUST(txn.commit());
            txn = ts.write();
            KC_MUST(txn.write(f.ino, std::string("content of ") + name, test_origin()));
            KC_MUST(txn.commit());
            txn = ts.write();
        }
    }
    CHECK(ts.counter(Counter::misses) == 1);
    CHECK(ts.counter(Counter::stores) == 3);
    CHECK(ts.entry("4fd1a9").files == 3);

    SECTION("rewriting files of a populated entry is no new miss") {
        ts.put("4fd1a9/add_kernel.cubin", "recompiled");
        ts.put("4fd1a9/__grp__add_kernel.json", "{}");
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.counter(Counter::stores) == 5);
    }
    SECTION("a second entry is a second miss") {
        ts.put("77aa00/add_kernel.cubin", "x");
        CHECK(ts.counter(Counter::misses) == 2);
    }
    SECTION("an entry emptied and populated again is a new miss") {
        {
            auto txn = ts.write();
            auto k = KC_MUST(txn.resolve("4fd1a9"));
            for (const char* name : {"add_kernel.cubin", "add_kernel.json", "add_kernel.ptx"}) {
                KC_MUST(txn.unlink(k, name));
            }
            KC_MUST(txn.commit());
        }
        CHECK_FALSE(ts.entry("4fd1a9").populated);
        ts.put("4fd1a9/add_kernel.cubin", "again");
        CHECK(ts.counter(Counter::misses) == 2);
        CHECK(ts.entry("4fd1a9").populated);
    }
    SECTION("a flat-file entry (JAX) is one miss too") {
        ts.put("jit_fn-abcdef", "serialized executable");
        CHECK(ts.counter(Counter::misses) == 2);
        CHECK(ts.entry("jit_fn-abcdef").files == 1);
    }
}

TEST_CASE("entries: Triton's FileCacheManager.put flow counts one miss per entry",
          "[entries][stats]") {
    // triton/runtime/cache.py: each file is written into <key>/tmp.pid_<pid>_<uuid>/,
    // moved into <key>/ with os.replace, then os.removedirs walks upward from the tmp
    // dir and stops at the non-empty key dir.
    TestStore ts;
    const std::string key = "CJ5UKQ3LM3RFHPB";
    ts.mkdirs(key);
    int round = 0;
    for (const char* name :
         {"add_kernel.json", "add_kernel.ttir", "add_kernel.ttgir", "add_kernel.llir",
          "add_kernel.ptx", "add_kernel.cubin", "__grp__add_kernel.json"}) {
        auto txn = ts.write();
        auto k = KC_MUST(txn.resolve(key));
        const std::string tmp = "tmp.pid_77_" + std::to_string(round++);
        auto tmp_dir = KC_MUST(txn.mkdir(k, tmp, 0755));
        auto f = KC_MUST(txn.create(tmp_dir.ino, name, 0644));
        KC_MUST(txn.write(f.ino, std::string("content of ") + name, core::Origin{77, "python"}));
        KC_MUST(txn.commit());
        txn = ts.write();
        KC_MUST(txn.rename(tmp_dir.ino, name, k, name));
        KC_MUST(txn.rmdir(k, tmp));
        CHECK(err(txn.rmdir(kRootIno, key)) == ENOTEMPTY);
        KC_MUST(txn.commit());
    }
    auto e = ts.entry(key);
    CHECK(e.files == 7);
    CHECK(e.populated);
    CHECK(e.producer == core::Producer::triton);
    CHECK(ts.counter(Counter::misses) == 1);
    CHECK(ts.counter(Counter::stores) == 7);
    check_consistent(ts.store());
}

TEST_CASE("entries: rewriting the only file of an entry is no new miss", "[entries][stats]") {
    TestStore ts;
    const core::Origin first{111, "first-compiler"};
    const core::Origin second{222, "rewriter"};

    SECTION("a directory entry with one file, rewritten in place (Wave, Taichi)") {
        ts.put("k/kernel.vmfb", "v1", first);
        ts.put("k/kernel.vmfb", "v2", second);
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.entry("k").populated_by_pid == 111);
        CHECK(ts.entry("k").populated_by_name == "first-compiler");
    }
    SECTION("a flat-file entry rewritten in place (JAX)") {
        ts.put("jit_fn-abcdef", "v1", first);
        ts.put("jit_fn-abcdef", "v2", second);
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.entry("jit_fn-abcdef").populated_by_pid == 111);
    }
    SECTION("rewritten through a StagedFile with O_TRUNC") {
        auto f = ts.put("k/kernel.vmfb", "v1", first);
        auto staged = KC_MUST(core::StagedFile::begin(ts.store(), f, true));
        KC_MUST(staged.write(0, "v2"));
        KC_MUST(staged.publish(second));
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.entry("k").populated_by_pid == 111);
    }
    SECTION("truncated by setattr") {
        auto f = ts.put("k/kernel.vmfb", "v1 content", first);
        auto txn = ts.write();
        KC_MUST(txn.setattr(f, set_size(2)));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.entry("k").populated_by_pid == 111);
    }
    SECTION("moved into a subdirectory of the same entry") {
        ts.put("k/kernel.vmfb", "v1", first);
        {
            auto txn = ts.write();
            auto k = KC_MUST(txn.resolve("k"));
            auto sub = KC_MUST(txn.mkdir(k, "sub", 0755));
            KC_MUST(txn.rename(k, "kernel.vmfb", sub.ino, "kernel.vmfb"));
            KC_MUST(txn.commit());
        }
        CHECK(ts.entry("k").populated);
        ts.put("k/kernel.json", "{}", second);
        CHECK(ts.counter(Counter::misses) == 1);
        CHECK(ts.entry("k").populated_by_pid == 111);
    }
    std::size_t populates = 0;
    auto txn = ts.read();
    KC_MUST(txn.for_each_event(0, [&](const core::Event& e) {
        if (e.kind == core::EventKind::populate) ++populates;
        return true;
    }));
    CHECK(populates == 1);
    check_consistent(ts.store());
}

TEST_CASE("entries: Inductor publishing a tmp dir by rename keeps one entry and one miss",
          "[entries][rename]") {
    TestStore ts;
    ts.put("tmp.123/a.so", "shared object", core::Origin{55, "inductor"});
    ts.put("tmp.123/b.py", "python");
    REQUIRE(ts.counter(Counter::entries) == 0);  // a temp dir is bookkeeping (layout.hpp)
    REQUIRE(ts.counter(Counter::misses) == 0);
    auto tmp = ts.ino("tmp.123");
    {
        auto txn = ts.write();
        const core::Origin inductor{55, "inductor"};  // the renaming process populates
        KC_MUST(
            txn.rename(kRootIno, "tmp.123", kRootIno, "fxhash", core::kRenameNoReplace, &inductor));
        KC_MUST(txn.commit());
    }
    CHECK(ts.entry_names() == Names{"fxhash"});
    CHECK(ts.counter(Counter::entries) == 1);
    CHECK(ts.counter(Counter::misses) == 1);
    auto e = ts.entry("fxhash");
    CHECK(e.ino == tmp);
    CHECK(e.files == 2);
    CHECK(e.bytes == 19);
    CHECK(e.populated_by_pid == 55);
    auto r = ts.read();
    CHECK_FALSE(r.find_entry("tmp.123").has_value());

    SECTION("a second publisher finds the target taken: EEXIST / ENOTEMPTY, tmp kept") {
        ts.put("tmp.456/a.so", "shared object");
        auto txn = ts.write();
        CHECK(err(txn.rename(kRootIno, "tmp.456", kRootIno, "fxhash", core::kRenameNoReplace)) ==
              EEXIST);
        CHECK(err(txn.rename(kRootIno, "tmp.456", kRootIno, "fxhash")) == ENOTEMPTY);
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::entries) == 1);  // the temp dir is no entry
    }
    SECTION("replacing an empty target entry leaves one entry") {
        ts.mkdirs("other");
        ts.put("tmp.789/a.so", "x");
        auto txn = ts.write();
        KC_MUST(txn.rename(kRootIno, "tmp.789", kRootIno, "other"));
        KC_MUST(txn.commit());
        CHECK(ts.entry_names() == Names{"fxhash", "other"});
        CHECK(ts.entry("other").files == 1);
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: renaming across entries moves the accounting", "[entries][rename]") {
    TestStore ts;
    ts.put("A/f", std::string(100, 'f'));
    ts.put("A/sub/g", std::string(10, 'g'));
    ts.put("A/keep", std::string(1, 'k'));
    ts.put("B/h", std::string(1000, 'h'));
    auto A = ts.ino("A");
    auto B = ts.ino("B");

    SECTION("a file") {
        auto txn = ts.write();
        KC_MUST(txn.rename(A, "f", B, "f"));
        KC_MUST(txn.commit());
        CHECK(ts.entry("A").bytes == 11);
        CHECK(ts.entry("A").files == 2);
        CHECK(ts.entry("B").bytes == 1100);
        CHECK(ts.entry("B").files == 2);
        CHECK(ts.attr("B/f").entry == B);
    }
    SECTION("a file replacing one in the other entry") {
        auto txn = ts.write();
        KC_MUST(txn.rename(A, "f", B, "h"));
        KC_MUST(txn.commit());
        CHECK(ts.entry("A").bytes == 11);
        CHECK(ts.entry("B").bytes == 100);
        CHECK(ts.entry("B").files == 1);
        CHECK(ts.counter(Counter::bytes) == 111);
        CHECK(ts.counter(Counter::files) == 3);
    }
    SECTION("a subdirectory with its files") {
        auto txn = ts.write();
        KC_MUST(txn.rename(A, "sub", B, "sub"));
        KC_MUST(txn.commit());
        CHECK(ts.entry("A").bytes == 101);
        CHECK(ts.entry("A").files == 2);
        CHECK(ts.entry("B").bytes == 1010);
        CHECK(ts.entry("B").files == 2);
        CHECK(ts.attr("B/sub/g").entry == B);
        CHECK(ts.attr("B/sub").entry == B);
    }
    SECTION("a file out of an entry to the top becomes an entry of its own") {
        auto txn = ts.write();
        KC_MUST(txn.rename(A, "f", kRootIno, "flat"));
        KC_MUST(txn.commit());
        CHECK(ts.counter(Counter::entries) == 3);
        CHECK(ts.entry("flat").files == 1);
        CHECK(ts.entry("flat").bytes == 100);
        CHECK(ts.attr("flat").entry == ts.entry("flat").ino);  // a stem entry of its own
        CHECK(ts.entry("A").bytes == 11);
    }
    SECTION("a whole entry into another entry stops being an entry") {
        auto txn = ts.write();
        KC_MUST(txn.rename(kRootIno, "A", B, "nested"));
        KC_MUST(txn.commit());
        CHECK(ts.entry_names() == Names{"B"});
        CHECK(ts.counter(Counter::entries) == 1);
        CHECK(ts.entry("B").bytes == 1111);
        CHECK(ts.entry("B").files == 4);
        CHECK(ts.attr("B/nested/sub/g").entry == B);
    }
    SECTION("a subdirectory moved to the top becomes an entry") {
        auto txn = ts.write();
        KC_MUST(txn.rename(A, "sub", kRootIno, "promoted"));
        KC_MUST(txn.commit());
        CHECK(ts.entry("promoted").files == 1);
        CHECK(ts.entry("promoted").bytes == 10);
        CHECK(ts.attr("promoted/g").entry == ts.ino("promoted"));
        CHECK(ts.entry("A").files == 2);
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: record_hit counts hits, last hit and moves the entry in the LRU",
          "[entries][stats]") {
    TestStore ts;
    fill(ts, 3);
    CHECK(ts.lru_names() == Names{"e0", "e1", "e2"});
    const auto t = ts.clock().advance(10 * kSecond);
    record_hit(ts, "e0");
    auto e = ts.entry("e0");
    CHECK(e.hits == 1);
    CHECK(e.last_hit_ns == t);
    CHECK(e.last_access_ns == t);
    CHECK(ts.counter(Counter::hits) == 1);
    CHECK(ts.lru_names() == Names{"e1", "e2", "e0"});

    record_hit(ts, "e0");
    CHECK(ts.entry("e0").hits == 2);
    CHECK(ts.counter(Counter::hits) == 2);
    CHECK(ts.entry("e1").hits == 0);

    SECTION("a publish also counts as access") {
        ts.clock().advance();
        ts.put("e1/kernel.json", "{}");
        CHECK(ts.lru_names() == Names{"e2", "e0", "e1"});
    }
    SECTION("record_hit on a missing inode is ENOENT") {
        auto txn = ts.write();
        CHECK(err(txn.record_hit(987654)) == ENOENT);
    }
}

TEST_CASE("entries: for_each_entry lists in creation order and stops on false", "[entries]") {
    TestStore ts;
    fill(ts, 5);
    record_hit(ts, "e0");
    CHECK(ts.entry_names() == Names{"e0", "e1", "e2", "e3", "e4"});
    int seen = 0;
    auto txn = ts.read();
    KC_MUST(txn.for_each_entry([&](const core::EntryInfo&) { return ++seen < 2; }));
    CHECK(seen == 2);
    seen = 0;
    KC_MUST(txn.for_each_lru([&](const core::EntryInfo&) { return ++seen < 3; }));
    CHECK(seen == 3);
}

TEST_CASE("entries: pinning takes an entry out of the LRU and logs it", "[entries]") {
    TestStore ts;
    fill(ts, 3);
    set_pinned(ts, "e0", true);
    CHECK(ts.entry("e0").pinned);
    CHECK(ts.lru_names() == Names{"e1", "e2"});
    set_pinned(ts, "e0", false);
    CHECK_FALSE(ts.entry("e0").pinned);
    CHECK(ts.lru_names() == Names{"e0", "e1", "e2"});
    SECTION("pinned survives reopen") {
        set_pinned(ts, "e1", true);
        ts.reopen();
        CHECK(ts.entry("e1").pinned);
    }
}

TEST_CASE("entries: evict removes least recently used entries first", "[entries][evict]") {
    TestStore ts;
    fill(ts, 4);
    ts.clock().advance();
    record_hit(ts, "e0");  // order now e1 e2 e3 e0
    const auto stored_before = ts.counter(Counter::stored_bytes);

    SECTION("bounded by entries") {
        auto report = KC_MUST(ts->evict(down_to_entries(2)));
        CHECK(report.entries == 2);
        CHECK(report.bytes == 2 * 4096);
        CHECK(report.stored_bytes_freed > 0);
        CHECK(report.satisfied);
        CHECK(ts.entry_names() == Names{"e0", "e3"});
        CHECK_FALSE(ts.exists("e1"));
        CHECK_FALSE(ts.exists("e2/kernel.cubin"));
        CHECK(ts.counter(Counter::evicted_entries) == 2);
        CHECK(ts.counter(Counter::evicted_bytes) == 2 * 4096);
        CHECK(ts.counter(Counter::stored_bytes) == stored_before - report.stored_bytes_freed);
    }
    SECTION("bounded by stored bytes") {
        const auto per_entry = stored_before / 4;  // each entry's blob footprint
        auto report = KC_MUST(ts->evict(down_to_bytes(per_entry * 5 / 2)));
        CHECK(report.entries == 2);
        CHECK(report.satisfied);
        CHECK(ts.counter(Counter::stored_bytes) <= per_entry * 5 / 2);
        CHECK(ts.entry_names() == Names{"e0", "e3"});
    }
    SECTION("bounded by idle time") {
        // Last access: e1 1002s, e2 1003s, e3 1004s, e0 1005s. At 1010s, e1 and e2 have
        // been idle for more than 6s.
        ts.clock().set(1010 * kSecond);
        auto report = KC_MUST(ts->evict(idle_longer_than(6 * kSecond + 1)));
        CHECK(report.entries == 2);
        CHECK(ts.entry_names() == Names{"e0", "e3"});
    }
    SECTION("an empty request evicts nothing") {
        auto report = KC_MUST(ts->evict(core::EvictRequest{}));
        CHECK(report.entries == 0);
        CHECK(report.satisfied);
        CHECK(ts.counter(Counter::entries) == 4);
    }
    SECTION("already within bounds evicts nothing") {
        auto report = KC_MUST(ts->evict(down_to_entries(4)));
        CHECK(report.entries == 0);
        CHECK(report.satisfied);
    }
    SECTION("max_entries 0 clears everything") {
        auto report = KC_MUST(ts->evict(down_to_entries(0)));
        CHECK(report.entries == 4);
        CHECK(ts.counter(Counter::entries) == 0);
        CHECK(ts.counter(Counter::blobs) == 0);
        CHECK(ts.counter(Counter::stored_bytes) == 0);
        CHECK(ts.children("").empty());
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: eviction never touches pinned entries", "[entries][evict]") {
    TestStore ts;
    fill(ts, 4);
    set_pinned(ts, "e0", true);

    SECTION("the next oldest goes instead") {
        auto report = KC_MUST(ts->evict(down_to_entries(2)));
        CHECK(report.entries == 2);
        CHECK(report.satisfied);
        CHECK(ts.entry_names() == Names{"e0", "e3"});
    }
    SECTION("only pinned left: not satisfied") {
        set_pinned(ts, "e3", true);
        auto report = KC_MUST(ts->evict(down_to_entries(0)));
        CHECK(report.entries == 2);
        CHECK_FALSE(report.satisfied);
        CHECK(ts.entry_names() == Names{"e0", "e3"});
    }
    SECTION("evict_entry refuses a pinned entry with EPERM unless forced") {
        auto txn = ts.write();
        auto e0 = KC_MUST(txn.resolve("e0"));
        CHECK(err(txn.evict_entry(e0)) == EPERM);
        KC_MUST(txn.commit());
        CHECK(ts.exists("e0"));
        auto t2 = ts.write();
        KC_MUST(t2.evict_entry(e0, true));
        KC_MUST(t2.commit());
        CHECK_FALSE(ts.exists("e0"));
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: eviction never touches entries with a write in flight", "[entries][evict]") {
    TestStore ts;
    fill(ts, 4);

    SECTION("a StagedFile holds its entry") {
        auto staged =
            KC_MUST(core::StagedFile::begin(ts.store(), ts.ino("e0/kernel.cubin"), false));
        auto report = KC_MUST(ts->evict(down_to_entries(1)));
        CHECK(report.entries == 3);
        CHECK(report.skipped_in_flight == 1);
        CHECK(ts.entry_names() == Names{"e0"});
        KC_MUST(staged.publish(test_origin()));
    }
    SECTION("begin_write holds it until end_write") {
        auto f = ts.ino("e0/kernel.cubin");
        {
            auto txn = ts.write();
            KC_MUST(txn.begin_write(f));
            KC_MUST(txn.commit());
        }
        auto report = KC_MUST(ts->evict(down_to_entries(0)));
        CHECK(report.entries == 3);
        CHECK(report.skipped_in_flight == 1);
        CHECK_FALSE(report.satisfied);
        CHECK(ts.entry_names() == Names{"e0"});
        {
            auto txn = ts.write();
            CHECK(err(txn.evict_entry(KC_MUST(txn.resolve("e0")))) == EBUSY);
            KC_MUST(txn.end_write(f));
            KC_MUST(txn.commit());
        }
        report = KC_MUST(ts->evict(down_to_entries(0)));
        CHECK(report.entries == 1);
        CHECK(report.satisfied);
        CHECK(ts.counter(Counter::entries) == 0);
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: an eviction that reaches its bounds is satisfied, skipped entries or not",
          "[entries][evict]") {
    // EvictReport::satisfied is false only when the bounds were not reached.
    TestStore ts;
    fill(ts, 4);
    auto staged = KC_MUST(core::StagedFile::begin(ts.store(), ts.ino("e0/kernel.cubin"), false));
    auto report = KC_MUST(ts->evict(down_to_entries(1)));
    REQUIRE(report.skipped_in_flight == 1);
    CHECK(ts.counter(Counter::entries) == 1);
    CHECK(report.satisfied);
}

TEST_CASE("entries: evicting an entry does not break a reader's snapshot", "[entries][evict]") {
    TestStore ts;
    const auto bytes = random_bytes(64 << 10, 5);
    auto f = ts.put("k/kernel.cubin", bytes);
    auto reader = ts.read();
    auto before = KC_MUST(reader.read(f));
    {
        auto txn = ts.write();
        KC_MUST(txn.evict_entry(KC_MUST(txn.resolve("k"))));
        KC_MUST(txn.commit());
    }
    ts.put("other/fill", random_bytes(64 << 10, 6));  // may reuse freed pages
    CHECK_FALSE(ts.exists("k"));
    CHECK(before.bytes() == bytes);
    CHECK(KC_MUST(reader.read(f)).bytes() == bytes);
}

TEST_CASE("entries: evict_entry counts an eviction and removes the subtree", "[entries][evict]") {
    TestStore ts;
    ts.put("k/a", std::string(100, 'a'));
    ts.put("k/sub/b", std::string(50, 'b'));
    auto txn = ts.write();
    KC_MUST(txn.evict_entry(KC_MUST(txn.resolve("k"))));
    KC_MUST(txn.commit());
    CHECK_FALSE(ts.exists("k"));
    CHECK(ts.counter(Counter::evicted_entries) == 1);
    CHECK(ts.counter(Counter::evicted_bytes) == 150);
    CHECK(ts.counter(Counter::entries) == 0);
    CHECK(ts.counter(Counter::files) == 0);
    SECTION("a name used again starts a fresh entry") {
        ts.clock().advance();
        ts.put("k/a", "new");
        auto e = ts.entry("k");
        CHECK(e.files == 1);
        CHECK(e.hits == 0);
        CHECK(e.created_ns == ts.clock().now());
        CHECK(ts.counter(Counter::misses) == 2);
    }
    SECTION("a node that is not an entry is refused") {
        auto t2 = ts.write();
        auto f = KC_MUST(t2.create(KC_MUST(t2.mkdir(kRootIno, "x", 0755)).ino, "f", 0644));
        CHECK_FALSE(t2.evict_entry(f.ino).has_value());
        CHECK_FALSE(t2.evict_entry(kRootIno).has_value());
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: enforce_limits evicts down to the low mark once a bound is exceeded",
          "[entries][evict]") {
    TestStore ts;
    SECTION("entries: over 10 goes down to 9 (90%)") {
        {
            auto txn = ts.write();
            auto config = txn.config();
            config.max_entries = 10;
            KC_MUST(txn.set_config(config));
            KC_MUST(txn.commit());
        }
        fill(ts, 10);
        auto report = KC_MUST(ts->enforce_limits());
        CHECK(report.entries == 0);
        CHECK(ts.counter(Counter::entries) == 10);
        fill(ts, 1, "late");
        report = KC_MUST(ts->enforce_limits());
        CHECK(report.entries == 2);
        CHECK(ts.counter(Counter::entries) == 9);
        CHECK_FALSE(ts.exists("e0"));
        CHECK_FALSE(ts.exists("e1"));
        CHECK(ts.exists("late0"));
    }
    SECTION("bytes: over the bound goes down to the low mark") {
        fill(ts, 4);
        const auto per_entry = ts.counter(Counter::stored_bytes) / 4;  // blob footprint
        {
            auto txn = ts.write();
            auto config = txn.config();
            config.max_bytes = 4 * per_entry + 100;
            config.low_mark_percent = 50;
            KC_MUST(txn.set_config(config));
            KC_MUST(txn.commit());
        }
        CHECK(KC_MUST(ts->enforce_limits()).entries == 0);
        fill(ts, 1, "late");
        auto report = KC_MUST(ts->enforce_limits());
        // Low mark: 50% of four entries and a bit: two entries remain.
        CHECK(report.entries == 3);
        CHECK(ts.counter(Counter::stored_bytes) <= (4 * per_entry + 100) / 2);
        CHECK(ts.entry_names() == Names{"e3", "late0"});
    }
    SECTION("no bound configured: nothing is evicted") {
        fill(ts, 20);
        CHECK(KC_MUST(ts->enforce_limits()).entries == 0);
        CHECK(ts.counter(Counter::entries) == 20);
    }
    check_consistent(ts.store());
}

TEST_CASE("entries: a read-only store refuses to evict", "[entries][evict]") {
    TestStore ts;
    fill(ts, 2);
    ts.options().read_only = true;
    ts.reopen();
    CHECK(err(ts->evict(down_to_entries(0))) == EROFS);
    CHECK(ts.counter(Counter::entries) == 2);
}
