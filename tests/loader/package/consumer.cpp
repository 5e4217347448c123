// Built against an installed kcache (find_package and pkg-config): the header-only C++
// API over the C ABI, with no kcache internals on the include path.
#include <cstdio>
#include <fstream>
#include <string>

#include <kcache/loader.hpp>

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    try {
        kcache::Cache cache(argv[1]);
        auto entry = cache.entry(argv[2]);
        auto selection = entry.select_binary(90);
        auto signature = entry.signature();
        std::printf("%s %s %s %s %u\n", cache.kind().c_str(), selection.file.c_str(),
                    selection.format.c_str(), signature.kernel().c_str(),
                    signature.launch_config().block[0]);
        try {
            kcache::Runtime runtime(kcache::RuntimeOptions{"libkcache-no-such-driver.so.1"});
        } catch (const kcache::Error& e) {
            std::printf("%s\n", kcache_status_name(e.status()));
        }
    } catch (const kcache::Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
