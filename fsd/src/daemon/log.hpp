// The daemon's log: one line per message with its time and level, e.g.
//   2025-03-01 12:00:00.123 +0100 kcache-fsd[4242] warning: eviction failed: ...
// written to stderr, which is DB/fsd.log once the daemon has detached (startup.cpp).
// Start-up errors are not log lines: they are the command's own error message,
// printed by the waiting parent on the terminal (startup.cpp, StartupPipe).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace kcache::fsd::log {

enum class Level { error, warning, info };

// The line `write` emits (newline included) for a message at `time`.
std::string format_line(Level level, std::string_view message,
                        std::chrono::system_clock::time_point time);

// Writes one line to stderr with one write(2) (more only if it is cut short), so
// that lines of concurrent handler threads do not interleave. Safe from any thread.
void write(Level level, std::string_view message);

template <class... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
    write(Level::error, fmt::format(format, std::forward<Args>(args)...));
}
template <class... Args>
void warning(fmt::format_string<Args...> format, Args&&... args) {
    write(Level::warning, fmt::format(format, std::forward<Args>(args)...));
}
template <class... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
    write(Level::info, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kcache::fsd::log
