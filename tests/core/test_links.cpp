// Special nodes (mknod: fifos, sockets, devices) and hard links (link), schema 4: what
// a POSIX suite checks on the mount. Names of one node stay inside its entry, so an
// eviction stays whole and exact; verify and the independent recount stay clean.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/entry_files.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::FileType;
using core::Ino;
using core::kRootIno;

namespace {

core::Attr make_special(TestStore& ts, std::string_view dir, std::string_view name,
                        std::uint32_t mode, std::uint64_t rdev = 0) {
    auto txn = ts.write();
    const Ino parent = mkdirs(txn, dir);
    auto made = KC_MUST(txn.mknod(parent, name, mode, rdev, 1000, 1000));
    KC_MUST(txn.commit());
    return made;
}

core::Attr link(TestStore& ts, std::string_view from, std::string_view dir, std::string_view name) {
    auto txn = ts.write();
    const Ino ino = KC_MUST(txn.resolve(from));
    const Ino parent = KC_MUST(txn.resolve(dir));
    auto made = KC_MUST(txn.link(ino, parent, name));
    KC_MUST(txn.commit());
    return made;
}

int link_error(TestStore& ts, std::string_view from, std::string_view dir, std::string_view name) {
    auto txn = ts.write();
    const Ino ino = KC_MUST(txn.resolve(from));
    const Ino parent = KC_MUST(txn.resolve(dir));
    auto made = txn.link(ino, parent, name);
    return made ? 0 : made.error().code;
}

void must_verify(core::Store& store) {
    auto report = KC_MUST(core::verify(store));
    for (const auto& p : report.problems) INFO(p);
    CHECK(report.ok());
    check_consistent(store);
}

}  // namespace

TEST_CASE("links: fifos, sockets and devices are plain nodes with their mode and rdev", "[links]") {
    TestStore ts;
    ts.put("k/kernel.bin", "bytes");  // an entry beside them
    const auto files_before = ts.counter(Counter::files);
    const auto misses_before = ts.counter(Counter::misses);
    const auto fifo = make_special(ts, "", "fifo", S_IFIFO | 0640);
    const auto sock = make_special(ts, "d", "sock", S_IFSOCK | 0600);
    const auto chr = make_special(ts, "d", "chr", S_IFCHR | 0644, makedev(4, 7));
    const auto blk = make_special(ts, "k", "blk", S_IFBLK | 0644, makedev(8, 1));
    ts.reopen();  // as stored
    auto txn = ts.read();
    for (const auto& [path, made] : {std::pair{"fifo", fifo}, std::pair{"d/sock", sock},
                                     std::pair{"d/chr", chr}, std::pair{"k/blk", blk}}) {
        INFO(path);
        const auto a = KC_MUST(txn.getattr(KC_MUST(txn.resolve(path))));
        CHECK(a.mode == made.mode);
        CHECK(a.type() == FileType::special);
        CHECK(a.uid == 1000);
        CHECK(a.size == 0);
        CHECK(a.nlink == 1);
        CHECK(a.rdev == made.rdev);
    }
    CHECK(S_ISFIFO(fifo.mode));
    CHECK(S_ISSOCK(sock.mode));
    CHECK(KC_MUST(txn.getattr(chr.ino)).rdev == makedev(4, 7));
    CHECK(KC_MUST(txn.getattr(blk.ino)).rdev == makedev(8, 1));
    CHECK(KC_MUST(txn.getattr(fifo.ino)).rdev == 0);
    // Never an entry of their own, never counted; inside an entry they go with it.
    CHECK(fifo.entry == 0);                   // at the root
    CHECK(sock.entry == ts.attr("d").entry);  // in d, an entry by the depth fallback
    CHECK(blk.entry == ts.entry("k").ino);
    CHECK(ts.counter(Counter::files) == files_before);
    CHECK(ts.counter(Counter::misses) == misses_before);
    CHECK(ts.entry("k").files == 1);
    CHECK(KC_MUST(core::entry_files(txn, ts.entry("k"))).size() == 1);  // not a file of it
    std::vector<FileType> types;
    KC_MUST(txn.readdir(KC_MUST(txn.resolve("d")), "", [&](const core::DirEntry& d) {
        types.push_back(d.type);
        return true;
    }));
    CHECK(types == std::vector<FileType>{FileType::special, FileType::special});
    must_verify(ts.store());

    // chmod, rename, unlink as any node; eviction of its entry takes it along.
    {
        auto w = ts.write();
        KC_MUST(w.setattr(fifo.ino, set_mode(0600)));
        KC_MUST(w.rename(kRootIno, "fifo", KC_MUST(w.resolve("d")), "fifo2"));
        KC_MUST(w.unlink(KC_MUST(w.resolve("d")), "sock"));
        KC_MUST(w.commit());
    }
    CHECK((ts.attr("d/fifo2").mode & 07777) == 0600);
    CHECK_FALSE(ts.exists("d/sock"));
    {
        auto w = ts.write();
        KC_MUST(w.evict_entry(ts.entry("k").ino));
        KC_MUST(w.commit());
    }
    CHECK_FALSE(ts.exists("k"));
    must_verify(ts.store());
}

TEST_CASE("links: mknod refuses what is no node and a name that exists", "[links]") {
    TestStore ts;
    auto txn = ts.write();
    CHECK(err(txn.mknod(kRootIno, "dir", S_IFDIR | 0755, 0)) == EINVAL);
    CHECK(err(txn.mknod(kRootIno, "lnk", S_IFLNK | 0777, 0)) == EINVAL);
    KC_MUST(txn.mknod(kRootIno, "f", S_IFIFO | 0644, 0));
    CHECK(err(txn.mknod(kRootIno, "f", S_IFIFO | 0644, 0)) == EEXIST);
    // A regular mode makes an empty file, exclusively (what mknod(2) does).
    auto reg = KC_MUST(txn.mknod(kRootIno, "r", S_IFREG | 0644, 0));
    CHECK(reg.is_regular());
    CHECK(err(txn.mknod(kRootIno, "r", S_IFREG | 0644, 0)) == EEXIST);
}

TEST_CASE("links: a second name inside an entry shares the node, its content and accounting",
          "[links]") {
    TestStore ts;
    const Ino file = ts.put("e/a", "content of a");
    ts.mkdirs("e/sub");
    const auto entry = ts.entry("e");
    const auto bytes = ts.counter(Counter::bytes);
    const auto linked = link(ts, "e/a", "e/sub", "b");
    CHECK(linked.ino == file);
    CHECK(linked.nlink == 2);
    CHECK(ts.attr("e/a").nlink == 2);
    CHECK(ts.attr("e/sub/b").ino == file);
    CHECK(ts.get("e/sub/b") == "content of a");
    CHECK(ts.entry("e").files == entry.files);  // one file, two names
    CHECK(ts.entry("e").bytes == entry.bytes);
    CHECK(ts.counter(Counter::bytes) == bytes);
    must_verify(ts.store());

    SECTION("a write through one name is read through the other") {
        auto txn = ts.write();
        KC_MUST(txn.write(file, "new content", test_origin()));
        KC_MUST(txn.commit());
        CHECK(ts.get("e/sub/b") == "new content");
        CHECK(ts.entry("e").bytes == std::string("new content").size());
        must_verify(ts.store());
    }
    SECTION("unlinking the node's own name keeps it under the other") {
        {
            auto txn = ts.write();
            KC_MUST(txn.unlink(KC_MUST(txn.resolve("e")), "a"));
            KC_MUST(txn.commit());
        }
        CHECK_FALSE(ts.exists("e/a"));
        CHECK(ts.attr("e/sub/b").nlink == 1);
        CHECK(ts.get("e/sub/b") == "content of a");
        CHECK(KC_MUST(ts.read().path(file)) == "e/sub/b");  // its own name now
        CHECK(ts.entry("e").files == 1);
        must_verify(ts.store());
        {
            auto txn = ts.write();
            KC_MUST(txn.unlink(KC_MUST(txn.resolve("e/sub")), "b"));
            KC_MUST(txn.commit());
        }
        CHECK(ts.entry("e").files == 0);
        CHECK(ts.counter(Counter::bytes) == 0);
        must_verify(ts.store());
    }
    SECTION("unlinking the further name keeps the node's own") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(KC_MUST(txn.resolve("e/sub")), "b"));
        KC_MUST(txn.commit());
        CHECK(ts.attr("e/a").nlink == 1);
        CHECK(ts.get("e/a") == "content of a");
        must_verify(ts.store());
    }
    SECTION("rename of one name over the other does nothing") {
        auto txn = ts.write();
        KC_MUST(txn.rename(KC_MUST(txn.resolve("e")), "a", KC_MUST(txn.resolve("e/sub")), "b"));
        CHECK(err(txn.rename(KC_MUST(txn.resolve("e")), "a", KC_MUST(txn.resolve("e/sub")), "b",
                             core::kRenameNoReplace)) == EEXIST);
        KC_MUST(txn.commit());
        CHECK(ts.attr("e/a").nlink == 2);
        CHECK(ts.attr("e/sub/b").ino == file);
        must_verify(ts.store());
    }
    SECTION("a name moves inside the entry; renaming over a name drops only that name") {
        const Ino other = ts.put("e/other", "other");
        {
            auto txn = ts.write();
            // The further name moves; then the own name replaces another file.
            KC_MUST(txn.rename(KC_MUST(txn.resolve("e/sub")), "b", KC_MUST(txn.resolve("e")), "c"));
            KC_MUST(txn.rename(KC_MUST(txn.resolve("e")), "a", KC_MUST(txn.resolve("e")), "other"));
            KC_MUST(txn.commit());
        }
        CHECK(ts.attr("e/c").ino == file);
        CHECK(ts.attr("e/other").ino == file);
        CHECK(ts.attr("e/other").nlink == 2);
        CHECK_FALSE(ts.read().getattr(other));
        CHECK(ts.entry("e").files == 1);
        must_verify(ts.store());
        // A file renamed over one of two names leaves the other.
        const Ino third = ts.put("e/third", "third");
        {
            auto txn = ts.write();
            KC_MUST(txn.rename(KC_MUST(txn.resolve("e")), "third", KC_MUST(txn.resolve("e")), "c"));
            KC_MUST(txn.commit());
        }
        CHECK(ts.attr("e/c").ino == third);
        CHECK(ts.attr("e/other").ino == file);
        CHECK(ts.attr("e/other").nlink == 1);
        CHECK(ts.entry("e").files == 2);
        must_verify(ts.store());
    }
    SECTION("evicting the entry removes every name and the node, exactly") {
        {
            auto txn = ts.write();
            KC_MUST(txn.evict_entry(ts.entry("e").ino));
            KC_MUST(txn.commit());
        }
        CHECK_FALSE(ts.exists("e"));
        CHECK_FALSE(ts.read().getattr(file));
        CHECK(ts.counter(Counter::files) == 0);
        CHECK(ts.counter(Counter::bytes) == 0);
        CHECK(ts.counter(Counter::blobs) == 0);
        must_verify(ts.store());
    }
    SECTION("the names survive a reopen") {
        ts.reopen();
        CHECK(ts.attr("e/sub/b").nlink == 2);
        must_verify(ts.store());
    }
}

TEST_CASE("links: names never leave their entry: EXDEV, as across file systems", "[links]") {
    TestStore ts;
    ts.put("e/a", "a");
    ts.put("f/x", "x");
    ts.mkdirs("e/d");
    CHECK(link_error(ts, "e/a", "f", "b") == EXDEV);  // another entry
    CHECK(link_error(ts, "e/a", "", "b") == EXDEV);   // the root: an entry of its own
    CHECK(link_error(ts, "e/a", "e", "a") == EEXIST);
    CHECK(link_error(ts, "e/d", "e", "d2") == EPERM);  // a directory
    link(ts, "e/a", "e/d", "b");
    {
        auto txn = ts.write();
        // Moving a name, or a directory holding one, out of the entry.
        CHECK(err(txn.rename(KC_MUST(txn.resolve("e")), "a", KC_MUST(txn.resolve("f")), "a")) ==
              EXDEV);
        CHECK(err(txn.rename(KC_MUST(txn.resolve("e")), "d", KC_MUST(txn.resolve("f")), "d")) ==
              EXDEV);
        CHECK(err(txn.rename(KC_MUST(txn.resolve("e")), "d", kRootIno, "d")) == EXDEV);
        // Inside the entry it moves.
        KC_MUST(txn.mkdir(KC_MUST(txn.resolve("e")), "d2", 0755));
        KC_MUST(txn.rename(KC_MUST(txn.resolve("e")), "d", KC_MUST(txn.resolve("e/d2")), "d"));
        KC_MUST(txn.commit());
    }
    CHECK(ts.attr("e/d2/d/b").nlink == 2);
    must_verify(ts.store());
}

TEST_CASE("links: two names in one stem entry are evicted together", "[links]") {
    TestStore ts;
    // JAX's pair: <key>-cache and <key>-atime are one stem entry in a container.
    const std::string key =
        "jit_f-0f3c6e8a1b2d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";
    const std::string other =
        "jit_g-1f3c6e8a1b2d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";
    ts.put("jax/" + key + "-cache", "executable");
    const auto entry = ts.entry("jax/" + key);
    link(ts, "jax/" + key + "-cache", "jax", key + "-atime");
    CHECK(ts.attr("jax/" + key + "-atime").nlink == 2);
    CHECK(ts.attr("jax/" + key + "-atime").entry == entry.ino);
    CHECK(link_error(ts, "jax/" + key + "-cache", "jax", other + "-cache") == EXDEV);
    must_verify(ts.store());
    {
        auto txn = ts.write();
        KC_MUST(txn.evict_entry(entry.ino));
        KC_MUST(txn.commit());
    }
    CHECK(ts.children("jax").empty());
    CHECK(ts.counter(Counter::files) == 0);
    must_verify(ts.store());
}

TEST_CASE("links: an older db gets the links table when first opened for writing",
          "[links][open]") {
    // The schema-2 fixture (also read by test_segments): read-only as it is, then upgraded.
    const std::string path = "0123456789abcdef0123456789abcdef/big.so";
    TempDir dir;
    const std::string db =
        copy_fixture_db(dir, std::string(KCACHE_TEST_DATA_DIR) + "/schema2/data.mdb");
    core::OpenOptions options;
    options.path = db;
    {
        options.read_only = true;
        auto store = KC_MUST(core::Store::open(options));
        CHECK(KC_MUST(core::verify(*store)).ok());
        auto txn = KC_MUST(store->read());
        CHECK(KC_MUST(txn.getattr(KC_MUST(txn.resolve(path)))).nlink == 1);
    }
    options.read_only = false;
    {
        auto store = KC_MUST(core::Store::open(options));
        auto txn = KC_MUST(store->write());
        const Ino file = KC_MUST(txn.resolve(path));
        const Ino dir_ino = KC_MUST(txn.resolve("0123456789abcdef0123456789abcdef"));
        CHECK(KC_MUST(txn.link(file, dir_ino, "big-link.so")).nlink == 2);
        KC_MUST(txn.mknod(dir_ino, "fifo", S_IFIFO | 0644, 0));
        KC_MUST(txn.commit());
        auto report = KC_MUST(core::verify(*store));
        for (const auto& p : report.problems) INFO(p);
        CHECK(report.ok());
    }
    options.read_only = true;  // and read back as schema 4
    auto store = KC_MUST(core::Store::open(options));
    auto txn = KC_MUST(store->read());
    CHECK(KC_MUST(txn.getattr(KC_MUST(txn.resolve(path)))).nlink == 2);
    CHECK(KC_MUST(txn.getattr(KC_MUST(txn.resolve("0123456789abcdef0123456789abcdef/fifo"))))
              .is_special());
    CHECK(KC_MUST(core::verify(*store)).ok());
}
