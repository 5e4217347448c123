// libFuzzer target for core's bundle import (built and run by tests/support/run_fuzz.sh
// with clang++-14 -fsanitize=fuzzer,address,undefined; core's sources are compiled in).
//
// Input: one flags byte, then the bundle file's bytes.
//   bit 0: recompute the trailing XXH3-128 checksum over the bytes before it, so that
//          mutations get past the checksum and exercise what comes after it
//   bit 1: import with `replace`
//   bit 2: import into the db with entry depth 2 (else depth 1)
// Both dbs hold a baseline (an entry the seeds also carry, a flat file, a symlink where
// a depth-2 import needs a directory). Contract checked for every input: import returns
// an error or a report, never crashes, leaks or hangs; a refused import leaves the db
// exactly as it was (same LMDB transaction id); an accepted one leaves a db that
// `verify` finds consistent, whose symlinks cannot point out of the cache, and nothing
// is written outside the db. The target aborts when the contract is broken.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <xxhash.h>

#include "kcache/core/bundle.hpp"
#include "kcache/core/maintenance.hpp"
#include "kcache/core/store.hpp"

namespace {

namespace core = kcache::core;
namespace fs = std::filesystem;

void check(bool condition, const char* what) {
    if (!condition) {
        std::fprintf(stderr, "fuzz_bundle: contract broken: %s\n", what);
        std::abort();
    }
}

template <class T>
T must(core::Result<T> r, const char* what) {
    if (!r) {
        std::fprintf(stderr, "fuzz_bundle: setup failed: %s: %s\n", what,
                     r.error().message.c_str());
        std::abort();
    }
    return std::move(*r);
}

void must(core::Status s, const char* what) {
    if (!s) {
        std::fprintf(stderr, "fuzz_bundle: setup failed: %s: %s\n", what,
                     s.error().message.c_str());
        std::abort();
    }
}

// A db with its baseline content, recreated after an import changed it.
class FuzzDb {
  public:
    FuzzDb(fs::path dir, std::uint32_t depth) : m_dir(std::move(dir)), m_depth(depth) { reset(); }

    core::Store& store() { return *m_store; }

    void reset() {
        m_store.reset();
        std::error_code ec;
        fs::remove_all(m_dir, ec);
        core::OpenOptions options;
        options.path = m_dir.string();
        options.durability = core::Durability::none;  // speed; crashes are not the point
        options.map_size = std::uint64_t{1} << 32;
        options.entry_depth = m_depth;
        m_store = must(core::Store::open(options), "open db");
        auto txn = must(m_store->write(), "write txn");
        const auto origin = core::Origin::current();
        core::Ino at = core::kRootIno;
        if (m_depth == 2) {
            at = must(txn.mkdir(at, "grp", 0755, 0, 0), "mkdir grp").ino;
            must(txn.symlink(core::kRootIno, "sl", "grp", 0, 0), "symlink sl");
            auto file = must(txn.create(core::kRootIno, "plain", 0644, 0, 0, true), "create plain");
            must(txn.write(file.ino, "plain", origin), "write plain");
        }
        const auto k1 = must(txn.mkdir(at, "k1", 0755, 0, 0), "mkdir k1").ino;
        auto cubin = must(txn.create(k1, "kernel.cubin", 0644, 0, 0, true), "create cubin");
        must(txn.write(cubin.ino, std::string(100, '\x7f'), origin), "write cubin");
        auto flat = must(txn.create(at, "flat", 0644, 0, 0, true), "create flat");
        must(txn.write(flat.ino, "flat entry", origin), "write flat");
        must(txn.commit(), "commit baseline");
    }

    std::uint64_t txn_id() { return must(m_store->read(), "read txn").id(); }

  private:
    fs::path m_dir;
    std::uint32_t m_depth;
    std::unique_ptr<core::Store> m_store;
};

struct State {
    fs::path root;
    fs::path bundle;
    std::unique_ptr<FuzzDb> depth1, depth2;
};

State& state() {
    static State* s = [] {
        auto* st = new State;
        char tmpl[] = "/dev/shm/kcache-fuzz-bundle-XXXXXX";
        const char* made = mkdtemp(tmpl);
        if (!made) {
            std::string fallback =
                (fs::temp_directory_path() / "kcache-fuzz-bundle-XXXXXX").string();
            made = mkdtemp(fallback.data());
            check(made != nullptr, "mkdtemp");
            st->root = made;
        } else {
            st->root = made;
        }
        st->bundle = st->root / "input.kcb";
        st->depth1 = std::make_unique<FuzzDb>(st->root / "db1", 1);
        st->depth2 = std::make_unique<FuzzDb>(st->root / "db2", 2);
        std::atexit([] {
            std::error_code ec;
            fs::remove_all(state().root, ec);
        });
        return st;
    }();
    return *s;
}

// Lexically resolves `target` from the directory at `dir_depth` below the root;
// false when it is absolute or climbs above the root.
bool stays_inside(std::string_view target, std::size_t dir_depth) {
    if (target.empty() || target.front() == '/') return false;
    long depth = static_cast<long>(dir_depth);
    for (std::size_t at = 0; at <= target.size();) {
        const std::size_t slash = std::min(target.find('/', at), target.size());
        const std::string_view part = target.substr(at, slash - at);
        if (part == "..") {
            if (--depth < 0) return false;
        } else if (!part.empty() && part != ".") {
            ++depth;
        }
        at = slash + 1;
    }
    return true;
}

// Walks the whole tree and checks every symlink's target.
void check_symlinks(const core::ReadTxn& txn, core::Ino dir, std::size_t depth) {
    std::vector<std::pair<core::Ino, core::FileType>> children;
    must(txn.readdir(dir, "",
                     [&](const core::DirEntry& e) {
                         children.emplace_back(e.ino, e.type);
                         return true;
                     }),
         "readdir");
    for (const auto& [ino, type] : children) {
        if (type == core::FileType::directory) check_symlinks(txn, ino, depth + 1);
        if (type == core::FileType::symlink) {
            const auto target = must(txn.readlink(ino), "readlink");
            check(stays_inside(target, depth), "an imported symlink points out of the cache");
        }
    }
}

std::size_t files_in(const fs::path& dir) {
    std::size_t n = 0;
    for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
         ++it)
        ++n;
    return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    State& st = state();
    const std::uint8_t flags = data[0];
    std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
    if ((flags & 1) && bytes.size() >= 16) {
        const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size() - 16);
        for (int i = 0; i < 8; ++i) {
            bytes[bytes.size() - 16 + i] = static_cast<char>((h.high64 >> (8 * i)) & 0xff);
            bytes[bytes.size() - 8 + i] = static_cast<char>((h.low64 >> (8 * i)) & 0xff);
        }
    }
    {
        const int fd = ::open(st.bundle.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        check(fd >= 0, "create input file");
        check(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()),
              "write input");
        ::close(fd);
    }
    FuzzDb& db = (flags & 4) ? *st.depth2 : *st.depth1;
    const std::size_t files_before = files_in(st.root);
    const std::uint64_t before = db.txn_id();

    const auto report = core::import_bundle(db.store(), st.bundle.string(), (flags & 2) != 0);

    check(files_in(st.root) == files_before, "import created or removed files outside the db");
    if (!report) {
        check(report.error().code != 0 && !report.error().message.empty(),
              "an error without code or message");
        check(db.txn_id() == before, "a refused import changed the db");
        return 0;
    }
    if (db.txn_id() != before) {
        const auto verified = must(core::verify(db.store()), "verify");
        if (!verified.ok()) {
            for (const auto& p : verified.problems) std::fprintf(stderr, "verify: %s\n", p.c_str());
        }
        check(verified.ok(), "an accepted import left an inconsistent db");
        check_symlinks(must(db.store().read(), "read txn"), core::kRootIno, 0);
        db.reset();
    }
    return 0;
}
