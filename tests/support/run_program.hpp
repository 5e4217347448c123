// Runs a program as a child of the test, its output captured: the one way tests run
// the `kcache` binary (tests/cli, tests/remote).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kcache::test {

struct ProgramResult {
    int exit_code = -1;      // -1: killed by a signal (also when it ran past its limit)
    bool timed_out = false;  // killed after `limit_s`
    std::string out;         // stdout, byte-exact
    std::string err;         // stderr
};

// Runs `argv` (argv[0] a path) with stdin from /dev/null and stdout/stderr captured.
// The variables named in `unset` are removed from its environment, then `env` is set.
// Killed after `limit_s`: a guard against hangs, not a timing check.
ProgramResult run_program(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {},
                          const std::vector<std::string>& unset = {}, int limit_s = 600);

}  // namespace kcache::test
