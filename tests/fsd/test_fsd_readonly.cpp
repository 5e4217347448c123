// kcache-fsd --read-only: serving a prepared cache at the floor of the floor. OPEN is
// answered ENOSYS, so the kernel stops sending OPEN, FLUSH and RELEASE; files are
// still read whole and right, by several processes, through read() and mmap, and
// nothing is counted (docs/stats.md, "Read-only serving").
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "mount_fixture.hpp"
#include "temp_dir.hpp"

using namespace kcache::test;

namespace {

std::size_t count_requests(const std::string& log, const std::string& opcode) {
    const std::string needle = "opcode: " + opcode + " ";
    std::size_t n = 0;
    for (auto at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
    return n;
}

// Opens, fstats, reads to the end and maps `path`; 0 when all of it says `content`.
int read_like_a_compiler(const std::string& path, const std::string& content) {
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return 1;
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != content.size()) return 2;
    const auto bytes = read_fd(fd);
    if (!bytes || *bytes != content) return 3;
    void* map = mmap(nullptr, content.size(), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) return 4;
    const bool same = std::string_view(static_cast<const char*>(map), content.size()) == content;
    munmap(map, content.size());
    close(fd);
    return same ? 0 : 5;
}

}  // namespace

TEST_CASE("read-only serving serves every file without OPEN, FLUSH or RELEASE and counts nothing",
          "[fsd][readonly]") {
    TempDir dir;
    const fs::path db = dir.path() / "db";
    DaemonOptions writable;
    writable.db = db;
    std::vector<std::pair<std::string, std::string>> files;
    {
        MountedCache cache(writable);
        for (int i = 0; i < 12; ++i) {
            const std::string entry = "e" + std::to_string(i);
            REQUIRE_SYS(mkdir(cache.p(entry).c_str(), 0755));
            const std::string content =
                random_bytes(static_cast<std::size_t>(5000 + 4099 * i), 700u + i);
            REQUIRE(write_all(cache.p(entry + "/kernel.cubin"), content) == 0);
            files.emplace_back(entry + "/kernel.cubin", content);
        }
        cache.unmount();
    }
    const auto before = cache_stats(db);
    DaemonOptions read_only;
    read_only.db = db;
    read_only.args = {"--read-only", "-d"};  // -d: the request log this test counts in
    MountedCache cache(read_only);
    for (int reader = 0; reader < 3; ++reader) {  // several processes, each a would-be hit
        const ChildResult r = run_child([&] {
            for (std::size_t i = 0; i < files.size(); ++i) {
                if (int rc = read_like_a_compiler(cache.p(files[i].first), files[i].second);
                    rc != 0) {
                    return 10 * static_cast<int>(i) + rc;
                }
            }
            return 0;
        });
        INFO("reader " << reader);
        CHECK(r.exit_code == 0);
    }
    REQUIRE_FAILS_WITH(open(cache.p("e0/new.json").c_str(), O_WRONLY | O_CREAT, 0644), EROFS);
    REQUIRE_FAILS_WITH(open(cache.p("e1/kernel.cubin").c_str(), O_RDWR), EROFS);
    cache.unmount();
    const std::string log = cache.daemon_stderr();
    // The first open is answered ENOSYS; the kernel asks no more (36 opens, 36 closes).
    CHECK(count_requests(log, "OPEN") <= 1);
    CHECK(count_requests(log, "FLUSH") <= 1);
    CHECK(count_requests(log, "RELEASE") == 0);
    // Attributes are the kernel's to keep: not one GETATTR per fstat.
    CHECK(count_requests(log, "GETATTR") < files.size());
    const auto after = cache_stats(db);
    CHECK(stat_value(after, "hits") == stat_value(before, "hits"));
    CHECK(stat_value(after, "opens") == stat_value(before, "opens"));
}
