// Writes the committed seed corpora of the core fuzz targets (tests/reliability/corpus/
// bundle and records): real bundles exported by core and real encoded records, each
// prefixed with the target's selector byte (see fuzz_bundle.cpp, fuzz_records.cpp).
// Not part of the build; rerun it when a format changes:
//   g++ -std=c++20 -Icore/include -Icore/src tests/reliability/fuzz/make_seeds.cpp \
//       -Lbuild-rel6/core -lkcache_core -lfmt -Wl,-rpath,$PWD/build-rel6/core -o /tmp/make_seeds
//   /tmp/make_seeds tests/reliability/corpus
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "kcache/core/bundle.hpp"
#include "kcache/core/misses.hpp"
#include "kcache/core/store.hpp"
#include "records.hpp"

namespace {

namespace core = kcache::core;
namespace records = kcache::core::records;
namespace fs = std::filesystem;

template <class T>
T must(core::Result<T> r) {
    if (!r) {
        std::fprintf(stderr, "make_seeds: %s\n", r.error().message.c_str());
        std::exit(1);
    }
    return std::move(*r);
}
void must(core::Status s) {
    if (!s) {
        std::fprintf(stderr, "make_seeds: %s\n", s.error().message.c_str());
        std::exit(1);
    }
}

void write(const fs::path& path, char selector, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << selector << bytes;
}

std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// Exports a db holding what `fill` writes (entry depth `depth`) and returns the bundle.
std::string bundle_of(const fs::path& tmp, std::uint32_t depth,
                      const std::function<void(core::WriteTxn&, core::Ino)>& fill) {
    static int n = 0;
    const fs::path db = tmp / ("db" + std::to_string(++n));
    core::OpenOptions options;
    options.path = db.string();
    options.entry_depth = depth;
    options.durability = core::Durability::none;
    options.map_size = std::uint64_t{1} << 30;
    auto store = must(core::Store::open(options));
    auto txn = must(store->write());
    core::Ino at = core::kRootIno;
    if (depth == 2) at = must(txn.mkdir(at, "grp", 0755, 0, 0)).ino;
    fill(txn, at);
    must(txn.commit());
    const fs::path out = tmp / ("b" + std::to_string(n) + ".kcb");
    must(core::export_bundle(*store, {}, out.string()));
    return read(out);
}

// Bundles: flags byte 0 (as exported), 2 (replace), 4/6 (depth-2 db).
void bundle_seeds(const fs::path& corpus, const fs::path& tmp) {
    const auto origin = core::Origin::current();
    const auto kernel = bundle_of(tmp, 1, [&](core::WriteTxn& txn, core::Ino root) {
        const auto k1 = must(txn.mkdir(root, "k1", 0755, 0, 0)).ino;
        const auto f = must(txn.create(k1, "kernel.cubin", 0644, 0, 0, true)).ino;
        must(txn.write(f, std::string(64, '\x7f'), origin));
        const auto j = must(txn.create(k1, "kernel.json", 0644, 0, 0, true)).ino;
        must(txn.write(j, R"({"name": "add", "num_warps": 4})", origin));
        must(txn.create(k1, "empty", 0600, 0, 0, true));
        const auto sub = must(txn.mkdir(k1, "sub", 0700, 0, 0)).ino;
        const auto ptx = must(txn.create(sub, "k.ptx", 0644, 0, 0, true)).ino;
        std::string text;
        for (int i = 0; i < 300; ++i) text += "ld.param.u64 %rd1, [param_0];\n";  // zstd pays
        must(txn.write(ptx, text, origin));
        must(txn.symlink(k1, "link", "sub/k.ptx", 0, 0));
        must(txn.symlink(sub, "up", "../kernel.cubin", 0, 0));
        const auto flat = must(txn.create(root, "flat", 0644, 0, 0, true)).ino;
        must(txn.write(flat, "flat entry", origin));
    });
    write(corpus / "bundle" / "kernel", '\0', kernel);
    write(corpus / "bundle" / "kernel_replace", '\2', kernel);
    const auto empty = bundle_of(tmp, 1, [](core::WriteTxn&, core::Ino) {});
    write(corpus / "bundle" / "empty", '\0', empty);
    const auto grouped = bundle_of(tmp, 2, [&](core::WriteTxn& txn, core::Ino grp) {
        const auto k2 = must(txn.mkdir(grp, "k2", 0755, 0, 0)).ino;
        const auto f = must(txn.create(k2, "launcher.so", 0755, 0, 0, true)).ino;
        must(txn.write(f,
                       "\x7f"
                       "ELF",
                       origin));
        const auto k1 = must(txn.mkdir(grp, "k1", 0755, 0, 0)).ino;
        must(txn.create(k1, "kernel.cubin", 0644, 0, 0, true));
    });
    write(corpus / "bundle" / "grouped", '\4', grouped);
    write(corpus / "bundle" / "grouped_replace", '\6', grouped);
}

// Records: selector = decoder index in fuzz_records.cpp.
void record_seeds(const fs::path& corpus) {
    records::Inode inode;
    inode.mode = 0100644;
    inode.size = 5;
    inode.parent = 1;
    inode.entry = 2;
    inode.depth = 2;
    inode.digest = core::digest_of("hello");
    inode.name = "kernel.cubin";
    write(corpus / "records" / "inode", '\0', records::encode(inode));
    inode.mode = 0120777;
    inode.target = "../x";
    inode.name = "link";
    write(corpus / "records" / "inode_symlink", '\0', records::encode(inode));
    write(corpus / "records" / "dirent", '\1',
          records::encode(records::Dirent{9, core::FileType::directory}));
    write(corpus / "records" / "blob", '\2',
          records::encode(records::BlobRef{2, 9000, 4100, records::Codec::zstd}));
    core::EntryInfo entry;
    entry.name = "0123abcd";
    entry.bytes = 100;
    entry.files = 3;
    entry.pinned = true;
    entry.populated = true;
    entry.populated_by_pid = 4242;
    entry.populated_by_name = "python3";
    entry.producer = core::Producer::triton;
    write(corpus / "records" / "entry", '\3', records::encode(entry));
    core::Event event;
    event.time_ns = 1'700'000'000'000'000'000;
    event.kind = core::EventKind::populate;
    event.entry = 5;
    event.parent = 1;
    event.name = "0123abcd";
    write(corpus / "records" / "event", '\4', records::encode(event));
    write(corpus / "records" / "config", '\5', records::encode(core::Config{}));
    write(corpus / "records" / "counter", '\6', records::encode_u64(123456));
    records::BlobRef with_dictionary{3, 9000, 2100, records::Codec::zstd};
    with_dictionary.kind = 2;
    with_dictionary.dictionary = 32768;
    write(corpus / "records" / "blob_dictionary", '\2', records::encode(with_dictionary));
    records::Kind kind;
    kind.name = "triton/cubin-sm_90";
    kind.blobs = 88;
    kind.raw_bytes = 1699936;
    kind.stored_bytes = 312320;
    kind.dictionary = 32768;
    kind.trained_at = 1699936;
    write(corpus / "records" / "kind", '\7', records::encode(kind));
    records::Dictionary dictionary;
    dictionary.kind = 2;
    dictionary.users = 88;
    dictionary.size = 65536;
    dictionary.samples = 88;
    dictionary.sample_bytes = 1699936;
    dictionary.created_ns = 1'700'000'000'000'000'000;
    write(corpus / "records" / "dictionary", '\10', records::encode(dictionary));
}

// The misses' tables: a miss explained by a family member, a capacity miss, an eviction.
void miss_seeds(const fs::path& corpus) {
    core::Miss miss;
    miss.time_ns = 1'700'000'000'000'000'000;
    miss.entry = 5;
    miss.name = "triton/0123abcd";
    miss.producer = core::Producer::triton;
    miss.family = "triton:add_kernel";
    miss.cause = core::MissCause::changed_key;
    miss.stored_bytes = 8192;
    miss.compared = 4;
    miss.compared_name = "triton/4567cdef";
    miss.fields.push_back({"{key}/add_kernel.json", "num_warps", "4", "8"});
    miss.lines.push_back({"{key}/add_kernel.ttir", 12, "%0 = tt.load %a", "%0 = tt.load %b"});
    miss.compared_host = "node-a";
    miss.compared_namespace = "default";
    write(corpus / "records" / "miss", '\11', records::encode(miss));
    core::Miss capacity;
    capacity.time_ns = 1'700'000'000'000'000'000;
    capacity.entry = 6;
    capacity.name = "inductor/fxgraph/ab/cdef";
    capacity.producer = core::Producer::inductor;
    capacity.cause = core::MissCause::capacity;
    capacity.gone_ns = 1'699'999'999'000'000'000;
    capacity.gone_why = "evicted (the size bound, kcache evict or clear)";
    capacity.stack_distance = 1 << 20;
    write(corpus / "records" / "miss_capacity", '\11', records::encode(capacity));
    write(corpus / "records" / "eviction", '\12',
          records::encode(
              records::Eviction{41, 1'699'999'999'000'000'000, 6, core::EventKind::evict}));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
        return 2;
    }
    const fs::path corpus = argv[1];
    const fs::path tmp = fs::temp_directory_path() / ("kcache-seeds-" + std::to_string(getpid()));
    fs::create_directories(tmp);
    fs::create_directories(corpus / "bundle");
    fs::create_directories(corpus / "records");
    bundle_seeds(corpus, tmp);
    record_seeds(corpus);
    miss_seeds(corpus);
    fs::remove_all(tmp);
    return 0;
}
