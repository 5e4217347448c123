// The filesystem tree: lookup, create, mkdir, readdir, rename, unlink, rmdir, symlink,
// setattr, resolve, and the transaction rules around them.
#include <sys/stat.h>

#include <cerrno>
#include <string>
#include <vector>

#include "core_test_util.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;
using core::FileType;
using core::Ino;
using core::kRootIno;

namespace {

std::vector<std::string> readdir_names(const core::Txn& txn, Ino dir, std::string_view after = "") {
    std::vector<std::string> names;
    KC_MUST(txn.readdir(dir, after, [&](const core::DirEntry& d) {
        names.emplace_back(d.name);
        return true;
    }));
    return names;
}

}  // namespace

TEST_CASE("tree: the root is an empty directory that is its own parent", "[tree]") {
    TestStore ts;
    auto txn = ts.read();
    auto root = KC_MUST(txn.getattr(kRootIno));
    CHECK(root.ino == kRootIno);
    CHECK(root.is_dir());
    CHECK(S_ISDIR(root.mode));
    CHECK(root.parent == kRootIno);
    CHECK(root.depth == 0);
    CHECK(root.entry == 0);
    CHECK(readdir_names(txn, kRootIno).empty());
    CHECK(KC_MUST(txn.resolve("")) == kRootIno);
}

TEST_CASE("tree: mkdir makes a directory that lookup finds", "[tree]") {
    TestStore ts;
    auto txn = ts.write();
    auto dir = KC_MUST(txn.mkdir(kRootIno, "k", 0755, 12, 34));
    CHECK(dir.is_dir());
    CHECK(dir.mode == (S_IFDIR | 0755));
    CHECK(dir.uid == 12);
    CHECK(dir.gid == 34);
    CHECK(dir.parent == kRootIno);
    CHECK(dir.depth == 1);
    CHECK(dir.entry == dir.ino);  // depth 1 is the entry depth
    CHECK(dir.ino != kRootIno);

    SECTION("the transaction sees its own writes") {
        CHECK(KC_MUST(txn.lookup(kRootIno, "k")).ino == dir.ino);
    }
    SECTION("after commit every new snapshot sees it, with the same attributes") {
        KC_MUST(txn.commit());
        auto r = ts.read();
        auto found = KC_MUST(r.lookup(kRootIno, "k"));
        CHECK(found.ino == dir.ino);
        CHECK(found.mode == dir.mode);
        CHECK(found.is_dir());
        auto sub = ts.mkdirs("k/sub");
        CHECK(ts.attr("k/sub").depth == 2);
        CHECK(ts.attr("k/sub").entry == dir.ino);
        CHECK(ts.attr("k/sub").parent == dir.ino);
        CHECK(sub != dir.ino);
    }
    SECTION("an existing name fails with EEXIST and the transaction stays usable") {
        CHECK(err(txn.mkdir(kRootIno, "k", 0755)) == EEXIST);
        KC_MUST(txn.mkdir(kRootIno, "other", 0700));
        KC_MUST(txn.commit());
        CHECK(ts.children("") == std::vector<std::string>{"k", "other"});
    }
    SECTION("a missing parent is ENOENT, a file as parent is ENOTDIR") {
        CHECK(err(txn.mkdir(987654, "x", 0755)) == ENOENT);
        auto file = KC_MUST(txn.create(dir.ino, "f", 0644));
        CHECK(err(txn.mkdir(file.ino, "x", 0755)) == ENOTDIR);
    }
}

TEST_CASE("tree: lookup of a missing name is ENOENT, below a file ENOTDIR", "[tree]") {
    TestStore ts;
    ts.put("k/f", "x");
    auto txn = ts.read();
    CHECK(err(txn.lookup(kRootIno, "nope")) == ENOENT);
    CHECK(err(txn.lookup(ts.ino("k"), "nope")) == ENOENT);
    CHECK(err(txn.lookup(ts.ino("k/f"), "x")) == ENOTDIR);
    CHECK(err(txn.getattr(987654)) == ENOENT);
    CHECK(err(txn.resolve("k/nope")) == ENOENT);
    CHECK(err(txn.resolve("k/f/x")) == ENOTDIR);
}

TEST_CASE("tree: create makes an empty regular file and exclusive create fails with EEXIST",
          "[tree]") {
    TestStore ts;
    auto dir = ts.mkdirs("k");
    auto txn = ts.write();
    auto file = KC_MUST(txn.create(dir, "a.cubin", 0640, 7, 8));
    CHECK(file.is_regular());
    CHECK(file.mode == (S_IFREG | 0640));
    CHECK(file.size == 0);
    CHECK(file.uid == 7);
    CHECK(file.gid == 8);
    CHECK(file.parent == dir);
    CHECK(file.entry == dir);
    CHECK(file.depth == 2);
    CHECK(file.digest.empty());
    CHECK(KC_MUST(txn.read(file.ino)).bytes().empty());

    SECTION("create of an existing file returns it unchanged") {
        KC_MUST(txn.write(file.ino, "content", test_origin()));
        auto again = KC_MUST(txn.create(dir, "a.cubin", 0600));
        CHECK(again.ino == file.ino);
        CHECK(again.size == 7);
        CHECK(KC_MUST(txn.read(file.ino)).bytes() == "content");
    }
    SECTION("O_EXCL on an existing file is EEXIST and changes nothing") {
        KC_MUST(txn.write(file.ino, "content", test_origin()));
        KC_MUST(txn.commit());
        auto t2 = ts.write();
        CHECK(err(t2.create(dir, "a.cubin", 0600, 0, 0, true)) == EEXIST);
        KC_MUST(t2.commit());
        CHECK(ts.get("k/a.cubin") == "content");
        CHECK(ts.attr("k/a.cubin").mode == (S_IFREG | 0640));
    }
    SECTION("O_EXCL on a new name succeeds") {
        auto lock = KC_MUST(txn.create(dir, "a.lock", 0600, 0, 0, true));
        CHECK(lock.is_regular());
    }
    SECTION("create over a directory or a symlink name fails") {
        KC_MUST(txn.mkdir(dir, "d", 0755));
        auto over_dir = txn.create(dir, "d", 0644);
        CHECK_FALSE(over_dir.has_value());
        KC_MUST(txn.symlink(dir, "l", "target"));
        CHECK(err(txn.create(dir, "l", 0644, 0, 0, true)) == EEXIST);
        CHECK(KC_MUST(txn.lookup(dir, "d")).is_dir());
    }
    SECTION("an aborted transaction leaves nothing behind") {
        { auto dropped = std::move(txn); }
        CHECK_FALSE(ts.exists("k/a.cubin"));
    }
}

TEST_CASE("tree: readdir lists children in byte order and resumes after a name", "[tree]") {
    TestStore ts;
    auto dir = ts.mkdirs("k");
    const std::vector<std::string> created = {"b",  "a", "B", "10", "9", "a1", "\xc3\xa9t\xc3\xa9",
                                              "_x", "A"};
    {
        auto txn = ts.write();
        for (const auto& n : created) KC_MUST(txn.create(dir, n, 0644));
        KC_MUST(txn.mkdir(dir, "sub", 0755));
        KC_MUST(txn.symlink(dir, "link", "a"));
        KC_MUST(txn.commit());
    }
    const std::vector<std::string> sorted = {
        "10", "9", "A", "B", "_x", "a", "a1", "b", "link", "sub", "\xc3\xa9t\xc3\xa9"};
    auto txn = ts.read();

    SECTION("all children, sorted as bytes, without . and ..") {
        CHECK(readdir_names(txn, dir) == sorted);
    }
    SECTION("types and inode numbers match lookup") {
        KC_MUST(txn.readdir(dir, "", [&](const core::DirEntry& d) {
            auto a = KC_MUST(txn.lookup(dir, d.name));
            CHECK(a.ino == d.ino);
            CHECK(a.type() == d.type);
            return true;
        }));
        std::map<std::string, FileType> types;
        KC_MUST(txn.readdir(dir, "", [&](const core::DirEntry& d) {
            types[std::string(d.name)] = d.type;
            return true;
        }));
        CHECK(types["sub"] == FileType::directory);
        CHECK(types["link"] == FileType::symlink);
        CHECK(types["a"] == FileType::regular);
    }
    SECTION("resuming after a name continues with the next one") {
        CHECK(readdir_names(txn, dir, "a1") ==
              std::vector<std::string>{"b", "link", "sub", "\xc3\xa9t\xc3\xa9"});
        CHECK(readdir_names(txn, dir, "\xc3\xa9t\xc3\xa9").empty());
    }
    SECTION("resuming after a name that no longer exists continues with the next greater") {
        CHECK(readdir_names(txn, dir, "aa") ==
              std::vector<std::string>{"b", "link", "sub", "\xc3\xa9t\xc3\xa9"});
        CHECK(readdir_names(txn, dir, "0") == sorted);
    }
    SECTION("returning false stops the listing") {
        std::vector<std::string> seen;
        KC_MUST(txn.readdir(dir, "", [&](const core::DirEntry& d) {
            seen.emplace_back(d.name);
            return seen.size() < 3;
        }));
        CHECK(seen == std::vector<std::string>{"10", "9", "A"});
    }
    SECTION("listing page by page visits each child once") {
        std::vector<std::string> all;
        std::string after;
        for (;;) {
            std::vector<std::string> page;
            KC_MUST(txn.readdir(dir, after, [&](const core::DirEntry& d) {
                page.emplace_back(d.name);
                return page.size() < 2;
            }));
            if (page.empty()) break;
            all.insert(all.end(), page.begin(), page.end());
            after = page.back();
        }
        CHECK(all == sorted);
    }
    SECTION("the children of another directory do not leak in") {
        CHECK(readdir_names(txn, KC_MUST(txn.resolve("k/sub"))).empty());
        CHECK(readdir_names(txn, kRootIno) == std::vector<std::string>{"k"});
    }
    SECTION("readdir of a file is ENOTDIR, of a missing inode ENOENT") {
        auto file = KC_MUST(txn.resolve("k/a"));
        CHECK(err(txn.readdir(file, "", [](const core::DirEntry&) { return true; })) == ENOTDIR);
        CHECK(err(txn.readdir(987654, "", [](const core::DirEntry&) { return true; })) == ENOENT);
    }
}

TEST_CASE("tree: rename within a directory and across directories", "[tree][rename]") {
    TestStore ts;
    auto a = ts.put("k/a", "AAA");
    ts.put("k/b", "BB");
    ts.mkdirs("k/d/e");
    auto k = ts.ino("k");

    SECTION("to a new name: the inode moves, the old name is gone") {
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "a", k, "c"));
        KC_MUST(txn.commit());
        CHECK(ts.ino("k/c") == a);
        CHECK_FALSE(ts.exists("k/a"));
        CHECK(ts.get("k/c") == "AAA");
    }
    SECTION("over an existing file: the target is replaced atomically") {
        auto before = ts.read();
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "a", k, "b"));
        KC_MUST(txn.commit());
        CHECK(ts.ino("k/b") == a);
        CHECK(ts.get("k/b") == "AAA");
        CHECK_FALSE(ts.exists("k/a"));
        CHECK(ts.children("k") == std::vector<std::string>{"b", "d"});
        // A snapshot taken before still sees both files with their old content.
        CHECK(KC_MUST(before.read(KC_MUST(before.resolve("k/b")))).bytes() == "BB");
        CHECK(KC_MUST(before.resolve("k/a")) == a);
        CHECK(ts.entry("k").files == 1);
        CHECK(ts.entry("k").bytes == 3);
    }
    SECTION("into a subdirectory updates parent and depth") {
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "a", KC_MUST(txn.resolve("k/d/e")), "a2"));
        KC_MUST(txn.commit());
        auto moved = ts.attr("k/d/e/a2");
        CHECK(moved.ino == a);
        CHECK(moved.parent == ts.ino("k/d/e"));
        CHECK(moved.depth == 4);
        CHECK(moved.entry == k);
    }
    SECTION("a directory with its subtree: descendants keep their content") {
        ts.put("k/d/e/deep", "deep content");
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "d", k, "d2"));
        KC_MUST(txn.commit());
        CHECK(ts.get("k/d2/e/deep") == "deep content");
        CHECK_FALSE(ts.exists("k/d"));
    }
    SECTION("over an empty directory") {
        ts.mkdirs("k/empty");
        auto empty = ts.ino("k/empty");
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "d", k, "empty"));
        KC_MUST(txn.commit());
        CHECK(ts.exists("k/empty/e"));
        CHECK_FALSE(ts.exists("k/d"));
        auto r = ts.read();
        CHECK(err(r.getattr(empty)) == ENOENT);
    }
    SECTION("onto itself succeeds and changes nothing") {
        auto txn = ts.write();
        KC_MUST(txn.rename(k, "a", k, "a"));
        KC_MUST(txn.commit());
        CHECK(ts.get("k/a") == "AAA");
        CHECK(ts.children("k") == std::vector<std::string>{"a", "b", "d"});
    }
    check_consistent(ts.store());
}

TEST_CASE("tree: rename refuses what rename(2) refuses and changes nothing", "[tree][rename]") {
    TestStore ts;
    ts.put("k/a", "AAA");
    ts.put("k/b", "BB");
    ts.put("k/full/x", "x");
    ts.mkdirs("k/d/e");
    auto k = ts.ino("k");
    const auto before = tree_snapshot(ts.read());

    auto txn = ts.write();
    SECTION("a non-empty target directory: ENOTEMPTY") {
        CHECK(err(txn.rename(k, "d", k, "full")) == ENOTEMPTY);
    }
    SECTION("an existing target with kRenameNoReplace: EEXIST") {
        CHECK(err(txn.rename(k, "a", k, "b", core::kRenameNoReplace)) == EEXIST);
        CHECK(err(txn.rename(k, "d", k, "full", core::kRenameNoReplace)) == EEXIST);
    }
    SECTION("a file onto a directory: EISDIR") {
        CHECK(err(txn.rename(k, "a", k, "d")) == EISDIR);
    }
    SECTION("a directory onto a file: ENOTDIR") {
        CHECK(err(txn.rename(k, "d", k, "a")) == ENOTDIR);
    }
    SECTION("a directory into its own subtree: EINVAL") {
        CHECK(err(txn.rename(k, "d", KC_MUST(txn.resolve("k/d/e")), "loop")) == EINVAL);
        CHECK(err(txn.rename(k, "d", KC_MUST(txn.resolve("k/d")), "loop")) == EINVAL);
        CHECK(err(txn.rename(kRootIno, "k", KC_MUST(txn.resolve("k/d/e")), "loop")) == EINVAL);
    }
    SECTION("kRenameExchange is not supported: EINVAL") {
        CHECK(err(txn.rename(k, "a", k, "b", core::kRenameExchange)) == EINVAL);
    }
    SECTION("a missing source: ENOENT; a missing target directory: ENOENT") {
        CHECK(err(txn.rename(k, "nope", k, "c")) == ENOENT);
        CHECK(err(txn.rename(k, "a", 987654, "c")) == ENOENT);
    }
    SECTION("a 256-byte target name: ENAMETOOLONG") {
        CHECK(err(txn.rename(k, "a", k, std::string(256, 'n'))) == ENAMETOOLONG);
    }
    // Validation errors leave the transaction usable; committing it changes nothing.
    KC_MUST(txn.commit());
    auto after = tree_snapshot(ts.read());
    INFO("before:\n" << describe_tree(before) << "after:\n" << describe_tree(after));
    CHECK(after == before);
    check_consistent(ts.store());
}

TEST_CASE("tree: rename with kRenameNoReplace to a free name works", "[tree][rename]") {
    TestStore ts;
    auto a = ts.put("k/a", "AAA");
    auto k = ts.ino("k");
    auto txn = ts.write();
    KC_MUST(txn.rename(k, "a", k, "z", core::kRenameNoReplace));
    KC_MUST(txn.commit());
    CHECK(ts.ino("k/z") == a);
}

TEST_CASE("tree: unlink removes a file and rmdir removes only empty directories", "[tree]") {
    TestStore ts;
    ts.put("k/a", "AAA");
    ts.put("k/d/x", "x");
    ts.mkdirs("k/empty");
    ts.put("k/shared1", "same");
    auto k = ts.ino("k");

    SECTION("unlink of a file") {
        auto a = ts.ino("k/a");
        auto txn = ts.write();
        KC_MUST(txn.unlink(k, "a"));
        CHECK(err(txn.lookup(k, "a")) == ENOENT);
        KC_MUST(txn.commit());
        CHECK_FALSE(ts.exists("k/a"));
        auto r = ts.read();
        CHECK(err(r.getattr(a)) == ENOENT);
        CHECK(ts.entry("k").files == 2);
    }
    SECTION("unlink of a symlink removes the link only") {
        auto txn = ts.write();
        KC_MUST(txn.symlink(k, "l", "a"));
        KC_MUST(txn.unlink(k, "l"));
        KC_MUST(txn.commit());
        CHECK(ts.get("k/a") == "AAA");
    }
    SECTION("unlink of a directory is EISDIR, of a missing name ENOENT") {
        auto txn = ts.write();
        CHECK(err(txn.unlink(k, "empty")) == EISDIR);
        CHECK(err(txn.unlink(k, "nope")) == ENOENT);
        KC_MUST(txn.commit());
        CHECK(ts.exists("k/empty"));
    }
    SECTION("rmdir of an empty directory") {
        auto txn = ts.write();
        KC_MUST(txn.rmdir(k, "empty"));
        KC_MUST(txn.commit());
        CHECK_FALSE(ts.exists("k/empty"));
    }
    SECTION("rmdir of a non-empty directory is ENOTEMPTY and keeps it") {
        auto txn = ts.write();
        CHECK(err(txn.rmdir(k, "d")) == ENOTEMPTY);
        CHECK(err(txn.rmdir(kRootIno, "k")) == ENOTEMPTY);
        KC_MUST(txn.commit());
        CHECK(ts.get("k/d/x") == "x");
    }
    SECTION("rmdir of a file is ENOTDIR, of a missing name ENOENT") {
        auto txn = ts.write();
        CHECK(err(txn.rmdir(k, "a")) == ENOTDIR);
        CHECK(err(txn.rmdir(k, "nope")) == ENOENT);
    }
    SECTION("os.removedirs: rmdir upward stops at the first non-empty directory") {
        auto txn = ts.write();
        KC_MUST(txn.unlink(KC_MUST(txn.resolve("k/d")), "x"));
        KC_MUST(txn.rmdir(k, "d"));
        CHECK(err(txn.rmdir(kRootIno, "k")) == ENOTEMPTY);
        KC_MUST(txn.commit());
        CHECK(ts.exists("k"));
        CHECK_FALSE(ts.exists("k/d"));
    }
    check_consistent(ts.store());
}

TEST_CASE("tree: symlink stores its target and readlink returns it", "[tree]") {
    TestStore ts;
    auto k = ts.mkdirs("k");
    auto txn = ts.write();
    auto link = KC_MUST(txn.symlink(k, "lock", "host:1234", 5, 6));
    CHECK(link.is_symlink());
    CHECK(S_ISLNK(link.mode));
    CHECK(link.size == 9);
    CHECK(link.uid == 5);
    CHECK(link.entry == k);
    KC_MUST(txn.commit());

    auto r = ts.read();
    CHECK(KC_MUST(r.readlink(link.ino)) == "host:1234");
    CHECK(KC_MUST(r.lookup(k, "lock")).is_symlink());

    SECTION("ccache-style lock: a second symlink with the same name is EEXIST") {
        auto w = ts.write();
        CHECK(err(w.symlink(k, "lock", "other:1")) == EEXIST);
        KC_MUST(w.commit());
        CHECK(KC_MUST(ts.read().readlink(link.ino)) == "host:1234");
    }
    SECTION("readlink of a file or a directory is EINVAL") {
        auto w = ts.write();
        auto f = KC_MUST(w.create(k, "f", 0644));
        CHECK(err(w.readlink(f.ino)) == EINVAL);
        CHECK(err(w.readlink(k)) == EINVAL);
    }
    SECTION("a target longer than kMaxPathLength is ENAMETOOLONG") {
        auto w = ts.write();
        CHECK(err(w.symlink(k, "long", std::string(core::kMaxPathLength + 1, 't'))) ==
              ENAMETOOLONG);
        auto ok = KC_MUST(w.symlink(k, "max", std::string(1000, 't')));
        CHECK(KC_MUST(w.readlink(ok.ino)).size() == 1000);
    }
    SECTION("a symlink is not a file: entry accounting ignores it") {
        CHECK(ts.entry("k").files == 0);
        CHECK(ts.entry("k").bytes == 0);
    }
}

TEST_CASE("tree: setattr truncates, extends with zeros, and sets mode, owner and times",
          "[tree][setattr]") {
    TestStore ts;
    auto f = ts.put("k/f", "hello world");

    SECTION("size smaller truncates") {
        auto txn = ts.write();
        auto a = KC_MUST(txn.setattr(f, set_size(5)));
        CHECK(a.size == 5);
        KC_MUST(txn.commit());
        CHECK(ts.get("k/f") == "hello");
        CHECK(ts.attr("k/f").digest == core::digest_of("hello"));
        CHECK(ts.entry("k").bytes == 5);
    }
    SECTION("size larger extends with zeros") {
        auto txn = ts.write();
        KC_MUST(txn.setattr(f, set_size(14)));
        KC_MUST(txn.commit());
        CHECK(ts.get("k/f") == std::string("hello world\0\0\0", 14));
        CHECK(ts.attr("k/f").size == 14);
        CHECK(ts.entry("k").bytes == 14);
    }
    SECTION("size 0 empties the file") {
        auto txn = ts.write();
        KC_MUST(txn.setattr(f, set_size(0)));
        KC_MUST(txn.commit());
        CHECK(ts.get("k/f").empty());
        CHECK(ts.attr("k/f").digest.empty());
    }
    SECTION("mode changes the permission bits and keeps the file type") {
        auto txn = ts.write();
        auto a = KC_MUST(txn.setattr(f, set_mode(0755)));
        CHECK(a.mode == (S_IFREG | 0755));
        auto d = KC_MUST(txn.setattr(KC_MUST(txn.resolve("k")), set_mode(0700)));
        CHECK(d.mode == (S_IFDIR | 0700));
        KC_MUST(txn.commit());
        CHECK(ts.attr("k/f").mode == (S_IFREG | 0755));
        CHECK(ts.get("k/f") == "hello world");
    }
    SECTION("uid and gid") {
        auto txn = ts.write();
        KC_MUST(txn.setattr(f, set_owner(1000, 100)));
        KC_MUST(txn.commit());
        CHECK(ts.attr("k/f").uid == 1000);
        CHECK(ts.attr("k/f").gid == 100);
    }
    SECTION("atime and mtime are stored exactly") {
        const std::int64_t atime = 1'600'000'000'123'456'789;
        const std::int64_t mtime = 1'500'000'000'987'654'321;
        auto txn = ts.write();
        KC_MUST(txn.setattr(f, set_times(atime, mtime)));
        KC_MUST(txn.commit());
        CHECK(ts.attr("k/f").atime_ns == atime);
        CHECK(ts.attr("k/f").mtime_ns == mtime);
        CHECK(ts.get("k/f") == "hello world");
    }
    SECTION("fields left empty are not changed") {
        auto before = ts.attr("k/f");
        auto txn = ts.write();
        KC_MUST(txn.setattr(f, core::SetAttr{}));
        KC_MUST(txn.commit());
        auto after = ts.attr("k/f");
        CHECK(after.mode == before.mode);
        CHECK(after.size == before.size);
        CHECK(after.mtime_ns == before.mtime_ns);
        CHECK(after.uid == before.uid);
    }
    SECTION("size on a directory is EISDIR; on a missing inode ENOENT") {
        auto txn = ts.write();
        CHECK(err(txn.setattr(KC_MUST(txn.resolve("k")), set_size(0))) == EISDIR);
        CHECK(err(txn.setattr(987654, set_mode(0600))) == ENOENT);
    }
    check_consistent(ts.store());
}

TEST_CASE("tree: publishing content moves mtime forward", "[tree]") {
    TestStore ts;
    auto f = ts.put("k/f", "one");
    auto before = ts.attr("k/f").mtime_ns;
    ts.clock().advance(10 * kSecond);
    auto txn = ts.write();
    auto a = KC_MUST(txn.write(f, "two", test_origin()));
    KC_MUST(txn.commit());
    CHECK(a.mtime_ns > before);
    CHECK(ts.attr("k/f").mtime_ns > before);
}

TEST_CASE("tree: names longer than 255 bytes are ENAMETOOLONG and change nothing",
          "[tree][limits]") {
    TestStore ts;
    auto k = ts.mkdirs("k");
    const std::string long_name(core::kMaxNameLength + 1, 'n');
    const std::string max_name(core::kMaxNameLength, 'm');
    const auto before = tree_snapshot(ts.read());

    auto txn = ts.write();
    CHECK(err(txn.mkdir(kRootIno, long_name, 0755)) == ENAMETOOLONG);
    CHECK(err(txn.mkdir(k, long_name, 0755)) == ENAMETOOLONG);
    CHECK(err(txn.create(k, long_name, 0644)) == ENAMETOOLONG);
    CHECK(err(txn.create(k, long_name, 0644, 0, 0, true)) == ENAMETOOLONG);
    CHECK(err(txn.symlink(k, long_name, "t")) == ENAMETOOLONG);
    CHECK(err(txn.lookup(k, long_name)) == ENAMETOOLONG);
    KC_MUST(txn.commit());
    CHECK(tree_snapshot(ts.read()) == before);
    CHECK(ts.counter(Counter::entries) == 1);

    SECTION("255 bytes is fine") {
        auto w = ts.write();
        auto d = KC_MUST(w.mkdir(kRootIno, max_name, 0755));
        auto f = KC_MUST(w.create(d.ino, max_name, 0644));
        KC_MUST(w.write(f.ino, "x", test_origin()));
        KC_MUST(w.commit());
        CHECK(ts.get(max_name + "/" + max_name) == "x");
        CHECK(ts.entry(max_name).files == 1);
        check_consistent(ts.store());
    }
}

TEST_CASE("tree: very long paths give an error, not a crash", "[tree][limits]") {
    TestStore ts;
    auto txn = ts.read();

    SECTION("a path beyond LMDB's 511-byte key limit that does not exist: ENOENT") {
        std::string path;
        while (path.size() < 900) path += "component/";
        path += "leaf";
        CHECK(err(txn.resolve(path)) == ENOENT);
        auto entry = txn.find_entry(path);
        REQUIRE_FALSE(entry.has_value());
        CHECK_FALSE(entry.error().message.empty());
    }
    SECTION("a single component longer than 255 bytes: ENAMETOOLONG") {
        CHECK(err(txn.resolve(std::string(600, 'x'))) == ENAMETOOLONG);
        auto entry = txn.find_entry(std::string(600, 'x'));
        REQUIRE_FALSE(entry.has_value());
        CHECK(entry.error().code == ENAMETOOLONG);
    }
    SECTION("a path longer than kMaxPathLength: ENAMETOOLONG") {
        std::string path;
        while (path.size() <= core::kMaxPathLength) path += "abcdefgh/";
        CHECK(err(txn.resolve(path)) == ENAMETOOLONG);
        auto entry = txn.find_entry(path);
        REQUIRE_FALSE(entry.has_value());
        CHECK(entry.error().code == ENAMETOOLONG);
    }
}

TEST_CASE("tree: a real path longer than 511 bytes resolves", "[tree][limits]") {
    TestStore ts;
    const std::string c1(200, 'a'), c2(200, 'b'), c3(200, 'c');
    auto f = ts.put(c1 + "/" + c2 + "/" + c3, "deep");
    auto txn = ts.read();
    CHECK(KC_MUST(txn.resolve(c1 + "/" + c2 + "/" + c3)) == f);
    CHECK(KC_MUST(txn.find_entry(c1)).files == 1);
    auto not_an_entry = txn.find_entry(c1 + "/" + c2 + "/" + c3);
    CHECK_FALSE(not_an_entry.has_value());
}

TEST_CASE("tree: a write transaction is invisible until commit and dropped without it",
          "[tree][txn]") {
    TestStore ts;
    ts.put("k/a", "old");
    auto a = ts.ino("k/a");

    SECTION("readers see the old state until commit") {
        auto txn = ts.write();
        KC_MUST(txn.write(a, "new", test_origin()));
        KC_MUST(txn.mkdir(kRootIno, "k2", 0755));
        CHECK(ts.get("k/a") == "old");
        CHECK_FALSE(ts.exists("k2"));
        KC_MUST(txn.commit());
        CHECK(ts.get("k/a") == "new");
        CHECK(ts.exists("k2"));
    }
    SECTION("a snapshot keeps its view after later commits") {
        auto snapshot = ts.read();
        ts.put("k/a", "new");
        ts.put("k/b", "b");
        CHECK(KC_MUST(snapshot.read(a)).bytes() == "old");
        CHECK(err(snapshot.lookup(ts.ino("k"), "b")) == ENOENT);
    }
    SECTION("a dropped write transaction changes nothing") {
        {
            auto txn = ts.write();
            KC_MUST(txn.write(a, "lost", test_origin()));
            KC_MUST(txn.add(Counter::opens, 5));
        }
        CHECK(ts.get("k/a") == "old");
        CHECK(ts.counter(Counter::opens) == 0);
    }
    SECTION("Store::update commits on success and rolls back on error") {
        KC_MUST(ts->update([&](core::WriteTxn& txn) -> core::Status {
            return txn.write(a, "updated", test_origin()).map([](auto&&) {});
        }));
        CHECK(ts.get("k/a") == "updated");
        auto failed = ts->update([&](core::WriteTxn& txn) -> core::Status {
            KC_MUST(txn.write(a, "rolled back", test_origin()));
            return core::fail(EIO, "test failure");
        });
        CHECK(err(failed) == EIO);
        CHECK(ts.get("k/a") == "updated");
    }
}

TEST_CASE("tree: Txn::id changes after a commit and only then", "[tree][txn]") {
    TestStore ts;
    auto first = ts.read().id();
    CHECK(ts.read().id() == first);
    { auto dropped = ts.write(); }
    CHECK(ts.read().id() == first);
    ts.put("k/a", "x");
    auto second = ts.read().id();
    CHECK(second != first);
    ts.put("k/a", "y");
    CHECK(ts.read().id() != second);
}

TEST_CASE("tree: the entry of a node is its ancestor at the entry depth", "[tree][entries]") {
    SECTION("depth 1: root children are entries, a flat file is its own entry") {
        TestStore ts;
        auto f = ts.put("k/sub/f", "x");
        auto flat = ts.put("flat", "y");
        auto k = ts.ino("k");
        CHECK(ts.attr("k").entry == k);
        CHECK(ts.attr("k/sub").entry == k);
        CHECK(ts.attr("k/sub/f").entry == k);
        CHECK(ts.attr("k/sub/f").ino == f);
        CHECK(ts.attr("flat").ino == flat);
        CHECK(ts.attr("flat").entry == ts.entry("flat").ino);  // a stem entry of its own
        CHECK(ts.entry("flat").kind == core::EntryKind::stem);
        CHECK(ts.entry_names() == std::vector<std::string>{"k", "flat"});
        check_consistent(ts.store());
    }
    SECTION("depth 2: entries are two levels down and named by their path") {
        TestStore ts([](core::OpenOptions& o) { o.entry_depth = 2; });
        CHECK(ts.read().config().entry_depth == 2);
        ts.put("ab/cdef/kernel.cubin", "bin");
        ts.put("ab/cdxx/kernel.cubin", "bin2");
        CHECK(ts.attr("ab").entry == 0);
        CHECK(ts.attr("ab/cdef").entry == ts.ino("ab/cdef"));
        CHECK(ts.attr("ab/cdef/kernel.cubin").entry == ts.ino("ab/cdef"));
        auto e = ts.entry("ab/cdef");
        CHECK(e.name == "ab/cdef");
        CHECK(e.files == 1);
        CHECK(e.bytes == 3);
        CHECK(ts.entry_names() == std::vector<std::string>{"ab/cdef", "ab/cdxx"});
        check_consistent(ts.store());
    }
}
