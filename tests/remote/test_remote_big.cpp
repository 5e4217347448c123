// Issue 14 point 8: a file larger than 512 MiB (Redis's largest value) stored through
// mount A is served byte-exact through mount B via the shared tier, in chunks: every
// value in Redis stays near the protocol's chunk size (1 MiB), and B's copy is compared
// with what A was given as a stream (the file is never held whole by the test).
//
// Its own program and CTest test (tests/remote/CMakeLists.txt): it moves about 2 GiB
// through FUSE, LMDB and Redis, so it has a TIMEOUT of its own. The data is
// incompressible (zstd gains nothing, as for real cubins) and in one file, so the test
// measures nothing but the path. Skipped without redis-server, /dev/fuse or fusermount3.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::DaemonOptions;
using kcache::test::MountedCache;
using kcache::test::RedisServer;
namespace test = kcache::test;
namespace proto = kcache::remote::proto;

namespace {

const std::string kKey = "BIGF2XUOUG4VYYBXBZYN7QL4E6AX3B7AXEAKLO5N3NS5ZC6WRD4GQ";
// Over Redis's 512 MB limit on one value, and not a whole number of chunks.
constexpr std::uint64_t kSize = (std::uint64_t{520} << 20) + 12'345;
constexpr std::size_t kPiece = std::size_t{1} << 20;

// Incompressible bytes [offset, offset + n) of a stream named by `seed` (splitmix64 of
// the 8-byte word index): the same bytes whoever asks, in any pieces.
void stream_piece(std::uint64_t seed, std::uint64_t offset, std::size_t n, std::string& out) {
    out.resize(n);
    for (std::size_t i = 0; i < n;) {
        const std::uint64_t word = (offset + i) / 8;
        std::uint64_t z = seed + (word + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const std::size_t at = static_cast<std::size_t>((offset + i) % 8);
        const std::size_t take = std::min<std::size_t>(8 - at, n - i);
        for (std::size_t k = 0; k < take; ++k)
            out[i + k] = static_cast<char>((z >> (8 * (at + k))) & 0xFF);
        i += take;
    }
}

// Writes the stream to `path` (created, or truncated), 1 MiB per write.
void write_stream(const std::string& path, std::uint64_t seed, std::uint64_t size) {
    test::Fd fd(::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644));
    REQUIRE(fd);
    std::string piece;
    for (std::uint64_t off = 0; off < size; off += kPiece) {
        stream_piece(seed, off,
                     static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, size - off)), piece);
        REQUIRE(test::write_fd(fd.get(), piece) == 0);
    }
    REQUIRE_SYS(fd.close());
}

// Compares `path` with the stream, 1 MiB at a time; the first differing offset on failure.
void require_stream(const std::string& path, std::uint64_t seed, std::uint64_t size) {
    test::Fd fd(::open(path.c_str(), O_RDONLY));
    REQUIRE(fd);
    struct stat st {};
    REQUIRE_SYS(::fstat(fd.get(), &st));
    REQUIRE(static_cast<std::uint64_t>(st.st_size) == size);
    std::string want, got(kPiece, '\0');
    for (std::uint64_t off = 0; off < size; off += kPiece) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, size - off));
        stream_piece(seed, off, n, want);
        std::size_t have = 0;
        while (have < n) {
            const ssize_t r = ::read(fd.get(), got.data() + have, n - have);
            INFO("read at " << off + have);
            REQUIRE(r > 0);
            have += static_cast<std::size_t>(r);
        }
        if (std::string_view(got.data(), n) != want) {
            std::size_t first = 0;
            while (got[first] == want[first]) ++first;
            FAIL("differs from the stream at byte " << off + first);
        }
    }
    char extra = 0;
    REQUIRE(::read(fd.get(), &extra, 1) == 0);  // and nothing after it
}

std::uint64_t stat_of(const MountedCache& m, const std::string& name) {
    return test::stat_value(test::cache_stats(m.db()), name);
}

}  // namespace

TEST_CASE("fsd remote: a file over 512 MiB travels from mount A to mount B in chunks",
          "[remote][fsd][big]") {
    // Room for the blob and its chunks with headroom; never evicts (noeviction).
    RedisServer redis({"--maxmemory", "2gb", "--maxmemory-policy", "noeviction"});
    DaemonOptions options;
    // One remote round trip moves 8 chunks (8 MiB): generous deadlines for a loaded machine.
    options.args = {"--remote", redis.url(),        "--remote-namespace",
                    "fsd",      "--remote-timeout", "60s"};
    options.watchdog_s = 540;  // below the CTest TIMEOUT (600 s)
    MountedCache a(options);
    MountedCache b(options);
    const std::uint64_t seed = 0x5EEDB16F11E;

    // Stored as Triton stores a launcher .so: written to a temp dir, renamed into place.
    const std::string dir = a.p(kKey), tmp = dir + "/tmp.pid_1_big";
    REQUIRE_SYS(::mkdir(dir.c_str(), 0755));
    REQUIRE_SYS(::mkdir(tmp.c_str(), 0755));
    write_stream(tmp + "/big.so", seed, kSize);
    REQUIRE_SYS(::rename((tmp + "/big.so").c_str(), (dir + "/big.so").c_str()));
    REQUIRE_SYS(::rmdir(tmp.c_str()));
    {
        INFO(a.daemon_stderr());
        REQUIRE(test::wait_until([&] { return stat_of(a, "remote_uploads") >= 1; }, 240));
    }

    // In Redis: chunks of at most the protocol's chunk size (plus a small header), as
    // many as the size needs; no value anywhere near Redis's 512 MB limit.
    const auto keys = redis.command({"KEYS", "kc2:fsd:*"});
    REQUIRE(keys.type == kcache::remote::Reply::Type::array);
    std::uint64_t chunks = 0, largest = 0;
    for (const auto& key : keys.elements) {
        const auto len = redis.command({"STRLEN", key.str});
        REQUIRE(len.type == kcache::remote::Reply::Type::integer);
        largest = std::max<std::uint64_t>(largest, static_cast<std::uint64_t>(len.integer));
        if (key.str.rfind("kc2:fsd:c:", 0) == 0) ++chunks;
    }
    CHECK(chunks == proto::chunk_count(kSize));
    CHECK(chunks == 521);
    CHECK(largest <= proto::kChunkBytes + 64);

    // B reads it through (the lookup of the entry pulls it; a lookup answered at its
    // deadline while the pull goes on is asked again).
    {
        INFO(b.daemon_stderr());
        REQUIRE(test::wait_until(
            [&] {
                struct stat st {};
                return ::stat(b.p(kKey + "/big.so").c_str(), &st) == 0 &&
                       static_cast<std::uint64_t>(st.st_size) == kSize;
            },
            240));
    }
    require_stream(b.p(kKey + "/big.so"), seed, kSize);
    // The tier records its counts in the db periodically: the pull's hit comes with
    // the next record, not necessarily before the file is readable.
    CHECK(test::wait_until([&] { return stat_of(b, "remote_hits") >= 1; }, 10));
    CHECK(stat_of(b, "remote_corrupt") == 0);
    CHECK(stat_of(b, "remote_bytes_down") >= kSize);
}
