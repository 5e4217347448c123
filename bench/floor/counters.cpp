#include "counters.hpp"

#include <atomic>
#include <cstdio>
#include <string>
#include <utility>

namespace kcache::floor_fsd {
namespace {

const char* const kOpNames[kOps] = {
    "LOOKUP",   "FORGET",    "BATCH_FORGET", "GETATTR",  "SETATTR",  "MKDIR",       "UNLINK",
    "RMDIR",    "RENAME",    "RENAME2",      "OPEN",     "READ",     "WRITE",       "STATFS",
    "RELEASE",  "FSYNC",     "FLUSH",        "OPENDIR",  "READDIR",  "READDIRPLUS", "RELEASEDIR",
    "FSYNCDIR", "CREATE",    "IOCTL",        "GETXATTR", "SETXATTR", "LISTXATTR",   "REMOVEXATTR",
    "ACCESS",   "FALLOCATE", "LSEEK",        "MKNOD",    "LINK",     "SYMLINK",     "READLINK"};
std::atomic<unsigned long long> g_counts[kOps];  // relaxed increments: no cost worth measuring
std::string g_counts_path;

}  // namespace

void count(Op op) {
    g_counts[op].fetch_add(1, std::memory_order_relaxed);
}

// bench/fsd_flows.py removes the file, sends SIGUSR1 and waits for it.
void write_counts() {
    if (g_counts_path.empty()) return;
    const std::string tmp = g_counts_path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return;
    for (int i = 0; i < kOps; ++i) std::fprintf(f, "%s %llu\n", kOpNames[i], g_counts[i].load());
    std::fclose(f);
    std::rename(tmp.c_str(), g_counts_path.c_str());
}

void set_counts_path(std::string path) {
    g_counts_path = std::move(path);
}

}  // namespace kcache::floor_fsd
