#include "run_program.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

#include "temp_dir.hpp"

namespace kcache::test {

ProgramResult run_program(const std::vector<std::string>& args,
                          const std::map<std::string, std::string>& env,
                          const std::vector<std::string>& unset, int limit_s) {
    TempDir capture;
    const std::string out_path = (capture / "out").string();
    const std::string err_path = (capture / "err").string();
    std::vector<std::string> strings = args;
    std::vector<char*> argv;
    for (auto& a : strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        // The child of a test: set up stdio and the environment, then exec; any
        // failure ends it with 127.
        const int in = open("/dev/null", O_RDONLY);
        const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (in < 0 || out < 0 || err < 0) _exit(127);
        if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
            dup2(err, STDERR_FILENO) < 0) {
            _exit(127);
        }
        for (const auto& name : unset) unsetenv(name.c_str());
        for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
        execv(argv[0], argv.data());
        _exit(127);
    }
    ProgramResult result;
    int status = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
    for (;;) {
        const pid_t done = waitpid(pid, &status, WNOHANG);
        REQUIRE(done >= 0);
        if (done == pid) break;
        if (std::chrono::steady_clock::now() > until) {
            result.timed_out = true;
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    result.exit_code = !result.timed_out && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = read_file(out_path);
    result.err = read_file(err_path);
    return result;
}

}  // namespace kcache::test
