// Hostile bundles (issue 6, point 5): a bundle whose names or symlinks try to leave the
// cache is refused as a whole and changes nothing. Complements tests/core/test_bundle.cpp
// ('..', absolute and empty components in names) with symlinks: targets that point out
// of the cache, nodes placed below a symlink, and an entry path through a symlink
// already in the db.
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "kcache/core/bundle.hpp"
#include "kcache/core/maintenance.hpp"
#include "kcache/core/store.hpp"
#include "temp_dir.hpp"

using namespace kcache;
using kcache::test::read_file;
using kcache::test::TempDir;
using kcache::test::write_file;
namespace fs = std::filesystem;

namespace {

template <class T>
T must(core::Result<T> r) {
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    return std::move(*r);
}

void must(core::Status s) {
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s.has_value());
}

std::unique_ptr<core::Store> open_db(const fs::path& dir, std::uint32_t depth = 1) {
    core::OpenOptions options;
    options.path = dir.string();
    options.entry_depth = depth;
    options.durability = core::Durability::none;
    options.map_size = std::uint64_t{1} << 30;
    return must(core::Store::open(options));
}

std::uint64_t txn_id(const core::Store& store) {
    return must(store.read()).id();
}

// A db with entry "k" holding file "k/f", directory "k/d" with "k/d/x" and the symlink
// `link_path` (below "k") to `target`, exported to a bundle; returns the bundle path.
std::string export_with_symlink(const TempDir& tmp, const std::string& name,
                                const std::string& link_dir, const std::string& target) {
    auto store = open_db(tmp / ("src-" + name));
    auto txn = must(store->write());
    const auto origin = core::Origin::current();
    const auto k = must(txn.mkdir(core::kRootIno, "k", 0755, 0, 0)).ino;
    must(txn.write(must(txn.create(k, "f", 0644, 0, 0, true)).ino, "file f", origin));
    const auto d = must(txn.mkdir(k, "d", 0755, 0, 0)).ino;
    must(txn.write(must(txn.create(d, "x", 0644, 0, 0, true)).ino, "file x", origin));
    must(txn.symlink(link_dir == "d" ? d : k, "l", target, 0, 0));
    must(txn.commit());
    const auto path = (tmp / (name + ".kcb")).string();
    must(core::export_bundle(*store, {}, path));
    return path;
}

}  // namespace

TEST_CASE("hostile bundle: symlink targets that leave the cache are refused",
          "[reliability][bundle]") {
    TempDir tmp;
    auto dst = open_db(tmp / "dst");
    {
        auto txn = must(dst->write());
        const auto mine = must(txn.mkdir(core::kRootIno, "mine", 0755, 0, 0)).ino;
        must(txn.write(must(txn.create(mine, "file", 0644, 0, 0, true)).ino, "mine",
                       core::Origin::current()));
        must(txn.commit());
    }
    const auto before = txn_id(*dst);

    struct Case {
        const char* dir;  // "k" or "d": where the link lives (depth 1 or 2 below the root)
        const char* target;
    };
    int n = 0;
    for (const auto& c :
         {Case{"k", "/etc/passwd"}, Case{"k", "/"}, Case{"k", "../.."},
          Case{"k", "../../etc/passwd"}, Case{"d", "../../../x"}, Case{"k", "f/../../../x"},
          Case{"k", "./../../x"}, Case{"d", "..//../../x"}}) {
        INFO("symlink in " << c.dir << " to '" << c.target << "'");
        const auto bundle = export_with_symlink(tmp, "bad" + std::to_string(++n), c.dir, c.target);
        auto r = core::import_bundle(*dst, bundle, true);
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error().code == EINVAL);
        CHECK(r.error().message.find("refused symlink") != std::string::npos);
        CHECK(txn_id(*dst) == before);
    }
    // Relative targets that stay inside the cache (into another entry too) are kept.
    for (const auto& c : {Case{"k", "f"}, Case{"d", "../f"}, Case{"k", "../mine/file"},
                          Case{"k", "./d/x"}, Case{"d", "../../k/f"}, Case{"k", "dangling"}}) {
        INFO("symlink in " << c.dir << " to '" << c.target << "'");
        const auto bundle = export_with_symlink(tmp, "ok" + std::to_string(++n), c.dir, c.target);
        const auto report = must(core::import_bundle(*dst, bundle, true));
        CHECK(report.entries_added + report.entries_replaced == 1);
        auto txn = must(dst->read());
        const auto link =
            must(txn.resolve(std::string("k/") + (std::string(c.dir) == "d" ? "d/" : "") + "l"));
        CHECK(must(txn.readlink(link)) == c.target);
    }
    CHECK(must(core::verify(*dst)).ok());
}

TEST_CASE("hostile bundle: a node placed below a symlink is refused", "[reliability][bundle]") {
    TempDir tmp;
    // k/l -> d; then the bundle's "k/d/x" is renamed "k/l/x": a file through the link.
    const auto good = export_with_symlink(tmp, "src", "k", "d");
    auto bytes = read_file(good);
    const std::string from = "k/d/x", to = "k/l/x";
    const auto at = bytes.find(from);
    REQUIRE(at != std::string::npos);
    bytes.replace(at, from.size(), to);
    const auto bad = (tmp / "bad.kcb").string();
    write_file(bad, bytes);

    auto dst = open_db(tmp / "dst");
    const auto before = txn_id(*dst);
    auto r = core::import_bundle(*dst, bad, true);
    REQUIRE_FALSE(r.has_value());
    // Refused for the path, before the checksum at the end is even reached.
    CHECK(r.error().message.find("is not under a directory") != std::string::npos);
    CHECK(txn_id(*dst) == before);
}

TEST_CASE("hostile bundle: an entry path through a symlink in the db is refused",
          "[reliability][bundle]") {
    TempDir tmp;
    // Depth-2 entries "grp/k": in the destination, "grp" is a symlink out of the cache.
    auto src = open_db(tmp / "src", 2);
    {
        auto txn = must(src->write());
        const auto grp = must(txn.mkdir(core::kRootIno, "grp", 0755, 0, 0)).ino;
        const auto k = must(txn.mkdir(grp, "k", 0755, 0, 0)).ino;
        must(txn.write(must(txn.create(k, "f", 0644, 0, 0, true)).ino, "f",
                       core::Origin::current()));
        must(txn.commit());
    }
    const auto bundle = (tmp / "grouped.kcb").string();
    must(core::export_bundle(*src, {}, bundle));

    auto dst = open_db(tmp / "dst", 2);
    {
        auto txn = must(dst->write());
        must(txn.symlink(core::kRootIno, "grp", tmp.str(), 0, 0));
        must(txn.commit());
    }
    const auto before = txn_id(*dst);
    auto r = core::import_bundle(*dst, bundle, true);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ENOTDIR);
    CHECK(txn_id(*dst) == before);
    CHECK_FALSE(fs::exists(tmp / "k"));  // nothing followed the link on the host
}
