#include "core_test_util.hpp"

#include "kcache/core/holds.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <utility>

namespace kcache::test {

std::string errno_name(int code) {
    if (code == 0) return "0";
    const char* name = strerrorname_np(code);
    return name ? std::string(name) : "errno " + std::to_string(code);
}

std::string describe(const core::Error& error) {
    return errno_name(error.code) + " (" + std::strerror(error.code) + "): " + error.message;
}

void must(core::Status status, std::string_view what) {
    if (!status) FAIL(what << " failed: " << describe(status.error()));
}

core::Origin test_origin() {
    return core::Origin{4242, "kc-test-writer"};
}

// ---- TestStore ----------------------------------------------------------------------

TestStore::TestStore(const Tweak& tweak) {
    m_options.path = (m_dir.path() / "db").string();
    m_options.clock = m_clock.clock();
    if (tweak) tweak(m_options);
    m_store = must(core::Store::open(m_options), "Store::open " + m_options.path);
}

void TestStore::reopen() {
    m_store.reset();
    m_store = must(core::Store::open(m_options), "Store::open (again) " + m_options.path);
}

core::ReadTxn TestStore::read() {
    return must(m_store->read(), "Store::read");
}
core::WriteTxn TestStore::write() {
    return must(m_store->write(), "Store::write");
}

namespace {

std::vector<std::string_view> split_path(std::string_view path) {
    std::vector<std::string_view> parts;
    while (!path.empty()) {
        auto slash = path.find('/');
        parts.push_back(path.substr(0, slash));
        if (slash == std::string_view::npos) break;
        path.remove_prefix(slash + 1);
    }
    return parts;
}

core::Ino mkdirs_in(core::WriteTxn& txn, std::string_view path) {
    core::Ino dir = core::kRootIno;
    for (auto part : split_path(path)) {
        auto found = txn.lookup(dir, part);
        if (found) {
            REQUIRE(found->is_dir());
            dir = found->ino;
            continue;
        }
        REQUIRE(found.error().code == ENOENT);
        dir = must(txn.mkdir(dir, part, 0755), "mkdir " + std::string(part)).ino;
    }
    return dir;
}

}  // namespace

core::Ino mkdirs(core::WriteTxn& txn, std::string_view path) {
    return mkdirs_in(txn, path);
}

core::Ino put(core::WriteTxn& txn, std::string_view path, std::string_view content,
              const core::Origin& origin) {
    auto slash = path.rfind('/');
    core::Ino parent = core::kRootIno;
    std::string_view name = path;
    if (slash != std::string_view::npos) {
        parent = mkdirs_in(txn, path.substr(0, slash));
        name = path.substr(slash + 1);
    }
    auto file = must(txn.create(parent, name, 0644), "create " + std::string(path));
    must(txn.write(file.ino, content, origin), "write " + std::string(path));
    return file.ino;
}

core::Ino TestStore::put(std::string_view path, std::string_view content,
                         const core::Origin& origin) {
    auto txn = write();
    auto ino = test::put(txn, path, content, origin);
    must(txn.commit(), "commit after writing " + std::string(path));
    return ino;
}

core::Ino TestStore::mkdirs(std::string_view path) {
    auto txn = write();
    auto ino = test::mkdirs(txn, path);
    must(txn.commit(), "commit after mkdir " + std::string(path));
    return ino;
}

core::Ino TestStore::ino(std::string_view path) {
    auto txn = read();
    return must(txn.resolve(path), "resolve " + std::string(path));
}

bool TestStore::exists(std::string_view path) {
    auto txn = read();
    auto found = txn.resolve(path);
    if (!found) CHECK(found.error().code == ENOENT);
    return found.has_value();
}

core::Attr TestStore::attr(std::string_view path) {
    auto txn = read();
    auto ino = must(txn.resolve(path), "resolve " + std::string(path));
    return must(txn.getattr(ino), "getattr " + std::string(path));
}

std::string TestStore::get(std::string_view path) {
    auto txn = read();
    auto ino = must(txn.resolve(path), "resolve " + std::string(path));
    auto content = must(txn.read(ino), "read " + std::string(path));
    return std::string(content.bytes());
}

core::EntryInfo TestStore::entry(std::string_view name) {
    auto txn = read();
    return must(txn.find_entry(name), "find_entry " + std::string(name));
}

std::uint64_t TestStore::counter(core::Counter c) {
    auto txn = read();
    return must(txn.counter(c), "counter " + std::string(core::counter_name(c)));
}

std::vector<std::string> TestStore::entry_names() {
    auto txn = read();
    std::vector<std::string> names;
    must(txn.for_each_entry([&](const core::EntryInfo& e) {
        names.push_back(e.name);
        return true;
    }),
         "for_each_entry");
    return names;
}

std::vector<std::string> TestStore::lru_names() {
    auto txn = read();
    std::vector<std::string> names;
    must(txn.for_each_lru([&](const core::EntryInfo& e) {
        names.push_back(e.name);
        return true;
    }),
         "for_each_lru");
    return names;
}

std::vector<std::string> TestStore::children(std::string_view dir_path) {
    auto txn = read();
    auto dir = must(txn.resolve(dir_path), "resolve " + std::string(dir_path));
    std::vector<std::string> names;
    must(txn.readdir(dir, "",
                     [&](const core::DirEntry& d) {
                         names.emplace_back(d.name);
                         return true;
                     }),
         "readdir " + std::string(dir_path));
    return names;
}

// ---- data ---------------------------------------------------------------------------

std::string copy_fixture_db(const TempDir& dir, const std::string& data_mdb) {
    const std::string db = dir.str() + "/db";
    std::filesystem::create_directories(db);
    std::filesystem::copy_file(data_mdb, db + "/data.mdb");
    std::ofstream(db + "/kcache.lock").flush();
    return db;
}

std::string random_bytes(std::size_t size, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::string bytes(size, '\0');
    for (std::size_t i = 0; i < size; i += 8) {
        auto word = rng();
        for (std::size_t j = 0; j < 8 && i + j < size; ++j) {
            bytes[i + j] = static_cast<char>(static_cast<unsigned char>(word >> (8 * j)));
        }
    }
    return bytes;
}

std::string compressible_text(std::size_t size) {
    static const std::string line =
        "__global__ void add_kernel(float* x, float* y) { y[i] += x[i]; }\n";
    std::string text;
    text.reserve(size + line.size());
    while (text.size() < size) text += line;
    text.resize(size);
    return text;
}

std::string all_byte_values() {
    std::string bytes;
    for (int round = 0; round < 2; ++round) {
        for (int b = 0; b < 256; ++b)
            bytes.push_back(static_cast<char>(static_cast<unsigned char>(b)));
    }
    return bytes;
}

// ---- snapshots and recounts ---------------------------------------------------------

namespace {

struct Child {
    std::string name;
    core::Ino ino;
};

std::vector<Child> list_dir(const core::Txn& txn, core::Ino dir) {
    std::vector<Child> out;
    must(txn.readdir(dir, "",
                     [&](const core::DirEntry& d) {
                         out.push_back({std::string(d.name), d.ino});
                         return true;
                     }),
         "readdir");
    return out;
}

// Calls fn(path, attr, depth) for every node below `dir`, depth first.
void walk(const core::Txn& txn, core::Ino dir, const std::string& prefix, std::uint16_t depth,
          const std::function<void(const std::string&, const core::Attr&, std::uint16_t)>& fn) {
    for (const auto& child : list_dir(txn, dir)) {
        auto path = prefix.empty() ? child.name : prefix + "/" + child.name;
        auto attr = must(txn.getattr(child.ino), "getattr " + path);
        fn(path, attr, depth);
        if (attr.is_dir()) walk(txn, attr.ino, path, static_cast<std::uint16_t>(depth + 1), fn);
    }
}

}  // namespace

std::map<std::string, Node> tree_snapshot(const core::Txn& txn) {
    std::map<std::string, Node> tree;
    walk(txn, core::kRootIno, "", 1, [&](const std::string& path, const core::Attr& a, auto) {
        Node node;
        node.type = a.type();
        node.mode = a.mode;
        if (a.is_regular()) {
            node.data = std::string(must(txn.read(a.ino), "read " + path).bytes());
            node.mtime_ns = a.mtime_ns;
        } else if (a.is_symlink()) {
            node.data = must(txn.readlink(a.ino), "readlink " + path);
        }
        tree[path] = node;
    });
    return tree;
}

std::string describe_tree(const std::map<std::string, Node>& tree) {
    std::ostringstream out;
    for (const auto& [path, node] : tree) {
        out << path << " type=" << static_cast<int>(node.type) << " mode=" << std::oct << node.mode
            << std::dec << " size=" << node.data.size() << "\n";
    }
    return out.str();
}

void check_consistent(core::Store& store) {
    auto txn = must(store.read(), "Store::read");

    // Recounted per entry id from the nodes; which node joins which entry is the
    // layout's business (test_layout.cpp), but everything inside an entry belongs to
    // it, and what the records say must add up.
    struct Expected {
        std::uint64_t bytes = 0;
        std::uint64_t files = 0;
    };
    std::map<core::Ino, Expected> entries;
    std::map<core::Ino, core::Ino> entry_of;  // node -> its entry (directories)
    std::uint64_t bytes = 0, files = 0;
    std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> blobs;  // digest -> size

    std::set<core::Ino> seen;  // a file with several names is counted once
    walk(txn, core::kRootIno, "", 1,
         [&](const std::string& path, const core::Attr& a, std::uint16_t d) {
             INFO("node " << path);
             const bool linked = !a.is_dir() && a.nlink > 1;
             if (!linked) CHECK(a.depth == d);  // else its own name's depth
             entry_of[a.ino] = a.entry;
             if (auto parent = entry_of.find(a.parent);
                 parent != entry_of.end() && parent->second) {
                 CHECK(a.entry == parent->second);  // inside an entry: in it
             }
             if (!seen.insert(a.ino).second) return;
             if (a.entry) {
                 Expected& e = entries[a.entry];
                 if (a.is_regular()) {
                     e.bytes += a.size;
                     e.files += 1;
                 }
             }
             if (a.is_regular()) {
                 bytes += a.size;
                 files += 1;
                 auto content = must(txn.read(a.ino), "read " + path);
                 CHECK(content.bytes().size() == a.size);
                 CHECK(a.digest == core::digest_of(content.bytes()));
                 if (a.size >= core::kSegmentedSize) {
                     // A list (no raw bytes of its own) and its distinct segments.
                     blobs[{a.digest.high, a.digest.low}] = 0;
                     const std::string_view bytes_of = content.bytes();
                     for (std::size_t at = 0; at < bytes_of.size(); at += core::kSegmentSize) {
                         const auto seg = bytes_of.substr(at, core::kSegmentSize);
                         const auto sd = core::flat_digest_of(seg);
                         blobs[{sd.high, sd.low}] = seg.size();
                     }
                 } else if (a.size > 0) {
                     blobs[{a.digest.high, a.digest.low}] = a.size;
                 }
             }
         });

    std::set<core::Ino> reported;
    std::uint64_t records = 0;
    must(txn.for_each_entry([&](const core::EntryInfo& e) {
        INFO("entry " << e.name);
        ++records;
        reported.insert(e.ino);
        const Expected expected = entries.count(e.ino) ? entries[e.ino] : Expected{};
        CHECK(e.bytes == expected.bytes);
        CHECK(e.files == expected.files);
        auto found = txn.find_entry(e.name);
        CHECK(found.has_value());
        if (found) CHECK(found->ino == e.ino);
        return true;
    }),
         "for_each_entry");
    for (const auto& [ino, _] : entries) {
        INFO("entry id " << ino << " of some node");
        CHECK(reported.count(ino) == 1);
    }

    std::uint64_t raw = 0;
    for (const auto& [_, size] : blobs) raw += size;
    // A blob held for an open file (holds.hpp) that no file names any more is still a
    // blob; its raw size is verify's to recount (a segmented one is not held here).
    bool held_alone = false;
    must(core::for_each_hold(txn,
                             [&](const core::Digest& d, std::uint64_t) {
                                 held_alone |= blobs.emplace(std::pair{d.high, d.low}, 0).second;
                                 return true;
                             }),
         "for_each_hold");
    auto stats = must(txn.stats(), "stats");
    CHECK(stats.get(core::Counter::entries) == records);
    CHECK(stats.get(core::Counter::bytes) == bytes);
    CHECK(stats.get(core::Counter::files) == files);
    INFO("blobs: unique digests of non-empty files, and of big files' segments");
    CHECK(stats.get(core::Counter::blobs) == blobs.size());
    if (!held_alone) CHECK(stats.get(core::Counter::blob_raw_bytes) == raw);
    if (blobs.empty()) CHECK(stats.get(core::Counter::stored_bytes) == 0);

    auto report = must(core::verify(store), "verify");
    INFO("verify problems:\n"
         << [&] {
                std::string all;
                for (const auto& p : report.problems) all += p + "\n";
                return all;
            }());
    CHECK(report.ok());
    CHECK(report.entries == entries.size());
    CHECK(report.blobs == blobs.size());
}

}  // namespace kcache::test
