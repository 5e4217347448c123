// A real ccache (Debian's) with CCACHE_DIR on the mount: its temporary files, renames,
// symlink locks and stats files all go through kcache-fsd.

#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

#include <catch2/catch.hpp>

#include "mount_fixture.hpp"
#include "skip.hpp"

using namespace kcache::test;

namespace {

bool have(const std::string& program) {
    return run_process({"sh", "-c", "command -v " + program}).exit_code == 0;
}

std::map<std::string, std::uint64_t> parse_print_stats(const std::string& text) {
    std::map<std::string, std::uint64_t> out;
    std::istringstream lines(text);
    std::string name;
    std::uint64_t value = 0;
    while (lines >> name >> value) out[name] = value;
    return out;
}

}  // namespace

TEST_CASE("ccache with CCACHE_DIR on the mount: a rebuild is all direct hits", "[fsd][ccache]") {
    require_fuse();
    if (!have("ccache") || !have("gcc")) skip("ccache or gcc is not installed");

    MountedCache cache;
    TempDir project;
    write_file(project / "common.h", "int helper_a(int);\nint helper_b(int);\n");
    write_file(project / "a.c", "#include \"common.h\"\nint helper_a(int x) { return x * 3; }\n");
    write_file(project / "b.c",
               "#include \"common.h\"\nint helper_b(int x) { return helper_a(x) + 4; }\n");
    write_file(project / "c.c",
               "#include <stdio.h>\n#include \"common.h\"\n"
               "int main(void) { printf(\"%d\\n\", helper_b(5)); return 0; }\n");
    write_file(project / "ccache.conf", "");

    ProcOptions options;
    options.cwd = project.str();
    options.timeout_s = 120;
    options.env = {
        {"CCACHE_DIR", cache.p("ccache")},
        {"CCACHE_CONFIGPATH", (project / "ccache.conf").string()},
        // Sources were written a moment ago; let direct mode remember them anyway.
        {"CCACHE_SLOPPINESS", "include_file_mtime,include_file_ctime"},
    };
    options.unset_env = {"CCACHE_DISABLE",  "CCACHE_RECACHE", "CCACHE_NODIRECT",
                         "CCACHE_READONLY", "CCACHE_PREFIX",  "CCACHE_BASEDIR"};
    const std::vector<std::string> sources{"a", "b", "c"};

    auto run_ok = [&](const std::vector<std::string>& argv) {
        const ProcResult r = run_process(argv, options);
        INFO(argv[0] << " " << (argv.size() > 1 ? argv[1] : "") << ": " << r.describe()
                     << "\ndaemon stderr:\n"
                     << cache.daemon_stderr());
        REQUIRE(r.exit_code == 0);
        return r;
    };
    auto build = [&] {
        for (const auto& s : sources)
            run_ok({"ccache", "gcc", "-O2", "-c", s + ".c", "-o", s + ".o"});
        run_ok({"gcc", "-o", "prog", "a.o", "b.o", "c.o"});
        CHECK(run_ok({"./prog"}).out == "19\n");
    };
    auto stats = [&] { return parse_print_stats(run_ok({"ccache", "--print-stats"}).out); };

    run_ok({"ccache", "-z"});
    build();
    auto first = stats();
    CHECK(first["cache_miss"] == 3);
    CHECK(first["direct_cache_hit"] == 0);
    std::map<std::string, std::string> objects;
    for (const auto& s : sources) objects[s] = read_file(project / (s + ".o"));

    // `make clean`, then the same build again.
    for (const auto& s : sources) fs::remove(project / (s + ".o"));
    fs::remove(project / "prog");
    run_ok({"ccache", "-z"});
    build();
    auto second = stats();
    INFO("second build: direct hits " << second["direct_cache_hit"] << ", preprocessed hits "
                                      << second["preprocessed_cache_hit"] << ", misses "
                                      << second["cache_miss"]);
    CHECK(second["direct_cache_hit"] == 3);
    CHECK(second["preprocessed_cache_hit"] == 0);
    CHECK(second["cache_miss"] == 0);
    for (const auto& s : sources) {
        INFO(s << ".o");
        CHECK(read_file(project / (s + ".o")) == objects[s]);
    }
    // `ccache -s` works on the mount too.
    run_ok({"ccache", "-s"});
    cache.unmount();
}
