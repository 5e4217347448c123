// The files of an entry and the walk below a directory (entry_files.hpp).
#include <cerrno>
#include <string>
#include <vector>

#include "core_test_util.hpp"
#include "kcache/core/entry_files.hpp"

using namespace kcache;
using test::err;
using Names = std::vector<std::string>;

TEST_CASE("entry files: a node entry's files and symlinks in path order, with roles",
          "[core][entry_files]") {
    test::TestStore ts;
    const std::string k = "c0ffee0123456789abcdef0123456789";  // a kernel directory
    ts.put(k + "/sub/notes.txt", "n");
    ts.put(k + "/kernel.cubin", "cubin");
    ts.put(k + "/kernel.json", "{}");
    ts.put(k + "/kernel.ptx", "ptx");
    ts.put(k + "/kernel.cubin.x", "x");
    {
        auto w = ts.write();
        KC_MUST(w.symlink(ts.ino(k), "link", "kernel.cubin"));
        KC_MUST(w.commit());
    }
    const core::EntryInfo entry = ts.entry(k);
    auto txn = ts.read();
    const auto files = KC_MUST(core::entry_files(txn, entry));
    Names paths;
    for (const auto& f : files) paths.push_back(f.path);
    CHECK(paths == Names{"kernel.cubin", "kernel.cubin.x", "kernel.json", "kernel.ptx", "link",
                         "sub/notes.txt"});
    CHECK(files[0].role == core::Role::binary);
    CHECK(files[0].attr.size == 5);
    CHECK(files[0].attr.ino == ts.ino(k + "/kernel.cubin"));
    CHECK(files[2].role == core::Role::signature);
    CHECK(files[3].role == core::Role::ir);
    CHECK(files[4].attr.is_symlink());
    CHECK(files[4].link_target == "kernel.cubin");
    CHECK(files[5].role == core::Role::other);
}

TEST_CASE("entry files: a stem entry's files are named in their directory", "[core][entry_files]") {
    test::TestStore ts;
    const std::string key = "jit_f-0123456789abcdef0123456789abcdef";
    ts.put("jax/" + key + "-cache", "c");
    ts.put("jax/" + key + "-atime", "a");
    ts.put("jax/other-0123456789abcdef0123456789abcdef-cache", "o");
    auto txn = ts.read();
    const auto files = KC_MUST(core::entry_files(txn, ts.entry("jax/" + key)));
    REQUIRE(files.size() == 2);
    CHECK(files[0].path == key + "-atime");
    CHECK(files[1].path == key + "-cache");
}

TEST_CASE("entry files: the walk below a directory skips and stops as told",
          "[core][entry_files]") {
    test::TestStore ts;
    ts.put("d/a/x", "1");
    ts.put("d/a/y", "2");
    ts.put("d/b/z", "3");
    ts.put("d/c", "4");
    auto txn = ts.read();
    Names seen;
    KC_MUST(core::walk_below(txn, ts.ino("d"), [&](const core::EntryFile& f) {
        seen.push_back(f.path);
        return core::Walk::next;
    }));
    CHECK(seen == Names{"a", "a/x", "a/y", "b", "b/z", "c"});

    seen.clear();
    KC_MUST(core::walk_below(txn, ts.ino("d"), [&](const core::EntryFile& f) {
        seen.push_back(f.path);
        return f.path == "a" ? core::Walk::skip : core::Walk::next;
    }));
    CHECK(seen == Names{"a", "b", "b/z", "c"});

    seen.clear();
    KC_MUST(core::walk_below(txn, ts.ino("d"), [&](const core::EntryFile& f) {
        seen.push_back(f.path);
        return f.path == "a/x" ? core::Walk::stop : core::Walk::next;
    }));
    CHECK(seen == Names{"a", "a/x"});

    CHECK(err(core::walk_below(txn, ts.ino("d/c"), [](const core::EntryFile&) {
              return core::Walk::next;
          })) == ENOTDIR);
    CHECK(err(core::walk_below(txn, 999999,
                               [](const core::EntryFile&) { return core::Walk::next; })) == ENOENT);
}
