// kcache env and kcache run: every compiler kcache knows pointed at a subdirectory of a
// mount; run mounts the db first when nothing is mounted there. The tests that mount
// need /dev/fuse and fusermount3 (skipped, exit 77, without); each unmounts what it
// mounted however it ends.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "cli_harness.hpp"
#include "skip.hpp"

using kcache::test::CliResult;
using kcache::test::run_kcache;
using kcache::test::TempDir;
namespace fs = std::filesystem;

namespace {

// What kcache env sets: the cache directories by subdirectory, and JAX's settings.
const std::vector<std::pair<std::string, std::string>> kDirs = {
    {"TRITON_CACHE_DIR", "triton"},       {"TORCHINDUCTOR_CACHE_DIR", "inductor"},
    {"JAX_COMPILATION_CACHE_DIR", "jax"}, {"CCACHE_DIR", "ccache"},
    {"WAVE_CACHE_DIR", "wave"},           {"CUTE_DSL_CACHE_DIR", "cutedsl"},
    {"HELION_CACHE_DIR", "helion"},
};
const std::map<std::string, std::string> kValues = {
    {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"},
    {"JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1"},
};
const std::string kTritonKey = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST";  // 52

// `env -0`'s output: NAME=VALUE items, each ended by a NUL.
std::map<std::string, std::string> parse_env0(const std::string& text) {
    std::map<std::string, std::string> env;
    std::istringstream in(text);
    for (std::string item; std::getline(in, item, '\0');) {
        const auto eq = item.find('=');
        if (eq != std::string::npos) env[item.substr(0, eq)] = item.substr(eq + 1);
    }
    return env;
}

// The environment a POSIX shell has after running `script`: what `eval "$(kcache env)"`
// sets, quoting and all.
std::map<std::string, std::string> sh_environment(const std::string& script) {
    const CliResult r = kcache::test::run_program({"/bin/sh", "-c", script + "\nexec env -0"});
    INFO(script << r.err);
    REQUIRE(r.exit_code == 0);
    return parse_env0(r.out);
}

// `set -gx NAME 'VALUE'` lines, as fish reads them (\\ and \' escaped in single quotes).
std::map<std::string, std::string> fish_assignments(const std::string& text) {
    std::map<std::string, std::string> env;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        REQUIRE(line.rfind("set -gx ", 0) == 0);
        const auto space = line.find(' ', 8);
        REQUIRE(space != std::string::npos);
        REQUIRE(line.size() >= space + 3);
        REQUIRE(line[space + 1] == '\'');
        REQUIRE(line.back() == '\'');
        std::string value;
        for (std::size_t i = space + 2; i + 1 < line.size(); ++i) {
            if (line[i] == '\\') ++i;
            value.push_back(line[i]);
        }
        env[line.substr(8, space - 8)] = value;
    }
    return env;
}

void check_settings(const std::map<std::string, std::string>& env, const std::string& mnt) {
    for (const auto& [name, subdir] : kDirs) {
        INFO(name);
        REQUIRE(env.count(name) == 1);
        CHECK(env.at(name) == mnt + "/" + subdir);
    }
    for (const auto& [name, value] : kValues) {
        INFO(name);
        REQUIRE(env.count(name) == 1);
        CHECK(env.at(name) == value);
    }
}

std::size_t lines(const std::string& text) {
    std::size_t n = 0;
    for (char c : text) n += c == '\n';
    return n;
}

void require_fuse() {
    const int fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        kcache::test::skip(std::string("FUSE is not available: /dev/fuse: ") +
                           std::strerror(errno));
    }
    ::close(fd);
    if (std::system("command -v fusermount3 >/dev/null 2>&1") != 0)
        kcache::test::skip("FUSE is not available: fusermount3 is not on PATH");
}

// The file system type and source mounted at `mnt` (the last mount there), as
// /proc/self/mountinfo has them; empty when nothing is.
std::pair<std::string, std::string> mounted_at(const std::string& mnt) {
    std::ifstream in("/proc/self/mountinfo");
    std::pair<std::string, std::string> found;
    for (std::string line; std::getline(in, line);) {
        std::istringstream words(line);
        std::vector<std::string> f;
        for (std::string w; words >> w;) f.push_back(w);
        if (f.size() < 10 || f[4] != mnt) continue;
        std::size_t dash = 6;
        while (dash < f.size() && f[dash] != "-") ++dash;
        if (dash + 2 < f.size()) found = {f[dash + 1], f[dash + 2]};
    }
    return found;
}

// A private directory holding `db` and the mountpoint `mnt` (absolute, as mountinfo spells
// it), which it unmounts when the test ends, whatever a test left mounted there.
class MountDir {
  public:
    MountDir() : m_root(fs::canonical(m_dir.path())) {}
    ~MountDir() {
        for (int i = 0; i < 3 && !mounted_at(mnt()).first.empty(); ++i) {
            const std::string cmd = "fusermount3 -u '" + mnt() +
                                    "' 2>/dev/null || fusermount3 -uz '" + mnt() + "' 2>/dev/null";
            if (std::system(cmd.c_str()) != 0)
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    }
    MountDir(const MountDir&) = delete;
    MountDir& operator=(const MountDir&) = delete;
    std::string db() const { return (m_root / "db").string(); }
    std::string mnt() const { return (m_root / "mnt").string(); }
    std::string path(const std::string& name) const { return (m_root / name).string(); }

    // `kcache --db DB run --mount MNT -- ARGS...`
    CliResult run(const std::vector<std::string>& args) const {
        std::vector<std::string> all{"--db", db(), "run", "--mount", mnt(), "--"};
        all.insert(all.end(), args.begin(), args.end());
        return run_kcache(all);
    }

  private:
    TempDir m_dir;
    fs::path m_root;
};

// The pid on the first line of the daemon's lock file ("pid N at MOUNTPOINT").
pid_t daemon_pid(const std::string& db) {
    std::ifstream in(db + "/daemon.lock");
    std::string word;
    long pid = 0;
    in >> word >> pid;
    return static_cast<pid_t>(pid);
}

pid_t parent_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    if (close == std::string::npos) return 0;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    return static_cast<pid_t>(ppid);
}

bool dead_mount(const std::string& mnt) {
    struct statfs st {};
    return ::statfs(mnt.c_str(), &st) != 0 && errno == ENOTCONN;
}

}  // namespace

TEST_CASE("env prints every compiler's variable under the mount, quoted for sh and fish", "[cli]") {
    TempDir dir;
    const std::string root = fs::canonical(dir.path()).string();
    const std::string mnt = root + "/it's a \"mount\" $HOME";

    const CliResult sh = run_kcache({"env", "--no-check", "--mount", mnt});
    INFO(sh.err);
    REQUIRE(sh.exit_code == 0);
    CHECK(lines(sh.out) == kDirs.size() + kValues.size());
    check_settings(sh_environment(sh.out), mnt);
    CHECK_FALSE(fs::exists(mnt));  // --no-check makes nothing

    const CliResult fish = run_kcache({"env", "--no-check", "--shell", "fish", "--mount", mnt});
    REQUIRE(fish.exit_code == 0);
    check_settings(fish_assignments(fish.out), mnt);

    // A plain path is printed as it is, a relative one made absolute.
    const CliResult plain = run_kcache({"env", "--no-check", "--mount", root + "/m/"});
    REQUIRE(plain.exit_code == 0);
    CHECK(plain.out.find("export TRITON_CACHE_DIR=" + root + "/m/triton\n") != std::string::npos);

    // The default: $KCACHE_MOUNT, else the mountpoint scripts/run.sh uses.
    const CliResult home =
        run_kcache({"env", "--no-check"}, {{"HOME", root}, {"KCACHE_MOUNT", ""}});
    REQUIRE(home.exit_code == 0);
    check_settings(sh_environment(home.out), root + "/.cache/kcache/mnt");
    const CliResult var =
        run_kcache({"env", "--no-check"}, {{"HOME", root}, {"KCACHE_MOUNT", root + "/k"}});
    REQUIRE(var.exit_code == 0);
    check_settings(sh_environment(var.out), root + "/k");

    CHECK(run_kcache({"env", "--shell", "csh", "--no-check"}).exit_code == 2);
}

TEST_CASE("env refuses a directory that is not a kcache mount", "[cli]") {
    TempDir dir;
    const std::string root = fs::canonical(dir.path()).string();
    fs::create_directory(root + "/plain");
    for (const std::string& mnt : {root + "/plain", root + "/missing"}) {
        INFO(mnt);
        const CliResult r = run_kcache({"env", "--mount", mnt});
        CHECK(r.exit_code == 1);
        CHECK(r.out.empty());
        CHECK(r.err.find("kcache: " + mnt + " is not a kcache mount: nothing is mounted there") ==
              0);
        CHECK(r.err.find("--no-check") != std::string::npos);
    }
    CHECK(fs::is_empty(root + "/plain"));  // no subdirectories made
    CHECK_FALSE(fs::exists(root + "/missing"));

    // A mount of another file system.
    const CliResult proc = run_kcache({"env", "--mount", "/proc"});
    CHECK(proc.exit_code == 1);
    CHECK(proc.out.empty());
    CHECK(proc.err.find("/proc is not a kcache mount: proc (proc) is mounted there") !=
          std::string::npos);
}

TEST_CASE("run mounts the db when nothing is mounted and the command uses the mount",
          "[cli][fuse]") {
    require_fuse();
    MountDir dir;
    const std::string entry = "$TRITON_CACHE_DIR/" + kTritonKey;
    const CliResult first =
        dir.run({"sh", "-c",
                 "set -e; mkdir " + entry + "; printf kernel > " + entry + "/k.json; cat " + entry +
                     "/k.json; stat -f -c ' %t' \"$CCACHE_DIR\""});
    INFO(first.err);
    REQUIRE(first.exit_code == 0);
    CHECK(first.out == "kernel 65735546\n");  // stdout is the command's; FUSE's magic
    CHECK(first.err == "kcache: mounted db " + dir.db() + " at " + dir.mnt() +
                           "; it stays mounted (`fusermount3 -u " + dir.mnt() + "` unmounts it)\n");
    // It stays mounted, and what the command wrote is in the db.
    CHECK(mounted_at(dir.mnt()) ==
          std::make_pair(std::string("fuse.kcache"), "kcache:" + dir.db()));
    for (const auto& [name, subdir] : kDirs) CHECK(fs::is_directory(dir.mnt() + "/" + subdir));
    const auto ls = run_kcache({"--db", dir.db(), "ls", "--json"});
    REQUIRE(ls.exit_code == 0);
    CHECK(ls.out.find("\"triton/" + kTritonKey + "\"") != std::string::npos);

    // The next run uses the mount, and says nothing.
    const CliResult second = dir.run({"sh", "-c", "cat " + entry + "/k.json"});
    CHECK(second.exit_code == 0);
    CHECK(second.out == "kernel");
    CHECK(second.err.empty());

    // env accepts it, and the db named when it is the one served.
    const CliResult env = run_kcache({"--db", dir.db(), "env", "--mount", dir.mnt()});
    CHECK(env.exit_code == 0);
    check_settings(sh_environment(env.out), dir.mnt());
    const CliResult other = run_kcache({"--db", dir.path("other"), "env", "--mount", dir.mnt()});
    CHECK(other.exit_code == 1);
    CHECK(other.err == "kcache: the kcache mount at " + dir.mnt() + " serves db " + dir.db() +
                           ", not " + dir.path("other") + "\n");
    CHECK(dir.run({"true"}).exit_code == 0);
    CHECK(run_kcache({"--db", dir.path("other"), "run", "--mount", dir.mnt(), "--", "true"})
              .exit_code == 1);
}

TEST_CASE("run passes the command's environment, arguments and exit status through",
          "[cli][fuse]") {
    require_fuse();
    MountDir dir;
    const CliResult triton = dir.run({"sh", "-c", "echo $TRITON_CACHE_DIR"});
    REQUIRE(triton.exit_code == 0);
    CHECK(triton.out == dir.mnt() + "/triton\n");
    check_settings(parse_env0(dir.run({"env", "-0"}).out), dir.mnt());

    // Options after `--` are the command's.
    const CliResult args = dir.run({"sh", "-c", "printf '%s|' \"$@\"", "sh", "--db", "x", "-c"});
    CHECK(args.exit_code == 0);
    CHECK(args.out == "--db|x|-c|");

    CHECK(dir.run({"sh", "-c", "exit 7"}).exit_code == 7);
    CHECK(dir.run({"false"}).exit_code == 1);
    CHECK(dir.run({"sh", "-c", "kill -KILL $$"}).exit_code == -1);  // the command itself

    const CliResult missing = dir.run({"kcache-no-such-command"});
    CHECK(missing.exit_code == 127);
    CHECK(missing.err == "kcache: kcache-no-such-command: command not found\n");
    const CliResult gone = dir.run({dir.path("nope")});
    CHECK(gone.exit_code == 127);
    CHECK(gone.err == "kcache: " + dir.path("nope") + ": No such file or directory\n");
    kcache::test::write_file(dir.path("script"), "#!/bin/sh\n");  // not executable
    const CliResult denied = dir.run({dir.path("script")});
    CHECK(denied.exit_code == 126);
    CHECK(denied.err == "kcache: " + dir.path("script") + ": Permission denied\n");

    CHECK(run_kcache({"run", "--mount", dir.mnt()}).exit_code == 2);  // no command
}

TEST_CASE("run says why when kcache-fsd cannot mount, and runs nothing", "[cli]") {
    MountDir dir;
    fs::create_directory(dir.mnt());
    kcache::test::write_file(dir.mnt() + "/left-over", "x");
    const CliResult r = dir.run({"touch", dir.path("ran")});
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK(r.err.find("kcache-fsd: mountpoint " + dir.mnt() + " is not empty\n") !=
          std::string::npos);
    CHECK(r.err.find("kcache: cannot mount db " + dir.db() + " at " + dir.mnt() + ": ") !=
          std::string::npos);
    CHECK(r.err.find("exited with status 1\n") != std::string::npos);
    CHECK_FALSE(fs::exists(dir.path("ran")));

    kcache::test::write_file(dir.path("file"), "x");
    const CliResult file =
        run_kcache({"run", "--mount", dir.path("file") + "/mnt", "--", "touch", dir.path("ran")});
    CHECK(file.exit_code == 1);
    CHECK(file.err.find("cannot make mountpoint") != std::string::npos);
    CHECK_FALSE(fs::exists(dir.path("ran")));
}

TEST_CASE("concurrent runs mount once", "[cli][fuse]") {
    require_fuse();
    MountDir dir;
    const std::string kcache = KCACHE_CLI_PATH;
    std::string script;
    for (int i = 0; i < 4; ++i) {
        script += kcache + " --db " + dir.db() + " run --mount " + dir.mnt() + " -- sh -c 'echo " +
                  std::to_string(i) + " > $TRITON_CACHE_DIR/" + std::to_string(i) + ".txt' 2>" +
                  dir.path("err" + std::to_string(i)) + " & pids=\"$pids $!\"\n";
    }
    script += "for pid in $pids; do wait $pid || exit 1; done\n";
    const CliResult r = kcache::test::run_program({"/bin/bash", "-c", script});
    INFO(r.err);
    CHECK(r.exit_code == 0);
    int mounted = 0;
    for (int i = 0; i < 4; ++i) {
        const std::string err = kcache::test::read_file(dir.path("err" + std::to_string(i)));
        INFO(err);
        mounted += err.find("kcache: mounted db") != std::string::npos;
        CHECK(kcache::test::read_file(dir.mnt() + "/triton/" + std::to_string(i) + ".txt") ==
              std::to_string(i) + "\n");
    }
    CHECK(mounted == 1);
}

TEST_CASE("a dead mount is refused by env and mounted again by run", "[cli][fuse]") {
    require_fuse();
    MountDir dir;
    REQUIRE(dir.run({"sh", "-c", "echo kept > $TRITON_CACHE_DIR/kept.txt"}).exit_code == 0);
    struct stat st {};
    REQUIRE(::stat(dir.mnt().c_str(), &st) == 0);  // the root's attributes now cached
    // The keeper and its daemon killed: the mount stays, dead (ENOTCONN).
    const pid_t daemon = daemon_pid(dir.db());
    REQUIRE(daemon > 0);
    const pid_t keeper = parent_of(daemon);
    REQUIRE(keeper > 1);
    ::kill(keeper, SIGKILL);
    ::kill(daemon, SIGKILL);
    for (int i = 0; i < 200 && !dead_mount(dir.mnt()); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    REQUIRE(dead_mount(dir.mnt()));

    const CliResult env = run_kcache({"env", "--mount", dir.mnt()});
    CHECK(env.exit_code == 1);
    CHECK(env.err.find("the kcache mount at " + dir.mnt() + " is dead") != std::string::npos);

    // Without --db: the db the dead mount served.
    const CliResult again = run_kcache(
        {"run", "--mount", dir.mnt(), "--", "sh", "-c", "cat $TRITON_CACHE_DIR/kept.txt"},
        {{"HOME", dir.path("home")}});
    INFO(again.err);
    CHECK(again.exit_code == 0);
    CHECK(again.out == "kept\n");
    CHECK(again.err.find("unmounted the dead kcache mount at " + dir.mnt()) != std::string::npos);
    CHECK(again.err.find("mounted db " + dir.db() + " at " + dir.mnt()) != std::string::npos);
}
