// Concurrency soak: for a bounded time, 8 processes mix store, lookup, rename, unlink
// and directory operations on one mount while a control thread runs `kcache evict`,
// `pin`/`unpin`, `stats`, `ls` and `verify` on the same db. No unexpected error, no
// torn file, no deadlock (a progress watchdog fails the test), the daemon's memory
// stays bounded, and the db verifies clean at the end.
//
// Namespace: kDirs entry directories dNN, each with files f0..f3, a subdirectory s
// with files g0..g1, and writers' temporary files .tmp.*. Entry directories and
// subdirectories are renamed across entries and depths, removed and recreated.
//
// Every file's content describes itself: a header (writer, sequence, length), a body
// derived from it and a 16-byte digest; a read must return either an empty file (one
// created and not yet published) or one complete version.
//
// Figures: KCACHE_SOAK_SECONDS (default kDefaultSeconds), KCACHE_SOAK_SEED.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <random>
#include <sstream>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"

using namespace kcache::test;

namespace {

constexpr std::uint64_t kDefaultSeconds = 60;  // CI's value: set KCACHE_SOAK_SECONDS
constexpr int kWorkers = 8;
constexpr int kDirs = 30;
constexpr int kFiles = 4;     // dNN/f0..f3
constexpr int kSubFiles = 2;  // dNN/s/g0..g1
constexpr std::size_t kMaxBody = 96 * 1024;
constexpr double kStallSeconds = 15;
constexpr double kSlackSeconds = 60;
constexpr int kMaxErrno = 160;

enum Op {
    kStoreTrunc,
    kStoreRename,
    kRead,
    kStat,
    kReaddir,
    kRenameFile,
    kRenameDir,
    kRenameCross,
    kUnlink,
    kMkdir,
    kRmtree,
    kOps
};
constexpr std::array<const char*, kOps> kOpNames = {
    "store_trunc", "store_rename", "read",   "stat",  "readdir", "rename_file",
    "rename_dir",  "rename_cross", "unlink", "mkdir", "rmtree"};

struct WorkerSlot {
    std::atomic<std::uint64_t> progress{0};
    std::uint64_t ops[kOps];
    std::uint64_t expected[kOps][kMaxErrno];  // expected errors, per op and errno
    std::uint64_t failures[kOps];
    std::uint64_t empty_reads;
    std::uint64_t full_reads;
};

struct Shared {
    std::atomic<int> stop{0};
    WorkerSlot slots[kWorkers];
};

std::uint64_t monotonic_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
           static_cast<std::uint64_t>(ts.tv_nsec);
}

double seconds_since(std::uint64_t start_ns) {
    return static_cast<double>(monotonic_ns() - start_ns) / 1e9;
}

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    return std::strtoull(v, nullptr, 0);
}

std::string header_of(int writer, std::uint64_t seq, std::size_t len) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "soak writer %d seq %llu len %zu\n", writer,
                  static_cast<unsigned long long>(seq), len);
    return buf;
}

std::string content_of(int writer, std::uint64_t seq, std::size_t len) {
    std::string out = header_of(writer, seq, len) +
                      random_bytes(len, (static_cast<std::uint64_t>(writer) << 48) ^ seq);
    append_digest(out);
    return out;
}

// True when `content` is exactly one complete version.
bool complete(const std::string& content) {
    const auto nl = content.find('\n');
    if (nl == std::string::npos || nl > 100) return false;
    int writer = 0;
    unsigned long long seq = 0;
    std::size_t len = 0;
    const std::string head = content.substr(0, nl + 1);
    if (std::sscanf(head.c_str(), "soak writer %d seq %llu len %zu\n", &writer, &seq, &len) != 3)
        return false;
    if (len > kMaxBody || header_of(writer, seq, len) != head) return false;
    if (content.size() != head.size() + len + 16) return false;
    return content_of(writer, seq, len) == content;
}

// EINVAL: a directory rename that races with another moving the target's parent under
// the source: the move would then make a loop (as on a local disk).
// What a torn read holds, for the failure message.
std::string describe_torn(const std::string& data) {
    std::ostringstream out;
    out << data.size() << " bytes";
    const auto nl = data.find('\n');
    if (nl == std::string::npos || nl > 100) {
        out << ", no header; first byte " << static_cast<int>(static_cast<unsigned char>(data[0]));
        return out.str();
    }
    out << ", head '" << data.substr(0, nl) << "'";
    std::size_t len = 0;
    const auto lp = data.find(" len ");
    if (lp == std::string::npos || lp > nl) return out.str();
    len = std::strtoul(data.c_str() + lp + 5, nullptr, 10);
    const std::size_t want = nl + 1 + len + 16;
    out << ", its version is " << want << " bytes";
    if (data.size() >= want) {
        out << ", prefix " << (complete(data.substr(0, want)) ? "complete" : "NOT complete");
        const std::string tail = data.substr(want);
        const auto nz = tail.find_first_not_of('\0');
        out << ", tail " << tail.size() << " bytes, "
            << (nz == std::string::npos ? std::string("all zero")
                                        : "first nonzero at +" + std::to_string(nz));
        const auto other = tail.find("soak writer");
        if (other != std::string::npos) out << ", another header at +" << other;
    } else {
        std::size_t same = 0;
        const auto hp = data.find("seq ");
        int writer = std::atoi(data.c_str() + 12);
        const auto seq = std::strtoull(data.c_str() + hp + 4, nullptr, 10);
        const std::string full = content_of(writer, seq, len);
        while (same < data.size() && data[same] == full[same]) ++same;
        out << ", short; matches its version for " << same << " bytes";
    }
    return out.str();
}

bool expected_errno(int e, bool dir_rename) {
    if (e == EINVAL) return dir_rename;
    return e == ENOENT || e == ENOTEMPTY || e == EEXIST || e == ENOTDIR || e == EISDIR ||
           e == ESTALE;
}

// A name the namespace may hold.
bool known_name(const std::string& n) {
    if (n == "." || n == ".." || n == "s") return true;
    if (n.rfind(".tmp.", 0) == 0) return true;
    if (n.size() == 3 && n[0] == 'd' && std::isdigit(static_cast<unsigned char>(n[1])) &&
        std::isdigit(static_cast<unsigned char>(n[2])))
        return true;
    if (n.size() == 2 && (n[0] == 'f' || n[0] == 'g') &&
        std::isdigit(static_cast<unsigned char>(n[1])))
        return true;
    return false;
}

class Worker {
  public:
    Worker(const MountedCache& cache, Shared& shared, int id, std::uint64_t seed,
           std::uint64_t deadline_ns)
        : m_cache(cache),
          m_shared(shared),
          m_slot(shared.slots[id]),
          m_id(id),
          m_rng(seed),
          m_deadline_ns(deadline_ns) {}

    int run() {
        while (m_shared.stop.load() == 0 && monotonic_ns() < m_deadline_ns) {
            const int pick = static_cast<int>(m_rng() % 100);
            Op op = kRead;
            if (pick < 14)
                op = kStoreTrunc;
            else if (pick < 28)
                op = kStoreRename;
            else if (pick < 46)
                op = kRead;
            else if (pick < 54)
                op = kStat;
            else if (pick < 62)
                op = kReaddir;
            else if (pick < 70)
                op = kRenameFile;
            else if (pick < 74)
                op = kRenameDir;
            else if (pick < 77)
                op = kRenameCross;
            else if (pick < 86)
                op = kUnlink;
            else if (pick < 96)
                op = kMkdir;
            else
                op = kRmtree;
            do_op(op);
            m_slot.progress.fetch_add(1);
        }
        return 0;
    }

  private:
    int rnd(int n) { return static_cast<int>(m_rng() % static_cast<std::uint64_t>(n)); }
    std::string dir(int d) const {
        char buf[8];
        std::snprintf(buf, sizeof buf, "d%02d", d);
        return buf;
    }
    std::string rdir() { return dir(rnd(kDirs)); }
    std::string rfile() {
        if (rnd(3) == 0) return rdir() + "/s/g" + std::to_string(rnd(kSubFiles));
        return rdir() + "/f" + std::to_string(rnd(kFiles));
    }

    // Records the outcome of one call: 0, or the errno it failed with.
    void outcome(Op op, int err, const std::string& what) {
        if (err == 0) return;
        if (expected_errno(err, op == kRenameDir || op == kRenameCross) && err < kMaxErrno) {
            ++m_slot.expected[op][err];
            return;
        }
        fail(op, what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
    }
    void fail(Op op, const std::string& what) {
        ++m_slot.failures[op];
        if (++m_reported <= 20) {
            std::fprintf(stderr, "soak worker %d: %s %s\n", m_id, kOpNames[op], what.c_str());
        }
    }
    int call(int rc) { return rc < 0 ? errno : 0; }

    std::string next_content() {
        const std::size_t len = rnd(4) == 0
                                    ? static_cast<std::size_t>(rnd(static_cast<int>(kMaxBody)))
                                    : static_cast<std::size_t>(rnd(8192));
        return content_of(m_id, ++m_seq, len);
    }

    void do_op(Op op) {
        ++m_slot.ops[op];
        switch (op) {
            case kStoreTrunc: {
                const std::string rel = rfile();
                outcome(op, write_all(m_cache.p(rel), next_content()), rel);
                break;
            }
            case kStoreRename: {
                const std::string target = rfile();
                const std::string tmp = target.substr(0, target.rfind('/')) + "/.tmp." +
                                        std::to_string(m_id) + "." + std::to_string(m_seq + 1);
                const int err = write_all(m_cache.p(tmp), next_content(), O_EXCL);
                if (err != 0) {
                    outcome(op, err, "write " + tmp);
                    ::unlink(m_cache.p(tmp).c_str());
                    break;
                }
                const int rerr = call(::rename(m_cache.p(tmp).c_str(), m_cache.p(target).c_str()));
                outcome(op, rerr, "rename " + tmp + " -> " + target);
                if (rerr != 0) {
                    const int uerr = call(::unlink(m_cache.p(tmp).c_str()));
                    outcome(op, uerr, "unlink " + tmp);
                }
                break;
            }
            case kRead: {
                const std::string rel = rfile();
                errno = 0;
                const auto data = read_all(m_cache.p(rel));
                if (!data) {
                    outcome(op, errno == 0 ? EIO : errno, rel);
                } else if (data->empty()) {
                    ++m_slot.empty_reads;
                } else if (!complete(*data)) {
                    fail(op, rel + ": torn or foreign content: " + describe_torn(*data));
                } else {
                    ++m_slot.full_reads;
                }
                break;
            }
            case kStat: {
                const std::string rel = rnd(3) == 0 ? rdir() : rfile();
                struct stat st {};
                outcome(op, call(::stat(m_cache.p(rel).c_str(), &st)), rel);
                break;
            }
            case kReaddir: {
                const std::string rel =
                    rnd(4) == 0 ? std::string(".") : (rnd(3) == 0 ? rdir() + "/s" : rdir());
                DIR* d = ::opendir(m_cache.p(rel).c_str());
                if (d == nullptr) {
                    outcome(op, errno, "opendir " + rel);
                    break;
                }
                while (true) {
                    errno = 0;
                    const dirent* e = ::readdir(d);
                    if (e == nullptr) {
                        outcome(op, errno, "readdir " + rel);
                        break;
                    }
                    if (!known_name(e->d_name))
                        fail(op, rel + ": unexpected name '" + e->d_name + "'");
                }
                ::closedir(d);
                break;
            }
            case kRenameFile: {
                const std::string from = rfile(), to = rfile();
                outcome(op, call(::rename(m_cache.p(from).c_str(), m_cache.p(to).c_str())),
                        from + " -> " + to);
                break;
            }
            case kRenameDir: {
                const int a = rnd(kDirs), b = rnd(kDirs);
                if (a == b) break;
                const bool sub = rnd(2) == 0;
                const std::string from = dir(a) + (sub ? "/s" : ""),
                                  to = dir(b) + (sub ? "/s" : "");
                outcome(op, call(::rename(m_cache.p(from).c_str(), m_cache.p(to).c_str())),
                        from + " -> " + to);
                break;
            }
            case kRenameCross: {  // across the entry depth: a subdirectory becomes an entry or back
                const int a = rnd(kDirs), b = rnd(kDirs);
                if (a == b) break;
                const bool up = rnd(2) == 0;
                const std::string from = up ? dir(a) + "/s" : dir(a),
                                  to = up ? dir(b) : dir(b) + "/s";
                outcome(op, call(::rename(m_cache.p(from).c_str(), m_cache.p(to).c_str())),
                        from + " -> " + to);
                break;
            }
            case kUnlink: {
                const std::string rel = rfile();
                outcome(op, call(::unlink(m_cache.p(rel).c_str())), rel);
                break;
            }
            case kMkdir: {
                const std::string rel = rnd(3) == 0 ? rdir() + "/s" : rdir();
                outcome(op, call(::mkdir(m_cache.p(rel).c_str(), 0755)), rel);
                break;
            }
            case kRmtree: {
                const std::string rel = rdir();
                rmtree(rel, 0);
                break;
            }
            case kOps:
                break;
        }
    }

    void rmtree(const std::string& rel, int depth) {
        if (depth > 16) return;
        DIR* d = ::opendir(m_cache.p(rel).c_str());
        if (d == nullptr) {
            outcome(kRmtree, errno, "opendir " + rel);
            return;
        }
        std::vector<std::pair<std::string, unsigned char>> names;
        while (true) {
            errno = 0;
            const dirent* e = ::readdir(d);
            if (e == nullptr) {
                outcome(kRmtree, errno, "readdir " + rel);
                break;
            }
            const std::string n = e->d_name;
            if (n != "." && n != "..") names.emplace_back(n, e->d_type);
        }
        ::closedir(d);
        for (const auto& [n, type] : names) {
            const std::string child = rel + "/" + n;
            if (type == DT_DIR) {
                rmtree(child, depth + 1);
            } else {
                outcome(kRmtree, call(::unlink(m_cache.p(child).c_str())), "unlink " + child);
            }
        }
        outcome(kRmtree, call(::rmdir(m_cache.p(rel).c_str())), "rmdir " + rel);
    }

    const MountedCache& m_cache;
    Shared& m_shared;
    WorkerSlot& m_slot;
    int m_id;
    std::mt19937_64 m_rng;
    std::uint64_t m_deadline_ns;
    std::uint64_t m_seq = 0;
    int m_reported = 0;
};

// VmRSS of `pid` in KiB, or -1.
long rss_kib(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
    }
    return -1;
}

struct ControlFigures {
    std::atomic<std::uint64_t> evict{0}, pin{0}, unpin{0}, stats{0}, ls{0}, verify{0};
    std::atomic<std::uint64_t> pin_missing{0};  // pin/unpin of an entry evicted meanwhile
    std::atomic<std::uint64_t> failures{0};
    std::mutex mutex;
    std::vector<std::string> messages;
    void fail(const std::string& what, const ProcResult& r) {
        ++failures;
        std::lock_guard lock(mutex);
        if (messages.size() < 20)
            messages.push_back(what + ": " + r.describe() + " out: " + r.out.substr(0, 400));
    }
};

void control_loop(const fs::path& db, const std::atomic<bool>& stop, ControlFigures& fig,
                  std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::string> pinned;
    while (!stop.load()) {
        const int pick = static_cast<int>(rng() % 10);
        if (pick < 3) {
            const std::string n = std::to_string(5 + rng() % 20);
            const auto r = run_kcache(db, {"evict", "--to-entries", n});
            ++fig.evict;
            if (r.exit_code != 0) fig.fail("evict --to-entries " + n, r);
        } else if (pick < 5) {
            const auto r = run_kcache(db, {"ls", "--json"});
            ++fig.ls;
            if (r.exit_code != 0) {
                fig.fail("ls --json", r);
                continue;
            }
            std::vector<std::string> names;
            try {
                for (const auto& e : nlohmann::json::parse(r.out))
                    names.push_back(e.at("name").get<std::string>());
            } catch (const std::exception& ex) {
                fig.fail(std::string("ls --json parse: ") + ex.what(), r);
                continue;
            }
            if (names.empty()) continue;
            const std::string name = names[rng() % names.size()];
            const bool unpin = !pinned.empty() && rng() % 2 == 0;
            const std::string target = unpin ? pinned[rng() % pinned.size()] : name;
            const auto pr = run_kcache(db, {unpin ? "unpin" : "pin", target});
            ++(unpin ? fig.unpin : fig.pin);
            if (pr.exit_code != 0) {
                // The entry may have been removed, renamed or evicted since `ls`.
                if (pr.err.find("no entry") != std::string::npos)
                    ++fig.pin_missing;
                else
                    fig.fail(std::string(unpin ? "unpin " : "pin ") + target, pr);
            }
            if (unpin)
                pinned.erase(std::find(pinned.begin(), pinned.end(), target));
            else if (pr.exit_code == 0)
                pinned.push_back(target);
        } else if (pick < 8) {
            const auto r = run_kcache(db, {"stats", "--json"});
            ++fig.stats;
            if (r.exit_code != 0) {
                fig.fail("stats --json", r);
                continue;
            }
            try {
                const auto stats = nlohmann::json::parse(r.out);
                if (!stats.contains("entries")) fig.fail("stats --json: no entries", r);
            } catch (const std::exception& ex) {
                fig.fail(std::string("stats --json parse: ") + ex.what(), r);
            }
        } else {
            const auto r = run_kcache(db, {"verify"});
            ++fig.verify;
            if (r.exit_code != 0) fig.fail("verify (mounted)", r);
        }
    }
}

}  // namespace

TEST_CASE("soak: 8 processes mix namespace operations while kcache evicts, pins and verifies",
          "[reliability][soak]") {
    const std::uint64_t seconds = env_u64("KCACHE_SOAK_SECONDS", kDefaultSeconds);
    const std::uint64_t seed = env_u64("KCACHE_SOAK_SEED", 0x50a4c0ffeeull);
    std::printf("soak: %llu s, seed %#llx (KCACHE_SOAK_SECONDS, KCACHE_SOAK_SEED)\n",
                static_cast<unsigned long long>(seconds), static_cast<unsigned long long>(seed));

    DaemonOptions options;
    options.watchdog_s = static_cast<double>(seconds) + kSlackSeconds + 60;
    MountedCache cache(options);
    const pid_t daemon = cache.daemon_pid();
    REQUIRE(daemon > 0);

    void* mem =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    Shared* shared = new (mem) Shared();
    for (auto& slot : shared->slots) {
        std::memset(slot.ops, 0, sizeof slot.ops);
        std::memset(slot.expected, 0, sizeof slot.expected);
        std::memset(slot.failures, 0, sizeof slot.failures);
        slot.empty_reads = slot.full_reads = 0;
    }

    for (int d = 0; d < kDirs; ++d) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "d%02d", d);
        REQUIRE_SYS(::mkdir(cache.p(buf).c_str(), 0755));
    }

    const std::uint64_t start_ns = monotonic_ns();
    const std::uint64_t deadline_ns = start_ns + seconds * 1000000000ull;
    std::vector<std::unique_ptr<Child>> workers;
    for (int w = 0; w < kWorkers; ++w) {
        workers.push_back(std::make_unique<Child>([&cache, shared, w, seed, deadline_ns] {
            Worker worker(cache, *shared, w, seed * 1000003u + static_cast<std::uint64_t>(w),
                          deadline_ns);
            return worker.run();
        }));
    }

    std::atomic<bool> control_stop{false};
    ControlFigures control;
    std::thread control_thread(
        [&] { control_loop(cache.db(), control_stop, control, seed ^ 0xc0a7a01ull); });

    // Monitor: progress watchdog and RSS samples, once a second.
    std::vector<long> rss;
    long rss_baseline = -1;
    std::uint64_t last_progress = 0;
    std::uint64_t last_progress_ns = monotonic_ns();
    std::string deadlock;
    while (true) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        const long r = rss_kib(daemon);
        if (r > 0) rss.push_back(r);
        if (rss_baseline < 0 && seconds_since(start_ns) >= 3 && r > 0) rss_baseline = r;
        std::uint64_t progress = 0;
        for (const auto& slot : shared->slots) progress += slot.progress.load();
        bool any_running = false;
        for (auto& w : workers) any_running = any_running || w->running();
        if (!any_running) break;
        if (progress != last_progress) {
            last_progress = progress;
            last_progress_ns = monotonic_ns();
        } else if (seconds_since(last_progress_ns) > kStallSeconds) {
            deadlock = "deadlock? no worker made progress for " +
                       std::to_string(static_cast<int>(kStallSeconds)) + " s";
            break;
        }
        if (seconds_since(start_ns) > static_cast<double>(seconds) + kSlackSeconds) {
            deadlock = "deadlock? the soak ran past its duration + 60 s";
            break;
        }
    }

    if (!deadlock.empty()) {
        std::fprintf(stderr, "soak: %s; daemon stderr:\n%s\n", deadlock.c_str(),
                     cache.daemon_stderr().c_str());
        shared->stop.store(1);
        control_stop.store(true);
        // Kill the daemon first (aborts the FUSE connection and so unblocks every
        // request in flight), then the workers; the fixture unmounts lazily.
        ::kill(daemon, SIGKILL);
        for (auto& w : workers) ::kill(w->pid(), SIGKILL);
        ::umount2(cache.mnt().c_str(), MNT_DETACH);
        control_thread.join();
        workers.clear();
        FAIL(deadlock);
    }

    control_stop.store(true);
    control_thread.join();
    int bad_exits = 0;
    for (auto& w : workers) {
        const auto res = w->join(30);
        if (res.exit_code != 0) ++bad_exits;
    }
    workers.clear();
    const long rss_end = rss_kib(daemon);
    if (rss_end > 0) rss.push_back(rss_end);

    // Figures.
    std::uint64_t ops[kOps] = {};
    std::uint64_t failures[kOps] = {};
    std::map<int, std::uint64_t> errnos;
    std::uint64_t empty_reads = 0, full_reads = 0;
    for (const auto& slot : shared->slots) {
        for (int o = 0; o < kOps; ++o) {
            ops[o] += slot.ops[o];
            failures[o] += slot.failures[o];
            for (int e = 0; e < kMaxErrno; ++e) {
                if (slot.expected[o][e] != 0) errnos[e] += slot.expected[o][e];
            }
        }
        empty_reads += slot.empty_reads;
        full_reads += slot.full_reads;
    }
    std::uint64_t total_ops = 0, total_failures = 0;
    std::ostringstream fig;
    fig << "soak figures (" << seconds << " s):\n  ops:";
    for (int o = 0; o < kOps; ++o) {
        fig << ' ' << kOpNames[o] << '=' << ops[o];
        total_ops += ops[o];
        total_failures += failures[o];
    }
    fig << "\n  total ops " << total_ops << ", complete reads " << full_reads << ", empty reads "
        << empty_reads << "\n  expected errors:";
    for (const auto& [e, n] : errnos) fig << ' ' << strerrorname_np(e) << '=' << n;
    fig << "\n  unexpected failures:";
    for (int o = 0; o < kOps; ++o)
        if (failures[o] != 0) fig << ' ' << kOpNames[o] << '=' << failures[o];
    fig << "\n  control: evict=" << control.evict << " pin=" << control.pin
        << " unpin=" << control.unpin << " (entry gone " << control.pin_missing
        << ") stats=" << control.stats << " ls=" << control.ls << " verify=" << control.verify
        << " failures=" << control.failures;
    const auto [rss_min, rss_max] = std::minmax_element(rss.begin(), rss.end());
    if (!rss.empty()) {
        fig << "\n  daemon RSS KiB: baseline(3 s) " << rss_baseline << ", min " << *rss_min
            << ", max " << *rss_max << ", end " << rss_end << " (" << rss.size() << " samples)";
    }
    std::printf("%s\n", fig.str().c_str());
    for (const auto& m : control.messages) std::printf("  control failure: %s\n", m.c_str());
    // What the daemon said (its warnings name the inode and the cause of a slow path).
    if (total_failures != 0 || control.failures != 0) {
        const std::string said = cache.daemon_stderr();
        std::printf("daemon stderr (last 8000 bytes):\n%s\n",
                    said.substr(said.size() > 8000 ? said.size() - 8000 : 0).c_str());
    }
    std::fflush(stdout);

    INFO(fig.str());
    CHECK(bad_exits == 0);
    CHECK(total_failures == 0);
    CHECK(control.failures == 0);
    CHECK(total_ops > 0);
    REQUIRE(rss_baseline > 0);
    REQUIRE(rss_end > 0);
    CHECK(rss_end < 3 * rss_baseline + 64 * 1024);

    cache.unmount();  // REQUIREs that the daemon exits 0
    const auto verify = run_kcache(cache.db(), {"verify"});
    INFO(verify.describe() << "\n" << verify.out);
    CHECK(verify.exit_code == 0);
    ::munmap(mem, sizeof(Shared));
}
