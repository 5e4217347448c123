// Pointing every compiler at a mount: env, run.
//
// kSettings is the one table of what kcache sets for the compilers it knows: `kcache env`
// prints it as shell code and `kcache run` puts it in a command's environment, so the
// two never disagree. The subdirectories are those docs/quickstart.md recommends.
//
// A mount is recognised by /proc/self/mountinfo alone: kcache-fsd mounts with
// `fsname=kcache:<db>,subtype=kcache` (fsd/src/daemon/main.cpp), i.e. file system type
// `fuse.kcache` and source `kcache:<db>`. Reading mountinfo asks no daemon; a dead mount
// (its daemon gone) is told from a live one by statfs(2), which always asks it.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "commands.hpp"

namespace kcache::cli {
namespace {

namespace fs = std::filesystem;

// One variable a compiler reads. A cache directory is `<mount>/<subdir>`; a setting
// that is no directory has a fixed `value` instead (subdir empty).
struct Setting {
    std::string_view variable;
    std::string_view subdir;
    std::string_view value;
};

// Every compiler kcache knows (docs/quickstart.md, its table), each in its own
// subdirectory of one mount.
constexpr Setting kSettings[] = {
    {"TRITON_CACHE_DIR", "triton", {}},
    {"TORCHINDUCTOR_CACHE_DIR", "inductor", {}},
    {"JAX_COMPILATION_CACHE_DIR", "jax", {}},
    // JAX persists only compiles that took over a second by default: 0 caches them all.
    {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", {}, "0"},
    // Nor does it persist entries below a size a platform may choose when this is 0
    // (its default); -1 lifts the bound and keeps it lifted (jax/_src/config.py).
    {"JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", {}, "-1"},
    {"CCACHE_DIR", "ccache", {}},
    {"WAVE_CACHE_DIR", "wave", {}},
    {"CUTE_DSL_CACHE_DIR", "cutedsl", {}},
    {"HELION_CACHE_DIR", "helion", {}},
};

std::string value_of(const Setting& s, const std::string& mount) {
    return s.subdir.empty() ? std::string(s.value) : mount + "/" + std::string(s.subdir);
}

// Where scripts/run.sh mounts the default db: $KCACHE_MOUNT, else ~/.cache/kcache/mnt.
std::string default_mount_path() {
    if (const char* mnt = std::getenv("KCACHE_MOUNT"); mnt && *mnt) return mnt;
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.cache/kcache/mnt";
}

// `path` absolute, normal and without a trailing slash, as /proc/self/mountinfo spells a
// mount point: the parent's symbolic links resolved by realpath(3), the last component
// only when it is a link itself (so a dead mount there, on which realpath fails with
// ENOTCONN, keeps its name).
std::string mount_path(const std::string& path) {
    std::error_code ec;
    fs::path p = fs::absolute(path, ec).lexically_normal();
    if (ec) throw Failure(fmt::format("{}: {}", path, ec.message()));
    if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();  // "a/" -> "a"
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
        if (char* real = ::realpath(p.c_str(), nullptr)) {
            std::string resolved(real);
            std::free(real);
            return resolved;
        }
        return p.string();
    }
    if (p.has_parent_path() && p != p.root_path()) {
        if (char* real = ::realpath(p.parent_path().c_str(), nullptr)) {
            fs::path resolved = fs::path(real) / p.filename();
            std::free(real);
            return resolved.string();
        }
    }
    return p.string();
}

// /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mountinfo(std::string_view field) {
    std::string out;
    for (std::size_t i = 0; i < field.size(); ++i) {
        if (field[i] == '\\' && i + 3 < field.size()) {
            const std::string_view digits = field.substr(i + 1, 3);
            if (digits.find_first_not_of("01234567") == std::string_view::npos) {
                out.push_back(static_cast<char>(((digits[0] - '0') << 6) |
                                                ((digits[1] - '0') << 3) | (digits[2] - '0')));
                i += 3;
                continue;
            }
        }
        out.push_back(field[i]);
    }
    return out;
}

struct Mount {
    std::string fstype;
    std::string source;
    bool is_kcache() const { return fstype == "fuse.kcache" || source.starts_with("kcache:"); }
    // The db a kcache-fsd serves here, as it named it (absolute: fsd/src/daemon/options.cpp).
    std::string db() const { return source.starts_with("kcache:") ? source.substr(7) : ""; }
};

// What is mounted at `mountpoint` (as mount_path gives it), the topmost of mounts
// stacked there; nullopt when nothing is.
std::optional<Mount> mount_at(const std::string& mountpoint) {
    std::ifstream in("/proc/self/mountinfo");
    if (!in) throw Failure("cannot read /proc/self/mountinfo");
    std::optional<Mount> found;
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    for (std::string line; std::getline(in, line);) {
        std::istringstream words(line);
        std::vector<std::string> fields;
        for (std::string w; words >> w;) fields.push_back(std::move(w));
        if (fields.size() < 5 || unescape_mountinfo(fields[4]) != mountpoint) continue;
        std::size_t dash = 6;
        while (dash < fields.size() && fields[dash] != "-") ++dash;
        if (dash + 2 >= fields.size()) continue;
        found = Mount{unescape_mountinfo(fields[dash + 1]), unescape_mountinfo(fields[dash + 2])};
    }
    return found;
}

// A FUSE mount whose daemon (and keeper) died answers ENOTCONN, or ECONNABORTED once its
// connection was aborted. Asked with statfs(2): the kernel always forwards it, where a
// stat(2) may be answered from the attributes it caches, a dead mount's too.
bool is_dead(const std::string& mountpoint) {
    struct statfs st {};
    return ::statfs(mountpoint.c_str(), &st) != 0 && (errno == ENOTCONN || errno == ECONNABORTED);
}

// The db the command line names: --db or $KCACHE_DB (empty when neither does: then any
// kcache mount will do).
std::string named_db(const Cli& cli) {
    if (!cli.db_option.empty()) return cli.db_option;
    const char* db = std::getenv("KCACHE_DB");
    return db && *db ? std::string(db) : std::string();
}

bool same_path(const std::string& a, const std::string& b) {
    std::error_code ec;
    if (fs::absolute(a, ec).lexically_normal() == fs::absolute(b, ec).lexically_normal())
        return true;
    const bool same = fs::equivalent(a, b, ec);
    return !ec && same;
}

// Throws unless a live kcache-fsd serves `mountpoint`, and the db named on the command
// line if one is. `hint` says what to do when nothing is mounted.
void require_kcache_mount(const Cli& cli, const std::string& mountpoint,
                          const std::optional<Mount>& mount, std::string_view hint) {
    if (!mount) {
        throw Failure(fmt::format("{} is not a kcache mount: nothing is mounted there ({})",
                                  mountpoint, hint));
    }
    if (!mount->is_kcache()) {
        throw Failure(fmt::format("{} is not a kcache mount: {} ({}) is mounted there", mountpoint,
                                  mount->source, mount->fstype));
    }
    if (is_dead(mountpoint)) {
        throw Failure(fmt::format(
            "the kcache mount at {} is dead (its daemon is gone): `kcache run --mount {} -- true` "
            "mounts its db there again",
            mountpoint, mountpoint));
    }
    const std::string db = named_db(cli);
    if (!db.empty() && !same_path(db, mount->db())) {
        throw Failure(fmt::format("the kcache mount at {} serves db {}, not {}", mountpoint,
                                  mount->db(), db));
    }
}

// Makes every compiler's subdirectory (some compilers want theirs to exist). They are
// containers in the db (core/layout.cpp), never entries. A read-only mount cannot have
// them made: the compilers say so when they write, if they do.
void make_subdirs(const std::string& mountpoint) {
    for (const Setting& s : kSettings) {
        if (s.subdir.empty()) continue;
        const std::string dir = mountpoint + "/" + std::string(s.subdir);
        if (::mkdir(dir.c_str(), 0777) == 0 || errno == EEXIST || errno == EROFS) continue;
        fmt::print(stderr, "kcache: warning: cannot make {}: {}\n", dir, std::strerror(errno));
    }
}

// Quoted for a POSIX shell: as is when no character is special, else in single quotes.
std::string sh_quote(std::string_view text) {
    const bool plain = !text.empty() && text.find_first_not_of(
                                            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                            "0123456789_@%+=:,./-") == std::string_view::npos;
    if (plain) return std::string(text);
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

// Quoted for fish: single quotes, in which fish takes \\ and \' as escapes.
std::string fish_quote(std::string_view text) {
    std::string out = "'";
    for (char c : text) {
        if (c == '\\' || c == '\'') out.push_back('\\');
        out.push_back(c);
    }
    return out + "'";
}

struct EnvOptions {
    std::string mount;  // empty: default_mount_path()
    std::string shell = "sh";
    bool no_check = false;
};

int run_env(const Cli& cli, const EnvOptions& opts) {
    const std::string mnt = mount_path(opts.mount.empty() ? default_mount_path() : opts.mount);
    if (!opts.no_check) {
        require_kcache_mount(cli, mnt, mount_at(mnt),
                             "mount one with `kcache-fsd " + mnt +
                                 "` or `kcache run`; --no-check prints the variables anyway");
        make_subdirs(mnt);
    }
    for (const Setting& s : kSettings) {
        const std::string value = value_of(s, mnt);
        if (opts.shell == "fish") {
            fmt::print("set -gx {} {}\n", s.variable, fish_quote(value));
        } else {
            fmt::print("export {}={}\n", s.variable, sh_quote(value));
        }
    }
    return kExitOk;
}

struct RunOptions {
    std::string mount;  // empty: default_mount_path()
    std::vector<std::string> command;
};

// Whether `path` is a file this process may execute.
bool executable(const fs::path& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
}

// The kcache-fsd to start: the one installed beside this kcache, the one built beside it
// (build/cli/kcache, build/fsd/kcache-fsd), else the first on $PATH.
std::string find_fsd() {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        for (const fs::path& p : {self.parent_path() / "kcache-fsd",
                                  self.parent_path().parent_path() / "fsd" / "kcache-fsd"}) {
            if (executable(p)) return p.string();
        }
    }
    if (const char* path = std::getenv("PATH")) {
        std::string_view rest(path);
        while (true) {
            const std::size_t colon = rest.find(':');
            const std::string_view dir = rest.substr(0, colon);
            const fs::path p = fs::path(dir.empty() ? "." : std::string(dir)) / "kcache-fsd";
            if (executable(p)) return p.string();
            if (colon == std::string_view::npos) break;
            rest.remove_prefix(colon + 1);
        }
    }
    throw Failure(fmt::format("cannot find kcache-fsd: not beside {} nor on $PATH",
                              ec ? std::string("kcache") : self.string()));
}

// Runs `kcache-fsd --db DB MOUNTPOINT`, which daemonizes and exits 0 once the mount
// serves (or 1, its message on stderr, when it cannot). Its stdout goes to stderr: the
// command's stdout is the command's alone. Returns its exit status (-1: killed).
int start_fsd(const std::string& fsd, const std::string& db, const std::string& mountpoint) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Failure(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
        ::dup2(STDERR_FILENO, STDOUT_FILENO);
        ::execl(fsd.c_str(), fsd.c_str(), "--db", db.c_str(), mountpoint.c_str(),
                static_cast<char*>(nullptr));
        fmt::print(stderr, "kcache: {}: {}\n", fsd, std::strerror(errno));
        ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) throw Failure(fmt::format("waitpid: {}", std::strerror(errno)));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Unmounts a dead mount lazily (processes that still hold files there keep it), as
// kcache-fsd does when it starts on one: by umount2 as root, else by fusermount3 -uz.
// Done here too because kcache-fsd tells a dead mount by stat(2), which the kernel may
// answer from the root's cached attributes (a directory's are cached for a day), and then
// fails with ENOTCONN.
void unmount_dead(const std::string& mountpoint) {
    if (::umount2(mountpoint.c_str(), MNT_DETACH) == 0) return;
    const pid_t pid = ::fork();
    if (pid < 0) throw Failure(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
        ::dup2(STDERR_FILENO, STDOUT_FILENO);
        ::execlp("fusermount3", "fusermount3", "-uz", mountpoint.c_str(),
                 static_cast<char*>(nullptr));
        fmt::print(stderr, "kcache: fusermount3: {}\n", std::strerror(errno));
        ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        throw Failure(
            fmt::format("{} is a dead kcache mount and cannot be unmounted: run "
                        "`fusermount3 -uz {}`",
                        mountpoint, mountpoint));
    }
}

// Mounts a db at `mountpoint` unless a live kcache mount is there already; returns the
// db when this call mounted it, nullopt when it found one mounted. The db is the one
// named (--db, $KCACHE_DB), else the one a dead kcache mount there served, else the
// default. Concurrent `kcache run`s mount once: each takes an exclusive flock on the
// mountpoint's directory (the underlying one, opened before anything is mounted on it;
// close-on-exec, so that the daemon does not keep it locked) and looks again under it.
// A start that fails because another process mounted first is no error.
std::optional<std::string> ensure_mounted(const Cli& cli, const std::string& mountpoint) {
    // A live kcache mount to use, or nullopt: none, or a dead one. Throws for another
    // file system, or a live kcache mount of another db than the one named.
    std::string dead_db;
    auto usable = [&] {
        const std::optional<Mount> mount = mount_at(mountpoint);
        if (!mount) return false;
        if (mount->is_kcache() && is_dead(mountpoint)) {
            dead_db = mount->db();
            unmount_dead(mountpoint);
            fmt::print(stderr, "kcache: unmounted the dead kcache mount at {} (lazily)\n",
                       mountpoint);
            return false;
        }
        require_kcache_mount(cli, mountpoint, mount, "");
        return true;
    };
    if (usable()) return std::nullopt;
    std::error_code ec;
    fs::create_directories(mountpoint, ec);  // as scripts/run.sh does
    if (ec) throw Failure(fmt::format("cannot make mountpoint {}: {}", mountpoint, ec.message()));
    const int lock = ::open(mountpoint.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock < 0) throw Failure(fmt::format("mountpoint {}: {}", mountpoint, std::strerror(errno)));
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{lock};
    while (::flock(lock, LOCK_EX) != 0 && errno == EINTR) {
    }
    if (usable()) return std::nullopt;
    const std::string named = named_db(cli);
    const std::string db = !named.empty() ? named : !dead_db.empty() ? dead_db : cli.db_path();
    const std::string fsd = find_fsd();
    const int status = start_fsd(fsd, db, mountpoint);
    if (usable()) return status == 0 ? std::optional<std::string>(db) : std::nullopt;
    throw Failure(fmt::format(
        "cannot mount db {} at {}: {} {}", db, mountpoint, fsd,
        status < 0 ? std::string("was killed") : fmt::format("exited with status {}", status)));
}

int run_run(const Cli& cli, const RunOptions& opts) {
    const std::string mnt = mount_path(opts.mount.empty() ? default_mount_path() : opts.mount);
    if (const auto db = ensure_mounted(cli, mnt)) {
        fmt::print(stderr,
                   "kcache: mounted db {} at {}; it stays mounted (`fusermount3 -u {}` "
                   "unmounts it)\n",
                   *db, mnt, mnt);
    }
    make_subdirs(mnt);
    for (const Setting& s : kSettings) {
        const std::string variable(s.variable);
        if (::setenv(variable.c_str(), value_of(s, mnt).c_str(), 1) != 0)
            throw Failure(fmt::format("setenv {}: {}", variable, std::strerror(errno)));
    }
    std::vector<std::string> args = opts.command;
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    std::fflush(stderr);
    ::execvp(argv[0], argv.data());
    // As a shell: 127 when there is no such command, 126 when it cannot be run.
    const int err = errno;
    const std::string& name = opts.command.front();
    if (err == ENOENT && name.find('/') == std::string::npos) {
        fmt::print(stderr, "kcache: {}: command not found\n", name);
    } else {
        fmt::print(stderr, "kcache: {}: {}\n", name, std::strerror(err));
    }
    return err == ENOENT ? 127 : 126;
}

}  // namespace

void add_env_commands(CLI::App& app, Cli& cli) {
    {
        auto opts = std::make_shared<EnvOptions>();
        auto* sub = app.add_subcommand(
            "env",
            "print shell code that points every compiler at the mount: eval \"$(kcache env)\"");
        sub->add_option("--mount", opts->mount,
                        "the mount (default: $KCACHE_MOUNT, else ~/.cache/kcache/mnt)")
            ->type_name("DIR");
        sub->add_option("--shell", opts->shell, "the shell's syntax")
            ->type_name("SHELL")
            ->check(CLI::IsMember({"sh", "fish"}))
            ->capture_default_str();
        sub->add_flag("--no-check", opts->no_check,
                      "print the variables even where no kcache mount is (and make no "
                      "subdirectories)");
        on_run(sub, cli, opts, &run_env);
    }
    {
        auto opts = std::make_shared<RunOptions>();
        auto* sub = app.add_subcommand(
            "run",
            "run a command with every compiler pointed at the mount, mounting the db there "
            "first if nothing is: kcache run -- COMMAND [ARGS...]");
        sub->add_option("--mount", opts->mount,
                        "the mount (default: $KCACHE_MOUNT, else ~/.cache/kcache/mnt)")
            ->type_name("DIR");
        sub->add_option("command", opts->command,
                        "the command and its arguments, after `--` when they have options")
            ->type_name("COMMAND")
            ->required();
        on_run(sub, cli, opts, &run_run);
    }
}

}  // namespace kcache::cli
