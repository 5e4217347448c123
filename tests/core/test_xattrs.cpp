// Extended attributes in the store (kcache/core/xattrs.hpp): what the mount's SETXATTR,
// GETXATTR, LISTXATTR and REMOVEXATTR do, without FUSE: namespaces, limits and errors,
// the ctime they set, persistence, and removal with the inode (unlink, rmdir, rename
// over, eviction), verify and gc on rows left behind.
#include "kcache/core/xattrs.hpp"

#include <lmdb.h>
#include <sys/stat.h>

#include <cerrno>
#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/maintenance.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Ino;

namespace {

Outcome set(TestStore& ts, Ino ino, const std::string& name, const std::string& value,
            int flags = 0) {
    auto txn = ts.write();
    auto s = core::set_xattr(txn, ino, name, value, flags);
    if (s) KC_MUST(txn.commit());
    return err(s);
}

Outcome remove(TestStore& ts, Ino ino, const std::string& name) {
    auto txn = ts.write();
    auto s = core::remove_xattr(txn, ino, name);
    if (s) KC_MUST(txn.commit());
    return err(s);
}

core::Result<std::string> get(TestStore& ts, Ino ino, const std::string& name) {
    auto txn = ts.read();
    return core::get_xattr(txn, ino, name);
}

std::vector<std::string> list(TestStore& ts, Ino ino, bool privileged = true) {
    auto txn = ts.read();
    return KC_MUST(core::list_xattrs(txn, ino, privileged));
}

void must_verify(TestStore& ts) {
    auto report = KC_MUST(core::verify(ts.store()));
    for (const auto& p : report.problems) INFO(p);
    CHECK(report.ok());
}

}  // namespace

TEST_CASE("xattrs: set, get, list and remove with the kernel's errors", "[xattrs]") {
    TestStore ts;
    const Ino f = ts.put("k/f", "content");
    const Ino dir = ts.ino("k");

    CHECK(err(get(ts, f, "user.a")) == ENODATA);
    CHECK(set(ts, f, "user.a", "1") == 0);
    CHECK(KC_MUST(get(ts, f, "user.a")) == "1");
    CHECK(set(ts, f, "user.a", "2", core::kXattrCreate) == EEXIST);
    CHECK(set(ts, f, "user.b", "2", core::kXattrReplace) == ENODATA);
    CHECK(set(ts, f, "user.a", "3", core::kXattrReplace) == 0);
    CHECK(set(ts, f, "user.a", "3", core::kXattrCreate | core::kXattrReplace) == EINVAL);
    CHECK(set(ts, f, "user.a", "3", 4) == EINVAL);
    CHECK(KC_MUST(get(ts, f, "user.a")) == "3");

    // Limits.
    CHECK(set(ts, f, "", "x") == ERANGE);
    CHECK(set(ts, f, "user." + std::string(250, 'n'), "x") == 0);
    CHECK(set(ts, f, "user." + std::string(251, 'n'), "x") == ERANGE);
    CHECK(set(ts, f, "user.big", std::string(core::kMaxXattrValue, 'v')) == 0);
    CHECK(set(ts, f, "user.big", std::string(core::kMaxXattrValue + 1, 'v')) == E2BIG);
    CHECK(KC_MUST(get(ts, f, "user.big")).size() == core::kMaxXattrValue);
    // Values are bytes: NULs and all 256 values kept.
    CHECK(set(ts, f, "user.bytes", all_byte_values()) == 0);
    CHECK(KC_MUST(get(ts, f, "user.bytes")) == all_byte_values());

    // Namespaces: trusted and security kept; trusted left out of others' listings;
    // system (ACLs) and unknown prefixes refused.
    CHECK(set(ts, f, "trusted.t", "t") == 0);
    CHECK(set(ts, f, "security.s", "s") == 0);
    CHECK(set(ts, f, "system.posix_acl_access", "acl") == EOPNOTSUPP);
    CHECK(set(ts, f, "other.x", "x") == EOPNOTSUPP);
    CHECK(err(get(ts, f, "system.posix_acl_default")) == EOPNOTSUPP);
    const std::vector<std::string> all = list(ts, f);
    CHECK(all == std::vector<std::string>{"security.s", "trusted.t", "user.a", "user.big",
                                          "user.bytes", "user." + std::string(250, 'n')});
    const std::vector<std::string> unprivileged = list(ts, f, false);
    CHECK(unprivileged == std::vector<std::string>{"security.s", "user.a", "user.big", "user.bytes",
                                                   "user." + std::string(250, 'n')});

    CHECK(remove(ts, f, "user.a") == 0);
    CHECK(remove(ts, f, "user.a") == ENODATA);
    CHECK(err(get(ts, f, "user.a")) == ENODATA);

    // user.* on files and directories only.
    CHECK(set(ts, dir, "user.d", "dir") == 0);
    Ino link = 0;
    {
        auto txn = ts.write();
        link = KC_MUST(txn.symlink(dir, "l", "f")).ino;
        KC_MUST(txn.commit());
    }
    CHECK(set(ts, link, "user.x", "1") == EPERM);
    CHECK(err(get(ts, link, "user.x")) == ENODATA);
    CHECK(set(ts, link, "trusted.x", "1") == 0);  // other namespaces are not limited so

    // A missing inode.
    CHECK(set(ts, 999999, "user.x", "1") == ENOENT);
    CHECK(err(get(ts, 999999, "user.x")) == ENOENT);
    must_verify(ts);
}

TEST_CASE("xattrs: a change sets the inode's ctime, the value survives a reopen", "[xattrs]") {
    TestStore ts;
    const Ino f = ts.put("k/f", "x");
    const auto before = ts.attr("k/f");
    ts.clock().advance(5 * kSecond);
    CHECK(set(ts, f, "user.a", "1") == 0);
    const auto after_set = ts.attr("k/f");
    CHECK(after_set.ctime_ns == before.ctime_ns + 5 * kSecond);
    CHECK(after_set.mtime_ns == before.mtime_ns);
    ts.clock().advance(5 * kSecond);
    CHECK(remove(ts, f, "user.a") == 0);
    CHECK(ts.attr("k/f").ctime_ns == after_set.ctime_ns + 5 * kSecond);
    CHECK(set(ts, f, "user.kept", "across a reopen") == 0);
    ts.reopen();
    CHECK(KC_MUST(get(ts, f, "user.kept")) == "across a reopen");
}

TEST_CASE("xattrs: they go with the inode: last unlink, rmdir, rename over, eviction", "[xattrs]") {
    TestStore ts;
    const Ino a = ts.put("k/a", "a");
    CHECK(set(ts, a, "user.x", "1") == 0);
    {  // a second name: the same inode, the same attributes
        auto txn = ts.write();
        KC_MUST(txn.link(a, ts.ino("k"), "a2"));
        KC_MUST(txn.commit());
    }
    CHECK(KC_MUST(get(ts, ts.ino("k/a2"), "user.x")) == "1");
    {
        auto txn = ts.write();
        KC_MUST(txn.unlink(ts.ino("k"), "a"));
        KC_MUST(txn.commit());
    }
    CHECK(KC_MUST(get(ts, a, "user.x")) == "1");
    {
        auto txn = ts.write();
        KC_MUST(txn.unlink(ts.ino("k"), "a2"));
        KC_MUST(txn.commit());
    }
    CHECK(err(get(ts, a, "user.x")) == ENOENT);

    const Ino b = ts.put("k/b", "b");
    const Ino c = ts.put("k/c", "c");
    CHECK(set(ts, b, "user.b", "1") == 0);
    CHECK(set(ts, c, "user.c", "1") == 0);
    {
        auto txn = ts.write();
        KC_MUST(txn.rename(ts.ino("k"), "c", ts.ino("k"), "b"));
        KC_MUST(txn.commit());
    }
    CHECK(KC_MUST(get(ts, ts.ino("k/b"), "user.c")) == "1");

    const Ino d = ts.mkdirs("k/d");
    CHECK(set(ts, d, "user.d", "1") == 0);
    {
        auto txn = ts.write();
        KC_MUST(txn.rmdir(ts.ino("k"), "d"));
        KC_MUST(txn.commit());
    }

    const Ino e = ts.put("e/kernel.bin", "bin");
    CHECK(set(ts, e, "user.e", "1") == 0);
    CHECK(set(ts, ts.ino("e"), "user.e", "dir") == 0);
    {
        auto txn = ts.write();
        KC_MUST(txn.evict_entry(ts.entry("e").ino, true));
        KC_MUST(txn.commit());
    }
    must_verify(ts);  // verify names rows of inodes that are gone: none left
}

TEST_CASE("xattrs: verify names rows of removed inodes and gc removes them", "[xattrs]") {
    TestStore ts;
    const Ino f = ts.put("k/f", "x");
    CHECK(set(ts, f, "user.a", "1") == 0);
    const std::string path = ts.db_path();
    ts.close();
    {  // a row of an inode that does not exist, as a program without the table leaves
        MDB_env* env = nullptr;
        REQUIRE(mdb_env_create(&env) == 0);
        mdb_env_set_maxdbs(env, 32);
        mdb_env_set_mapsize(env, std::size_t{1} << 30);
        REQUIRE(mdb_env_open(env, path.c_str(), MDB_NOTLS, 0644) == 0);
        MDB_txn* txn = nullptr;
        REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == 0);
        MDB_dbi dbi = 0;
        REQUIRE(mdb_dbi_open(txn, "xattrs", 0, &dbi) == 0);
        std::string key(8, '\0');
        key[7] = static_cast<char>(0x7f);  // inode 127, big-endian
        key += "user.orphan";
        MDB_val k{key.size(), key.data()};
        MDB_val v{1, const_cast<char*>("o")};
        REQUIRE(mdb_put(txn, dbi, &k, &v, 0) == 0);
        REQUIRE(mdb_txn_commit(txn) == 0);
        mdb_env_close(env);
    }
    ts.reopen();
    auto report = KC_MUST(core::verify(ts.store()));
    REQUIRE(report.problems.size() == 1);
    CHECK(report.problems[0].find("inode 127") != std::string::npos);
    KC_MUST(core::collect_garbage(ts.store()));
    must_verify(ts);
    CHECK(KC_MUST(get(ts, f, "user.a")) == "1");  // a live inode's rows stay
}
