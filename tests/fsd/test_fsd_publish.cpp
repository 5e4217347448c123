// Publish-on-close (DESIGN.md, contract item 4): a file's content is published when its
// writer closes it; every reader sees an old or a new complete content, never a part.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

using namespace kcache::test;

namespace {

// Reads `path` in a separate process: 0 when it has exactly `expected`, else 1 (2 when
// it cannot be read). Diagnostics go to stderr.
int child_reads(const std::string& path, const std::string& expected) {
    return run_child(
               [&] {
                   const auto got = read_all(path);
                   if (!got) {
                       std::fprintf(stderr, "reader: %s: %s\n", path.c_str(), std::strerror(errno));
                       return 2;
                   }
                   if (*got != expected) {
                       std::fprintf(stderr, "reader: %s: %zu bytes, not the %zu expected\n",
                                    path.c_str(), got->size(), expected.size());
                       return 1;
                   }
                   return 0;
               },
               30)
        .exit_code;
}

}  // namespace

TEST_CASE("an in-place O_TRUNC rewrite is published when the writer closes", "[fsd][publish]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("hash").c_str(), 0755));
    const std::string path = cache.p("hash/hash.vmfb");
    const std::string old_content = random_bytes(256 * 1024, 1);
    const std::string new_content = random_bytes(300 * 1024, 2);
    REQUIRE(write_all(path, old_content) == 0);
    REQUIRE(child_reads(path, old_content) == 0);

    Fd writer(open(path.c_str(), O_WRONLY | O_TRUNC));
    REQUIRE_SYS(writer.get());
    // Truncated but nothing written yet: others still see the old complete content.
    CHECK(child_reads(path, old_content) == 0);
    const std::size_t half = new_content.size() / 2;
    REQUIRE(write_fd(writer.get(), std::string_view(new_content).substr(0, half)) == 0);
    CHECK(child_reads(path, old_content) == 0);
    REQUIRE(write_fd(writer.get(), std::string_view(new_content).substr(half)) == 0);
    CHECK(child_reads(path, old_content) == 0);
    REQUIRE_SYS(writer.close());
    // Once close returns, everybody sees the new content.
    CHECK(child_reads(path, new_content) == 0);
    CHECK(read_all(path) == new_content);
}

TEST_CASE("a reader that opened before a publish sees one complete version", "[fsd][publish]") {
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("hash").c_str(), 0755));
    const std::string path = cache.p("hash/hash.json");
    const std::string old_content = random_bytes(200 * 1024, 3);
    const std::string new_content = random_bytes(200 * 1024, 4);
    REQUIRE(write_all(path, old_content) == 0);

    Fd reader(open(path.c_str(), O_RDONLY));
    REQUIRE_SYS(reader.get());
    std::string head(64 * 1024, '\0');
    REQUIRE(read(reader.get(), head.data(), head.size()) == static_cast<ssize_t>(head.size()));
    // Another process rewrites it in place and closes. Its open waits until this reader,
    // which reads through the page cache, has closed (PageCache::admit_writer; at most
    // kWriterWait, 2 s, after which a reader still open may see the rewrite's pages, as
    // docs/operations.md says). The child closes the copy of the reader's descriptor it
    // inherits: else the reader's RELEASE would wait for the child's exit, and the
    // rewrite for the 2 s.
    const int inherited = reader.get();
    Child rewriter([&] {
        close(inherited);
        return write_all(path, new_content);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(rewriter.running());  // held at its open while this reader is open
    const auto rest = read_fd(reader.get());
    REQUIRE(rest.has_value());
    const std::string seen = head + *rest;
    INFO("the open reader saw " << seen.size() << " bytes: "
                                << (seen == new_content ? "the new content"
                                    : seen.substr(0, head.size()) ==
                                            old_content.substr(0, head.size())
                                        ? "starting with the old content"
                                        : "not starting with the old content"));
    CHECK(seen == old_content);
    reader.reset();
    CHECK(rewriter.join().exit_code == 0);
    CHECK(read_all(path) == new_content);
}

TEST_CASE(
    "a reader in the page cache never reads past its version while another process extends the "
    "file",
    "[fsd][publish]") {
    // The kernel keeps one size per inode. A writer's writes grow it at once (they
    // bypass the page cache, not the size), so a reader that still reads the old
    // version through the page cache would read on past that version's end, and the
    // kernel fills what the daemon does not send with zeros. The daemon answers such a
    // writer's open only once other processes' page-cache readers have closed.
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("hash").c_str(), 0755));
    const std::string path = cache.p("hash/hash.cubin");
    const std::string old_content = random_bytes(64 * 1024, 5);
    REQUIRE(write_all(path, old_content) == 0);

    Fd reader(open(path.c_str(), O_RDONLY));
    REQUIRE_SYS(reader.get());
    REQUIRE(read_fd(reader.get()) == old_content);  // its pages are now cached

    const std::string block = random_bytes(4096, 6);
    Child writer([&] {
        const int fd = open(path.c_str(), O_WRONLY);
        if (fd < 0) return 2;
        const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
        for (int k = 0; std::chrono::steady_clock::now() < end; ++k) {
            const auto off = static_cast<off_t>(old_content.size() +
                                                static_cast<std::size_t>(k % 16) * block.size());
            if (pwrite(fd, block.data(), block.size(), off) != static_cast<ssize_t>(block.size()))
                return 3;
        }
        return close(fd) == 0 ? 0 : 4;
    });
    int passes = 0, torn = 0;
    std::size_t torn_size = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
    while (std::chrono::steady_clock::now() < until) {
        REQUIRE_SYS(lseek(reader.get(), 0, SEEK_SET));
        const auto seen = read_fd(reader.get());
        REQUIRE(seen.has_value());
        ++passes;
        if (*seen != old_content) {
            ++torn;
            torn_size = seen->size();
        }
    }
    reader.reset();
    INFO(torn << " of " << passes << " passes over the open reader did not read its version (last: "
              << torn_size << " bytes, not " << old_content.size() << ")");
    CHECK(torn == 0);
    REQUIRE(writer.join().exit_code == 0);
    std::string expected = old_content;
    for (int k = 0; k < 16; ++k) expected += block;
    CHECK(read_all(path) == expected);
}

TEST_CASE("a file renamed right after its writer closed has its whole content", "[fsd][publish]") {
    // The kernel's RELEASE reaches the daemon asynchronously, after close returns: a
    // rename, or a reader, may arrive before it. Triton and Inductor do exactly this.
    MountedCache cache;
    for (int i = 0; i < 40; ++i) {
        const std::string key = cache.p("key" + std::to_string(i));
        REQUIRE_SYS(mkdir(key.c_str(), 0755));
        const std::string content = random_bytes(static_cast<std::size_t>(1000 + i * 4099),
                                                 static_cast<std::uint64_t>(100 + i));
        const std::string tmp = key + "/.tmp." + std::to_string(getpid());
        REQUIRE(write_all(tmp, content) == 0);
        REQUIRE_SYS(rename(tmp.c_str(), (key + "/kernel.cubin").c_str()));
        INFO("key " << i);
        REQUIRE(child_reads(key + "/kernel.cubin", content) == 0);
        struct stat st {};
        REQUIRE_SYS(stat((key + "/kernel.cubin").c_str(), &st));
        CHECK(st.st_size == static_cast<off_t>(content.size()));
    }
}

TEST_CASE("8 processes storing the same entries at once leave complete versions",
          "[fsd][publish][concurrency]") {
    MountedCache cache;
    constexpr int kWriters = 8;
    constexpr int kEntries = 10;
    constexpr int kRounds = 3;
    const std::vector<std::string> files{"kernel.cubin", "kernel.json", "kernel.ptx"};
    auto file_size = [](std::size_t f) { return std::size_t{96 * 1024} + f * 33 * 1024 + 7; };
    // Content of writer w: its id byte ('A' + w) repeated, to the file's full length.

    int start_pipe[2];
    REQUIRE_SYS(pipe(start_pipe));
    std::vector<std::unique_ptr<Child>> writers;
    for (int w = 0; w < kWriters; ++w) {
        writers.push_back(std::make_unique<Child>([&, w] {
            close(start_pipe[1]);
            char go = 0;
            if (read(start_pipe[0], &go, 1) < 0) return 90;  // EOF when the parent closes
            const char id = static_cast<char>('A' + w);
            for (int round = 0; round < kRounds; ++round) {
                for (int e = 0; e < kEntries; ++e) {
                    const std::string dir = cache.p("entry" + std::to_string(e));
                    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
                        std::fprintf(stderr, "writer %c: mkdir %s: %s\n", id, dir.c_str(),
                                     std::strerror(errno));
                        return 1;
                    }
                    for (std::size_t f = 0; f < files.size(); ++f) {
                        const std::string path = dir + "/" + files[f];
                        const std::string content(file_size(f), id);
                        int err = 0;
                        if ((w + round) % 2 == 0) {
                            // In place with O_TRUNC, written in several pieces (Wave).
                            const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
                            if (fd < 0) {
                                err = errno;
                            } else {
                                for (std::size_t off = 0; off < content.size() && !err;
                                     off += 16 * 1024) {
                                    err = write_fd(
                                        fd, std::string_view(content).substr(off, 16 * 1024));
                                }
                                if (close(fd) != 0 && !err) err = errno;
                            }
                        } else {
                            // A private temporary name, then rename (Triton, Inductor).
                            const std::string tmp = dir + "/.tmp." + std::string(1, id);
                            err = write_all(tmp, content);
                            if (!err && rename(tmp.c_str(), path.c_str()) != 0) err = errno;
                        }
                        if (err) {
                            std::fprintf(stderr, "writer %c: %s: %s\n", id, path.c_str(),
                                         std::strerror(err));
                            return 2;
                        }
                    }
                }
            }
            return 0;
        }));
    }
    // Readers run alongside: whatever they open is one writer's complete version.
    std::vector<std::unique_ptr<Child>> readers;
    const std::string done_flag = (cache.root() / "writers-done").string();
    for (int r = 0; r < 2; ++r) {
        readers.push_back(std::make_unique<Child>([&] {
            close(start_pipe[1]);
            while (access(done_flag.c_str(), F_OK) != 0) {
                for (int e = 0; e < kEntries; ++e) {
                    for (std::size_t f = 0; f < files.size(); ++f) {
                        const std::string path =
                            cache.p("entry" + std::to_string(e) + "/" + files[f]);
                        const auto got = read_all(path);
                        if (!got) {
                            if (errno == ENOENT) continue;  // not stored yet
                            std::fprintf(stderr, "reader: %s: %s\n", path.c_str(),
                                         std::strerror(errno));
                            return 1;
                        }
                        // Empty is the old content of a file an in-place writer has
                        // just created; anything else is one writer's whole version.
                        if (got->empty()) continue;
                        const bool one_writer = std::all_of(
                            got->begin(), got->end(), [&](char c) { return c == got->front(); });
                        if (got->size() != file_size(f) || !one_writer) {
                            std::fprintf(stderr, "reader: %s: torn (%zu bytes)\n", path.c_str(),
                                         got->size());
                            return 2;
                        }
                    }
                }
            }
            return 0;
        }));
    }
    close(start_pipe[0]);
    close(start_pipe[1]);  // go

    for (int w = 0; w < kWriters; ++w) {
        const ChildResult r = writers[static_cast<std::size_t>(w)]->join(120);
        INFO("writer " << static_cast<char>('A' + w));
        CHECK_FALSE(r.timed_out);
        CHECK(r.exit_code == 0);
    }
    write_file(done_flag, "");
    for (auto& reader : readers) {
        const ChildResult r = reader->join(60);
        CHECK(r.exit_code == 0);
    }

    for (int e = 0; e < kEntries; ++e) {
        const std::string dir = cache.p("entry" + std::to_string(e));
        for (std::size_t f = 0; f < files.size(); ++f) {
            const std::string path = dir + "/" + files[f];
            INFO(path);
            const auto got = read_all(path);
            REQUIRE(got.has_value());
            REQUIRE(got->size() == file_size(f));
            const char id = got->front();
            CHECK((id >= 'A' && id < 'A' + kWriters));
            CHECK(std::all_of(got->begin(), got->end(), [&](char c) { return c == id; }));
        }
        // No temporary file was left behind: each writer renamed its own.
        std::vector<std::string> names;
        for (const auto& de : fs::directory_iterator(dir)) names.push_back(de.path().filename());
        std::sort(names.begin(), names.end());
        CHECK(names == std::vector<std::string>{"kernel.cubin", "kernel.json", "kernel.ptx"});
    }

    cache.unmount();
    const auto stats = cache_stats(cache.db());
    // Each entry went from absent to populated once, whoever won.
    CHECK(stat_value(stats, "misses") == static_cast<std::uint64_t>(kEntries));
    CHECK(stat_value(stats, "entries") == static_cast<std::uint64_t>(kEntries));
}

TEST_CASE("a writer that exits without closing still publishes what it wrote", "[fsd][publish]") {
    // The kernel closes an exiting process's files: a normal exit keeps the bytes, as
    // on a local disk (only a writer killed by a signal publishes nothing).
    MountedCache cache;
    REQUIRE_SYS(mkdir(cache.p("k").c_str(), 0755));
    const std::string path = cache.p("k/kernel.cubin");
    const std::string content = random_bytes(200 * 1024, 77);
    const ChildResult r = run_child([&] {
        const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write_fd(fd, content) != 0) return 1;
        _exit(0);  // no close(): the exit closes it
    });
    REQUIRE(r.exit_code == 0);
    CHECK(read_all(path) == content);
}
