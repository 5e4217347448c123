#include "log.hpp"

#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace kcache::fsd::log {
namespace {

std::string_view name(Level level) {
    switch (level) {
        case Level::error:
            return "error";
        case Level::warning:
            return "warning";
        case Level::info:
            return "info";
    }
    return "?";
}

}  // namespace

std::string format_line(Level level, std::string_view message,
                        std::chrono::system_clock::time_point time) {
    using namespace std::chrono;
    const std::time_t seconds = system_clock::to_time_t(time);
    const auto millis = duration_cast<milliseconds>(time.time_since_epoch()).count() % 1000;
    std::tm local{};
    localtime_r(&seconds, &local);
    // Local time, as the operator reads it, with its offset so that lines stay
    // unambiguous across a change of time zone or daylight saving.
    char date[32];
    char zone[8];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", &local);
    std::strftime(zone, sizeof zone, "%z", &local);
    return fmt::format("{}.{:03} {} kcache-fsd[{}] {}: {}\n", date, millis, zone, getpid(),
                       name(level), message);
}

void write(Level level, std::string_view message) {
    const std::string line = format_line(level, message, std::chrono::system_clock::now());
    // A failed write (a full disk under fsd.log) loses the line: the daemon has
    // nowhere better to report it.
    for (std::size_t done = 0; done < line.size();) {
        const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        done += static_cast<std::size_t>(n);
    }
}

}  // namespace kcache::fsd::log
