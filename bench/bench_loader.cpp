// The loader's cold path and launch overhead (issue 4):
//  1. a cold load of an entry (open the entry, choose the binary for the device, read
//     the signature) from a kcache LMDB db against the same files in a plain
//     directory, both on the same disk; with the page cache dropped before each pass
//     when this process may (root: /proc/sys/vm/drop_caches), and warm;
//  2. with a GPU, the launch overhead of Kernel::launch (argument check included) and
//     of a session-cache hit + launch, against a raw cuLaunchKernel of the same
//     function. Without a driver and a device this part says so and is skipped.
// It prints figures; it asserts nothing.
//
//   kcache-bench-loader [--entries N=500] [--load M=N] [--passes P=5] [--launches L=200000]

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "builders.hpp"  // tests/loader: synthetic cubins
#include "kcache/core/store.hpp"
#include "kcache/loader/cache.hpp"
#include "kcache/loader/runtime.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace kcache;

namespace {

std::string noise(std::size_t n, std::uint64_t seed) {
    std::string out(n, '\0');
    std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (auto& c : out) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        c = static_cast<char>(x);
    }
    return out;
}

std::string text(std::size_t n, std::uint64_t seed) {
    std::string out;
    std::uint64_t x = seed + 7;
    while (out.size() < n) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        out += "\tld.global.f32 %f" + std::to_string(x % 97) + ", [%rd" + std::to_string(x % 13) +
               "];\n";
    }
    out.resize(n);
    return out;
}

// One Triton-like entry: a 24 KiB cubin (its code incompressible), PTX, two IR files
// and a kcache signature.
std::vector<std::pair<std::string, std::string>> entry_files(std::uint64_t i) {
    using namespace kcache::test;
    const std::string info =
        kparam_info(3, 24, 4) + kparam_info(2, 16, 8) + kparam_info(1, 8, 8) + kparam_info(0, 0, 4);
    ElfSpec spec;
    spec.sections.push_back({".text.axpy", 1, noise(24 * 1024, i), 0});
    spec.sections.push_back({".nv.info.axpy", 0x70000000, info, 1});
    spec.symbols.push_back({"axpy", 0x12, 0x10, 1});
    const std::string sig =
        R"({"kcache_signature": 1, "kernel": "axpy", "params": [{"type": "f32"}, {"type": "ptr"},)"
        R"( {"type": "ptr"}, {"type": "i32"}], "block": [128], "dynamic_shared_memory": 0})";
    return {{"kernel.cubin", build_elf(spec)},
            {"kernel.json", sig},
            {"kernel.ptx", ".version 8.0\n.target sm_90\n.address_size 64\n" + text(16 * 1024, i)},
            {"kernel.ttir", text(8 * 1024, i + 1)},
            {"kernel.ttgir", text(8 * 1024, i + 2)}};
}

std::string key_of(std::uint64_t i) {
    char buf[65];
    std::snprintf(buf, sizeof buf, "%016llx%016llx%016llx%016llx",
                  static_cast<unsigned long long>(i), static_cast<unsigned long long>(i * 31 + 7),
                  static_cast<unsigned long long>(i ^ 0xabcdef),
                  static_cast<unsigned long long>(i * i));
    return buf;
}

bool drop_caches() {
    ::sync();
    const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd < 0) return false;
    const bool ok = ::write(fd, "3", 1) == 1;
    ::close(fd);
    return ok;
}

template <class T>
T must(core::Result<T> r, const char* what) {
    if (!r) {
        std::fprintf(stderr, "%s: %s\n", what, r.error().message.c_str());
        std::exit(1);
    }
    return std::move(*r);
}

long major_faults() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return ru.ru_majflt;
}

// Bytes this process has had read from storage (readahead included), 0 if unknown.
double storage_read_bytes() {
    std::ifstream io("/proc/self/io");
    std::string name;
    double value = 0;
    while (io >> name >> value) {
        if (name == "read_bytes:") return value;
    }
    return 0;
}

// Loads every entry once in `order`: entry, binary for sm_90, signature. Returns the
// mean microseconds per entry; the cache is opened inside the timed region. Adds the
// pass's major page faults per entry to `faults` (each one a synchronous disk read
// through the map; reads through read(2) do not count).
double load_pass(const std::string& path, const std::vector<std::string>& keys, bool cold,
                 std::vector<double>& faults, std::vector<double>& read_kib) {
    if (cold) drop_caches();
    const long faults_before = major_faults();
    const double read_before = storage_read_bytes();
    const auto start = Clock::now();
    auto cache = must(loader::Cache::open(path), "open");
    std::size_t bytes = 0;
    for (const auto& key : keys) {
        auto entry = must(cache->entry(key), "entry");
        auto selection = must(loader::select_binary(*entry, 90), "select");
        auto signature = must(loader::find_signature(*entry), "signature");
        bytes += selection.info.kernels.size() + signature.kernel.size();
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (bytes == 0) std::puts("(nothing read)");
    faults.push_back(static_cast<double>(major_faults() - faults_before) /
                     static_cast<double>(keys.size()));
    read_kib.push_back((storage_read_bytes() - read_before) / 1024.0 /
                       static_cast<double>(keys.size()));
    return us / static_cast<double>(keys.size());
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

void launch_bench(long launches) {
    std::printf("\n== launch overhead (GPU) ==\n");
    auto runtime = loader::Runtime::open();
    if (!runtime) {
        std::printf("SKIPPED: no usable CUDA driver and device: %s\n",
                    runtime.error().message.c_str());
        return;
    }
    const fs::path fatbin = KCACHE_BENCH_VECTOR_ADD;
    if (!fs::exists(fatbin)) {
        std::printf("SKIPPED: %s was not built (nvcc missing)\n", fatbin.c_str());
        return;
    }
    const fs::path dir =
        fs::temp_directory_path() / ("kcache-bench-launch-" + std::to_string(::getpid()));
    fs::create_directories(dir / "k");
    fs::copy_file(fatbin, dir / "k" / "kernel.fatbin");
    std::ofstream(dir / "k" / "kernel.json")
        << R"({"kcache_signature": 1, "kernel": "vector_add", "params": [{"type": "ptr"}, {"type": "ptr"},)"
           R"( {"type": "ptr"}, {"type": "i32"}], "block": [128]})";
    auto cache = must(loader::Cache::open(dir.string()), "open");
    auto kernel = must((*runtime)->kernel(*cache, "k"), "kernel");
    // The raw path: the same module's function through the driver directly.
    auto driver = must(loader::Driver::load(), "driver");
    const auto& api = driver->api();
    std::uint64_t p = 0;  // null pointers with n = 0: the kernel touches nothing
    int n = 0;
    void* args[] = {&p, &p, &p, &n};
    const std::size_t sizes[] = {8, 8, 8, 4};
    auto config = kernel->default_config();
    // Warm-up, and a function handle for the raw calls (same module, same context).
    for (int i = 0; i < 1000; ++i) (void)kernel->launch(config, args, sizes, 4);
    loader::cuda::CUmodule module = nullptr;
    const std::string image = [&] {
        std::ifstream in(fatbin, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    if (api.module_load_data_ex(&module, image.data(), 0, nullptr, nullptr) != 0) {
        std::printf("SKIPPED: cuModuleLoadDataEx failed for the raw path\n");
        return;
    }
    loader::cuda::CUfunction raw = nullptr;
    api.module_get_function(&raw, module, "vector_add");
    const auto time = [&](auto&& launch) {
        std::vector<double> runs;
        for (int r = 0; r < 5; ++r) {
            const auto start = Clock::now();
            for (long i = 0; i < launches; ++i) launch();
            runs.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                           static_cast<double>(launches));
        }
        return median(runs);
    };
    const double raw_ns =
        time([&] { api.launch_kernel(raw, 1, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr); });
    const double kernel_ns = time([&] { (void)kernel->launch(config, args, sizes, 4); });
    const double hit_ns = time([&] {
        auto k = (*runtime)->kernel(*cache, "k");
        (void)(*k)->launch(config, args, sizes, 4);
    });
    std::printf("raw cuLaunchKernel                 %8.0f ns/launch\n", raw_ns);
    std::printf("Kernel::launch (args checked)      %8.0f ns/launch  %.3fx raw\n", kernel_ns,
                kernel_ns / raw_ns);
    std::printf("session-cache hit + launch         %8.0f ns/launch  %.3fx raw\n", hit_ns,
                hit_ns / raw_ns);
    std::printf("(launch queue throughput: %ld launches per run, median of 5 runs)\n", launches);
    api.module_unload(module);
    fs::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t entries = 500;
    int passes = 5;
    long launches = 200000;
    std::uint64_t load = ~0ull;  // entries loaded per pass: all unless --load
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--entries")) entries = std::strtoull(argv[i + 1], nullptr, 10);
        if (!std::strcmp(argv[i], "--passes")) passes = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--launches")) launches = std::atol(argv[i + 1]);
        if (!std::strcmp(argv[i], "--load")) load = std::strtoull(argv[i + 1], nullptr, 10);
    }
    const fs::path root =
        fs::temp_directory_path() / ("kcache-bench-loader-" + std::to_string(::getpid()));
    const std::string db = (root / "db").string(), dir = (root / "dir").string();
    {
        core::OpenOptions options;
        options.path = db;
        options.durability = core::Durability::none;
        auto store = must(core::Store::open(options), "create db");
        for (std::uint64_t i = 0; i < entries; ++i) {
            const auto files = entry_files(i);
            const std::string key = key_of(i);
            auto s = store->update([&](core::WriteTxn& w) -> core::Status {
                auto d = w.mkdir(core::kRootIno, key, 0755);
                if (!d) return tl::unexpected(d.error());
                for (const auto& [name, bytes] : files) {
                    auto f = w.create(d->ino, name, 0644);
                    if (!f) return tl::unexpected(f.error());
                    if (auto r = w.write(f->ino, bytes, core::Origin::current()); !r)
                        return tl::unexpected(r.error());
                }
                return {};
            });
            if (!s) return std::fprintf(stderr, "%s\n", s.error().message.c_str()), 1;
            fs::create_directories(fs::path(dir) / key);
            for (const auto& [name, bytes] : files)
                std::ofstream(fs::path(dir) / key / name, std::ios::binary) << bytes;
        }
        (void)store->sync();
    }
    std::vector<std::string> keys;
    for (std::uint64_t i = 0; i < entries; ++i) keys.push_back(key_of(i));
    std::shuffle(keys.begin(), keys.end(), std::mt19937_64(42));
    if (load < keys.size()) keys.resize(load);  // a random sample of a larger cache

    const bool can_drop = drop_caches();
    std::printf("== cold load of an entry: open entry + binary for sm_90 + signature ==\n");
    std::printf(
        "%llu entries of 5 files (24 KiB cubin, 16 KiB PTX, 2x8 KiB IR, JSON), %zu loaded per "
        "pass, %d passes, build %s\n",
        static_cast<unsigned long long>(entries), keys.size(), passes, KCACHE_BENCH_BUILD_TYPE);
    for (const bool cold : {true, false}) {
        if (cold && !can_drop) {
            std::printf("cold: SKIPPED (cannot write /proc/sys/vm/drop_caches: not root)\n");
            continue;
        }
        std::vector<double> from_db, from_dir, db_faults, dir_faults, db_kib, dir_kib;
        for (int p = 0; p < passes; ++p) {  // alternated, so drift hits both
            from_db.push_back(load_pass(db, keys, cold, db_faults, db_kib));
            from_dir.push_back(load_pass(dir, keys, cold, dir_faults, dir_kib));
        }
        const double d = median(from_db), f = median(from_dir);
        std::printf("%s page cache: db %8.1f us/entry   plain dir %8.1f us/entry   db/dir %.2fx\n",
                    cold ? "cold" : "warm", d, f, d / f);
        std::printf(
            "  per entry: major faults db %.1f, dir %.1f; read from disk db %.0f KiB, dir %.0f "
            "KiB\n",
            median(db_faults), median(dir_faults), median(db_kib), median(dir_kib));
    }
    fs::remove_all(root);
    launch_bench(launches);
    return 0;
}
