// The daemon's log lines: time, level and pid on every line, whole lines from threads.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "log.hpp"
#include "scoped_env.hpp"
#include "temp_dir.hpp"

namespace {

namespace log = kcache::fsd::log;
using kcache::test::ScopedEnv;
using std::chrono::system_clock;

const system_clock::time_point kNoonUtc =
    system_clock::from_time_t(1740830400) + std::chrono::milliseconds(7);  // 2025-03-01 12:00

}  // namespace

TEST_CASE("log: a line has the local time with its offset, the pid and the level", "[log]") {
    const std::string pid = std::to_string(getpid());
    // localtime_r reads TZ only at tzset().
    {
        ScopedEnv tz("TZ", "UTC0");
        tzset();
        CHECK(log::format_line(log::Level::warning, "eviction failed: EIO", kNoonUtc) ==
              "2025-03-01 12:00:00.007 +0000 kcache-fsd[" + pid +
                  "] warning: eviction failed: EIO\n");
    }
    {
        ScopedEnv tz("TZ", "CET-1");  // POSIX TZ: one hour east of UTC, no DST rule
        tzset();
        CHECK(log::format_line(log::Level::error, "x", kNoonUtc) ==
              "2025-03-01 13:00:00.007 +0100 kcache-fsd[" + pid + "] error: x\n");
    }
    {
        ScopedEnv tz("TZ", "UTC0");
        tzset();
        CHECK(log::format_line(log::Level::info, "", kNoonUtc + std::chrono::milliseconds(993)) ==
              "2025-03-01 12:00:01.000 +0000 kcache-fsd[" + pid + "] info: \n");
    }
    tzset();  // back to the process's zone
}

TEST_CASE("log: lines written from many threads stay whole", "[log]") {
    kcache::test::TempDir dir;
    const auto path = dir / "fsd.log";
    const int file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    REQUIRE(file >= 0);
    const int saved = ::dup(STDERR_FILENO);
    REQUIRE(saved >= 0);
    ::dup2(file, STDERR_FILENO);
    constexpr int kThreads = 8;
    constexpr int kLines = 200;
    {
        std::vector<std::jthread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([t] {
                for (int i = 0; i < kLines; ++i) {
                    log::warning("thread {} line {} {}", t, i, std::string(200, 'x'));
                }
            });
        }
    }
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
    ::close(file);

    const std::regex line_format(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [+-]\d{4} )"
                                 R"(kcache-fsd\[\d+\] warning: thread \d line \d+ x{200})");
    std::istringstream lines(kcache::test::read_file(path));
    int count = 0;
    for (std::string line; std::getline(lines, line); ++count) {
        INFO(line);
        REQUIRE(std::regex_match(line, line_format));
    }
    CHECK(count == kThreads * kLines);
}
