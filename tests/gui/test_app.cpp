// The real kcache-inspector program: a clear error for a missing db (no display
// needed), and under a private Xvfb server a screenshot that is written, decodes and
// is not blank, and a window layout saved under $XDG_CONFIG_HOME (never the real home).
// Tests that need a display skip (exit 77) with a message when Xvfb cannot start.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <stb_image.h>

#include "gui_test_util.hpp"
#include "skip.hpp"

using namespace kcache;
using namespace kcache::test;

namespace {

struct RunResult {
    int exit_code = -1;  // -1: killed (by the timeout or a signal)
    std::string err;
};

// Runs the inspector with `args`, the environment reduced to PATH and HOME plus
// `env`, stdout and stdin on /dev/null, stderr captured. Killed after `timeout`.
RunResult run_inspector(const std::vector<std::string>& args, const std::vector<std::string>& env,
                        const TempDir& dir,
                        std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const std::string err_path = (dir / "stderr.txt").string();
    std::vector<std::string> argv_s = {KCACHE_INSPECTOR_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s = env;
    for (const char* name : {"PATH", "HOME", "LP_NUM_THREADS"}) {
        if (const char* v = std::getenv(name)) env_s.push_back(std::string(name) + "=" + v);
    }
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);

    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        const int null_fd = open("/dev/null", O_RDWR);
        const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(null_fd, 0);
        dup2(null_fd, 1);
        dup2(err_fd, 2);
        execve(argv[0], argv.data(), envp.data());
        _exit(127);
    }
    RunResult result;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            FAIL_CHECK("kcache-inspector did not exit within the timeout");
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
    result.err = read_file(err_path);
    return result;
}

// A private X server (Xvfb -displayfd picks a free display). Skips the test when none
// can be started.
class Xvfb {
  public:
    Xvfb() {
        int fds[2];
        REQUIRE(pipe(fds) == 0);
        m_pid = fork();
        REQUIRE(m_pid >= 0);
        if (m_pid == 0) {
            close(fds[0]);
            const int null_fd = open("/dev/null", O_RDWR);
            dup2(null_fd, 0);
            dup2(null_fd, 1);
            dup2(null_fd, 2);
            const std::string fd = std::to_string(fds[1]);
            execlp("Xvfb", "Xvfb", "-displayfd", fd.c_str(), "-screen", "0", "1920x1080x24",
                   "-nolisten", "tcp", static_cast<char*>(nullptr));
            _exit(127);
        }
        close(fds[1]);
        std::string number;
        pollfd p{fds[0], POLLIN, 0};
        while (poll(&p, 1, 15000) == 1) {
            char buf[16];
            const ssize_t n = read(fds[0], buf, sizeof buf);
            if (n <= 0) break;
            number.append(buf, static_cast<std::size_t>(n));
            if (number.find('\n') != std::string::npos) break;
        }
        close(fds[0]);
        while (!number.empty() && (number.back() == '\n' || number.back() == ' '))
            number.pop_back();
        if (number.empty()) {
            stop();
            skip("no display: Xvfb could not be started (install the xvfb package)");
        }
        m_display = ":" + number;
    }
    ~Xvfb() { stop(); }
    Xvfb(const Xvfb&) = delete;
    Xvfb& operator=(const Xvfb&) = delete;
    const std::string& display() const { return m_display; }

  private:
    void stop() {
        if (m_pid > 0) {
            kill(m_pid, SIGTERM);
            waitpid(m_pid, nullptr, 0);
            m_pid = -1;
        }
    }
    pid_t m_pid = -1;
    std::string m_display;
};

void fill(GuiDb& db) {
    db.add_entry("4fd1a9c0de", {{"kernel.cubin", fake_cubin(1, 2000)},
                                {"kernel.json", R"({"name":"axpy"})"},
                                {"kernel.ptx", ".version 8.0\n.target sm_80\n"}});
    const core::Ino b = db.add_entry("77e0b2aa31", {{"k.ttir", std::string(500, 't')}});
    db.hit(b, 3);
}

}  // namespace

TEST_CASE("app: a missing db is a message naming it and exit 1, no window", "[gui][app]") {
    TempDir dir;
    const std::string missing = (dir / "no-such-db").string();
    const RunResult r = run_inspector({"--db", missing}, {}, dir);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("no db at " + missing) != std::string::npos);
    CHECK(r.err.find("GLFW") == std::string::npos);  // failed before opening a window
}

TEST_CASE("app: --screenshot writes a PNG of the inspector that is not blank", "[gui][app]") {
    GuiDb db;
    fill(db);
    Xvfb x;
    const std::string png = (db.dir() / "shot.png").string();
    const RunResult r = run_inspector(
        {"--db", db.path(), "--screenshot", png, "--frames", "4", "--size", "900x600", "--select",
         "4fd1", "--file", "kernel.ptx"},
        {"DISPLAY=" + x.display(), "XDG_CONFIG_HOME=" + (db.dir() / "config").string()}, db.dir());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    int w = 0, h = 0, channels = 0;
    unsigned char* pixels = stbi_load(png.c_str(), &w, &h, &channels, 4);
    REQUIRE(pixels != nullptr);
    CHECK(w == 900);
    CHECK(h == 600);
    std::set<std::uint32_t> colours;
    for (int i = 0; i < w * h; ++i) {
        const unsigned char* p = pixels + static_cast<std::ptrdiff_t>(i) * 4;
        colours.insert(static_cast<std::uint32_t>(p[0]) << 16 | p[1] << 8 | p[2]);
        if (colours.size() > 64) break;
    }
    stbi_image_free(pixels);
    CHECK(colours.size() > 16);  // text, panels and plots; a blank frame has one or two
    // A screenshot neither reads nor writes the saved layout.
    CHECK_FALSE(std::filesystem::exists(db.dir() / "config" / "kcache" / "inspector.ini"));
}

TEST_CASE("app: the window layout is saved under $XDG_CONFIG_HOME/kcache", "[gui][app]") {
    GuiDb db;
    fill(db);
    Xvfb x;
    const auto config = db.dir() / "config";
    const RunResult r =
        run_inspector({"--db", db.path(), "--frames", "3", "--size", "800x500"},
                      {"DISPLAY=" + x.display(), "XDG_CONFIG_HOME=" + config.string()}, db.dir());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto ini = config / "kcache" / "inspector.ini";
    REQUIRE(std::filesystem::exists(ini));
    const std::string layout = read_file(ini);
    CHECK(layout.find("[Window][Entries]") != std::string::npos);
    CHECK(layout.find("[Table]") != std::string::npos);  // column widths and sort order too
}
