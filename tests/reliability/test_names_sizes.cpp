// Hostile names and sizes through the mount (issue 6, point 5): every byte but '/' and
// NUL in names, 255-byte names (256: ENAMETOOLONG), a tree deeper than PATH_MAX, empty
// files and a 1 GiB file. Everything must read back byte-exact, also after a remount
// (readdir lists exactly the names created), and leave a db `kcache verify` finds clean.
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <xxhash.h>

#include "mount_fixture.hpp"

using namespace kcache::test;

namespace {

// Names in the directory open as `dir_fd` (not "." and ".."), as readdir returns them.
std::set<std::string> list_fd(int dir_fd) {
    const int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE_SYS(fd);
    DIR* d = ::fdopendir(fd);
    REQUIRE(d != nullptr);
    std::set<std::string> names;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        CHECK(names.insert(name).second);  // listed once
    }
    ::closedir(d);
    return names;
}

std::set<std::string> list_dir(const std::string& path) {
    Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    REQUIRE_SYS(fd.get());
    return list_fd(fd.get());
}

std::string printable(const std::string& name) {
    std::string out;
    for (const unsigned char c : name) {
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += static_cast<char>(c);
        } else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        }
    }
    return out;
}

std::string read_at(int dir_fd, const std::string& name) {
    Fd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC));
    INFO("openat " << printable(name));
    REQUIRE_SYS(fd.get());
    auto bytes = read_fd(fd.get());
    REQUIRE(bytes.has_value());
    return *bytes;
}

void write_at(int dir_fd, const std::string& name, const std::string& bytes) {
    Fd fd(::openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    INFO("create " << printable(name));
    REQUIRE_SYS(fd.get());
    REQUIRE(write_fd(fd.get(), bytes) == 0);
    REQUIRE_SYS(fd.close());
}

void require_verify_clean(const MountedCache& cache) {
    const ProcResult r = run_kcache(cache.db(), {"verify"});
    INFO("kcache verify: " << r.describe() << "\nstdout:\n" << r.out);
    REQUIRE(r.exit_code == 0);
}

// The hostile names: one per byte alone ('.' alone is the directory itself), one per
// byte between two letters, and mixtures.
std::vector<std::string> odd_names() {
    std::vector<std::string> names;
    std::string all;
    for (int b = 1; b < 256; ++b) {
        if (b == '/') continue;
        const char c = static_cast<char>(b);
        if (c != '.') names.emplace_back(1, c);
        names.push_back(std::string("a") + c + "b");
        all += c;
    }
    names.push_back(all);  // 254 bytes: every byte at once
    // (Single bytes such as "-", " ", "\n" or "*" are in the list already.)
    for (const char* n : {"-rf",
                          "--help",
                          "-n",
                          "  ",
                          " lead",
                          "trail ",
                          "a b c",
                          "\r\n",
                          "...",
                          "..a",
                          "a..",
                          ".hidden",
                          "..\n",
                          "\xff\xfe",
                          "\xc3\x28",
                          "\xed\xa0\x80",
                          "\xc0\xaf",
                          "\xf4\x90\x80\x80",
                          "\xe2\x82",
                          "caf\xc3\xa9",
                          "\xe2\x80\xae"
                          "cod.exe",
                          "[a-z]",
                          "$(reboot)",
                          "`id`",
                          "a;;b",
                          "%s%n",
                          "~user",
                          "con",
                          "nul.txt",
                          "kernel.json\n",
                          "kernel.cubin "}) {
        names.emplace_back(n);
    }
    return names;
}

}  // namespace

TEST_CASE("names: every byte but '/' and NUL works and survives a remount byte-exact",
          "[reliability][names]") {
    MountedCache cache;
    const auto names = odd_names();
    REQUIRE(std::set<std::string>(names.begin(), names.end()).size() == names.size());
    REQUIRE(mkdir(cache.p("files").c_str(), 0755) == 0);
    REQUIRE(mkdir(cache.p("dirs").c_str(), 0755) == 0);
    {
        Fd files(::open(cache.p("files").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        Fd dirs(::open(cache.p("dirs").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        REQUIRE_SYS(files.get());
        REQUIRE_SYS(dirs.get());
        for (const auto& name : names) {
            write_at(files.get(), name, "content of " + name);  // a file's content is its name
            INFO("mkdir " << printable(name));
            REQUIRE_SYS(::mkdirat(dirs.get(), name.c_str(), 0755));
            Fd sub(::openat(dirs.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            REQUIRE_SYS(sub.get());
            write_at(sub.get(), name, name);  // a file of the same name below it
            REQUIRE_SYS(::symlinkat(name.c_str(), sub.get(), "link"));  // odd target
        }
    }
    // Top-level odd names are entries of their own (entry depth 1).
    const std::string top = std::string("\xff-\n ") + "\x01";
    REQUIRE(write_all(cache.p(top), "top") == 0);

    auto check_all = [&](const char* when) {
        INFO(when);
        const std::set<std::string> expected(names.begin(), names.end());
        CHECK(list_dir(cache.p("files")) == expected);
        CHECK(list_dir(cache.p("dirs")) == expected);
        CHECK(list_dir(cache.mnt().string()) == std::set<std::string>{"files", "dirs", top});
        CHECK(read_all(cache.p(top)) == std::optional<std::string>("top"));
        Fd files(::open(cache.p("files").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        Fd dirs(::open(cache.p("dirs").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        for (const auto& name : names) {
            INFO(printable(name));
            CHECK(read_at(files.get(), name) == "content of " + name);
            Fd sub(::openat(dirs.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            REQUIRE_SYS(sub.get());
            CHECK(list_fd(sub.get()) == std::set<std::string>{name, "link"});
            CHECK(read_at(sub.get(), "link") == name);  // follows the odd target
            char target[PATH_MAX];
            const ssize_t n = ::readlinkat(sub.get(), "link", target, sizeof target);
            REQUIRE_SYS(n);
            CHECK(std::string(target, static_cast<std::size_t>(n)) == name);
        }
    };
    check_all("as created");
    cache.remount();
    check_all("after a remount");

    // Renames between odd names and removal work too.
    Fd files(::open(cache.p("files").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    for (std::size_t i = 0; i + 1 < names.size(); i += 2) {
        INFO(printable(names[i]) << " -> " << printable(names[i + 1]));
        REQUIRE_SYS(::renameat(files.get(), names[i].c_str(), files.get(), names[i + 1].c_str()));
        CHECK(read_at(files.get(), names[i + 1]) == "content of " + names[i]);
        REQUIRE_SYS(::unlinkat(files.get(), names[i + 1].c_str(), 0));
    }
    files.reset();
    const std::set<std::string> left =
        names.size() % 2 ? std::set<std::string>{names.back()} : std::set<std::string>{};
    CHECK(list_dir(cache.p("files")) == left);
    require_verify_clean(cache);
    std::printf("names: %zu odd names, each as a file, a directory and a symlink target\n",
                names.size());
}

TEST_CASE("names: 255 bytes work, 256 give ENAMETOOLONG", "[reliability][names]") {
    MountedCache cache;
    std::string max_name, too_long;
    for (int i = 0; i < 255; ++i) max_name += static_cast<char>(0x80 + i % 0x7f);  // not UTF-8
    too_long = max_name + "x";
    REQUIRE(mkdir(cache.p("k").c_str(), 0755) == 0);
    Fd k(::open(cache.p("k").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    REQUIRE_SYS(k.get());

    write_at(k.get(), max_name, "max");
    REQUIRE_SYS(::mkdirat(k.get(), (max_name.substr(1) + "d").c_str(), 0755));
    REQUIRE_SYS(::symlinkat(max_name.c_str(), k.get(), (max_name.substr(1) + "l").c_str()));
    REQUIRE_FAILS_WITH(::openat(k.get(), too_long.c_str(), O_WRONLY | O_CREAT, 0644), ENAMETOOLONG);
    REQUIRE_FAILS_WITH(::mkdirat(k.get(), too_long.c_str(), 0755), ENAMETOOLONG);
    REQUIRE_FAILS_WITH(::symlinkat("t", k.get(), too_long.c_str()), ENAMETOOLONG);
    REQUIRE_FAILS_WITH(::renameat(k.get(), max_name.c_str(), k.get(), too_long.c_str()),
                       ENAMETOOLONG);
    struct stat st {};
    REQUIRE_FAILS_WITH(::fstatat(k.get(), too_long.c_str(), &st, 0), ENAMETOOLONG);
    // A 255-byte entry name at the top too.
    REQUIRE(write_all(cache.p(max_name), "top max") == 0);

    const std::set<std::string> expected{max_name, max_name.substr(1) + "d",
                                         max_name.substr(1) + "l"};
    auto check_all = [&](const char* when) {
        INFO(when);
        CHECK(list_dir(cache.p("k")) == expected);
        CHECK(list_dir(cache.mnt().string()) == std::set<std::string>{"k", max_name});
        Fd dir(::open(cache.p("k").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        CHECK(read_at(dir.get(), max_name) == "max");
        CHECK(read_at(dir.get(), max_name.substr(1) + "l") == "max");
        CHECK(read_all(cache.p(max_name)) == std::optional<std::string>("top max"));
    };
    check_all("as created");
    k.reset();
    cache.remount();
    check_all("after a remount");
    require_verify_clean(cache);
}

TEST_CASE("names: a tree 200 levels deep, its paths longer than PATH_MAX", "[reliability][names]") {
    MountedCache cache;
    constexpr int kLevels = 200;
    // 40-byte components: the deepest path is about 8 KiB, twice PATH_MAX.
    auto component = [](int level) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "level-%03d-%s", level, std::string(30, 'd').c_str());
        return std::string(buf);
    };
    REQUIRE(component(0).size() == 40);
    REQUIRE(static_cast<std::size_t>(kLevels) * 41 > PATH_MAX);

    // Creates the tree with *at calls, one open directory per level.
    {
        Fd at(::open(cache.mnt().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        REQUIRE_SYS(at.get());
        for (int level = 0; level < kLevels; ++level) {
            const std::string name = component(level);
            INFO("level " << level);
            REQUIRE_SYS(::mkdirat(at.get(), name.c_str(), 0755));
            Fd next(::openat(at.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            REQUIRE_SYS(next.get());
            write_at(next.get(), "f", "level " + std::to_string(level));
            at = std::move(next);
        }
        write_at(at.get(), "empty", "");
    }
    // A path through the whole tree is too long for the kernel's path walk.
    std::string full = cache.mnt().string();
    for (int level = 0; level < kLevels; ++level) full += "/" + component(level);
    REQUIRE(full.size() > PATH_MAX);
    struct stat st {};
    REQUIRE_FAILS_WITH(::stat((full + "/f").c_str(), &st), ENAMETOOLONG);

    // Walks down, checking each level's listing and file.
    auto walk = [&](const char* when) {
        INFO(when);
        Fd at(::open(cache.mnt().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        REQUIRE_SYS(at.get());
        CHECK(list_fd(at.get()) == std::set<std::string>{component(0)});
        for (int level = 0; level < kLevels; ++level) {
            INFO("level " << level);
            Fd next(
                ::openat(at.get(), component(level).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            REQUIRE_SYS(next.get());
            const std::set<std::string> expected =
                level + 1 < kLevels ? std::set<std::string>{"f", component(level + 1)}
                                    : std::set<std::string>{"f", "empty"};
            CHECK(list_fd(next.get()) == expected);
            CHECK(read_at(next.get(), "f") == "level " + std::to_string(level));
            at = std::move(next);
        }
        REQUIRE_SYS(::fstatat(at.get(), "empty", &st, 0));
        CHECK(st.st_size == 0);
        CHECK(read_at(at.get(), "empty").empty());
    };
    walk("as created");
    cache.remount();
    walk("after a remount");
    require_verify_clean(cache);

    // Exported and imported into another db, the tree arrives whole (paths over PATH_MAX).
    {
        TempDir other;
        const std::string bundle = (other / "deep.kcb").string();
        const fs::path db2 = other / "db";
        for (const auto& [db, args] :
             {std::pair{cache.db(), std::vector<std::string>{"export", "-o", bundle}},
              std::pair{db2, std::vector<std::string>{"init"}},
              std::pair{db2, std::vector<std::string>{"import", bundle}},
              std::pair{db2, std::vector<std::string>{"verify"}}}) {
            const ProcResult r = run_kcache(db, args);
            INFO("kcache " << args[0] << ": " << r.describe());
            REQUIRE(r.exit_code == 0);
        }
        const ProcResult ls = run_kcache(db2, {"ls"});
        CHECK(ls.out.find(component(0)) != std::string::npos);
    }

    // Removes it bottom-up, holding each level's directory open.
    {
        std::vector<Fd> dirs;
        dirs.emplace_back(::open(cache.mnt().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        for (int level = 0; level < kLevels; ++level) {
            dirs.emplace_back(::openat(dirs.back().get(), component(level).c_str(),
                                       O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            REQUIRE_SYS(dirs.back().get());
        }
        REQUIRE_SYS(::unlinkat(dirs.back().get(), "empty", 0));
        for (int level = kLevels - 1; level >= 0; --level) {
            INFO("level " << level);
            Fd& holder = dirs[static_cast<std::size_t>(level)];
            REQUIRE_SYS(::unlinkat(dirs[static_cast<std::size_t>(level) + 1].get(), "f", 0));
            if (level > 0) {  // the level above still holds this one: not removable yet
                REQUIRE_FAILS_WITH(::unlinkat(dirs[static_cast<std::size_t>(level) - 1].get(),
                                              component(level - 1).c_str(), AT_REMOVEDIR),
                                   ENOTEMPTY);
            }
            REQUIRE_SYS(::unlinkat(holder.get(), component(level).c_str(), AT_REMOVEDIR));
        }
    }
    CHECK(list_dir(cache.mnt().string()).empty());
    require_verify_clean(cache);
}

TEST_CASE("sizes: empty files and a 1 GiB file, byte-exact across a remount",
          "[reliability][sizes]") {
    DaemonOptions options;
    options.watchdog_s = 900;  // 1 GiB through FUSE several times on a busy CI machine
    MountedCache cache(options);
    REQUIRE(mkdir(cache.p("k").c_str(), 0755) == 0);

    // Empty files: created empty, truncated to empty, written with nothing.
    REQUIRE(write_all(cache.p("k/empty1"), "") == 0);
    REQUIRE(write_all(cache.p("k/empty2"), "not empty yet") == 0);
    REQUIRE_SYS(::truncate(cache.p("k/empty2").c_str(), 0));
    {
        Fd fd(::open(cache.p("k/empty3").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        REQUIRE_SYS(fd.get());
        REQUIRE_SYS(fd.close());
    }

    // 1 GiB of incompressible bytes, written in 1 MiB writes; only hashes are kept.
    constexpr std::size_t kChunk = 1 << 20;
    constexpr std::size_t kSize = std::size_t{1} << 30;
    const std::string big = cache.p("k/big.bin");
    XXH3_state_t* state = XXH3_createState();
    REQUIRE(state != nullptr);
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    auto next_chunk = [&](std::string& chunk) {
        chunk.resize(kChunk);
        for (std::size_t i = 0; i < kChunk; i += 8) {  // splitmix64
            std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            std::memcpy(chunk.data() + i, &z, 8);
        }
    };
    const auto t0 = std::chrono::steady_clock::now();
    XXH3_64bits_reset(state);
    {
        Fd fd(::open(big.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
        REQUIRE_SYS(fd.get());
        std::string chunk;
        for (std::size_t done = 0; done < kSize; done += kChunk) {
            next_chunk(chunk);
            XXH3_64bits_update(state, chunk.data(), chunk.size());
            const int e = write_fd(fd.get(), chunk);
            INFO("write at " << done << ": " << std::strerror(e));
            REQUIRE(e == 0);
        }
        REQUIRE_SYS(fd.close());
    }
    const std::uint64_t written = XXH3_64bits_digest(state);
    const auto t1 = std::chrono::steady_clock::now();

    auto hash_file = [&](const std::string& path) {
        Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        REQUIRE_SYS(fd.get());
        XXH3_64bits_reset(state);
        std::string buf(kChunk, '\0');
        std::size_t total = 0;
        for (;;) {
            const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
            REQUIRE_SYS(n);
            if (n == 0) break;
            XXH3_64bits_update(state, buf.data(), static_cast<std::size_t>(n));
            total += static_cast<std::size_t>(n);
        }
        CHECK(total == kSize);
        return XXH3_64bits_digest(state);
    };
    auto check_files = [&](const char* when) {
        INFO(when);
        struct stat st {};
        REQUIRE_SYS(::stat(big.c_str(), &st));
        CHECK(static_cast<std::size_t>(st.st_size) == kSize);
        CHECK(hash_file(big) == written);
        for (const char* name : {"k/empty1", "k/empty2", "k/empty3"}) {
            INFO(name);
            REQUIRE_SYS(::stat(cache.p(name).c_str(), &st));
            CHECK(st.st_size == 0);
            CHECK(read_all(cache.p(name)) == std::optional<std::string>(""));
        }
        CHECK(list_dir(cache.p("k")) ==
              std::set<std::string>{"empty1", "empty2", "empty3", "big.bin"});
    };
    check_files("as written");
    const auto t2 = std::chrono::steady_clock::now();
    cache.remount();
    const auto t3 = std::chrono::steady_clock::now();
    check_files("after a remount");
    const auto t4 = std::chrono::steady_clock::now();
    XXH3_freeState(state);
    require_verify_clean(cache);
    const auto t5 = std::chrono::steady_clock::now();
    auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    std::printf(
        "1 GiB: write %.1f s, read %.1f s, remount %.1f s, read after remount %.1f s, "
        "kcache verify %.1f s\n",
        s(t0, t1), s(t1, t2), s(t2, t3), s(t3, t4), s(t4, t5));
}
