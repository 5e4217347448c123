// A damaged db found before a daemon serves it (serve.cpp; docs/operations.md, "A damaged
// db"): the marker a daemon that died of a fault leaves in the db directory, and the
// start-up check that decides whether the db is set aside.
#pragma once

#include <optional>
#include <string>

namespace kcache::fsd {

// Why the db at `db` must be set aside (core/integrity.hpp), or nullopt when it is sound
// (or not there yet). A marker a daemon left on finding it corrupt while serving
// (Filesystem::db_corrupt) says so; else, when `full` or after a crash (the crash
// marker, then deeply), core::check_structure runs in a forked child, since a page bad
// enough makes LMDB read outside the map (SIGSEGV, SIGBUS) or abort: such a death is
// damage too. Errors that are no damage (EACCES, a newer schema ...) are left to the
// daemon's own open, which reports them.
std::optional<std::string> db_damage(const std::string& db, bool full, bool read_only);

// From here a fault (SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE) leaves the crash marker in
// `db`: one before serving_started() makes the successor set the db aside, one later
// makes it check the db deeply. Makes the daemon not dumpable.
void install_crash_marker(const std::string& db);

// The db is open and read: a fault from here on is no start-up's.
void serving_started();

}  // namespace kcache::fsd
