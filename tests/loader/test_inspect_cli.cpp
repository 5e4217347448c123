// `kcache inspect-binary FILE [--json]`, run as a subprocess.

#include <catch2/catch.hpp>

#include "builders.hpp"
#include "cli_harness.hpp"
#include "expected.hpp"

namespace kcache::test {
namespace {

std::string axpy_cubin() {
    return build_cubin({{"axpy", kparam_info(3, 24, 4) + kparam_info(2, 16, 8) +
                                     kparam_info(1, 8, 8) + kparam_info(0, 0, 4)}});
}

nlohmann::json inspect_json(const std::string& path) {
    const CliResult r = run_kcache({"inspect-binary", path, "--json"});
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("inspect-binary --json: a cubin", "[loader][cli]") {
    TempDir dir;
    const std::string path = (dir / "axpy.cubin").string();
    write_file(path, axpy_cubin());
    const nlohmann::json j = inspect_json(path);
    CHECK(j["file"] == path);
    CHECK(j["format"] == "cubin");
    CHECK(j["arch"] == "sm_90");
    CHECK(j["entries"].empty());
    REQUIRE(j["kernels"].size() == 1);
    const auto& k = j["kernels"][0];
    CHECK(k["name"] == "axpy");
    CHECK(k["param_bytes"] == 28);
    CHECK(k["params"] == nlohmann::json::parse(R"([{"index":0,"offset":0,"size":4},
        {"index":1,"offset":8,"size":8},{"index":2,"offset":16,"size":8},
        {"index":3,"offset":24,"size":4}])"));
}

TEST_CASE("inspect-binary: human output", "[loader][cli]") {
    TempDir dir;
    const std::string path = (dir / "axpy.cubin").string();
    write_file(path, axpy_cubin());
    const CliResult r = run_kcache({"inspect-binary", path});
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == path +
                       ": cubin sm_90, 1 kernel\n"
                       "kernel axpy: 4 params, 28 bytes\n"
                       "  index  offset    size\n"
                       "      0       0       4\n"
                       "      1       8       8\n"
                       "      2      16       8\n"
                       "      3      24       4\n");
}

TEST_CASE("inspect-binary --json: an nvcc fatbin lists its entries", "[loader][cli]") {
    const std::string bytes = kernel_bytes("params.fatbin");
    TempDir dir;
    const std::string path = (dir / "params.fatbin").string();
    write_file(path, bytes);
    const nlohmann::json j = inspect_json(path);
    CHECK(j["format"] == "fatbin");
    CHECK(j["arch"].is_null());
    CHECK(j["kernels"].empty());
    REQUIRE(j["entries"].size() == 3);
    for (const auto& e : j["entries"]) {
        INFO(e.dump());
        CHECK((e["kind"] == "cubin" || e["kind"] == "ptx"));
        CHECK(e["arch"].get<std::string>().starts_with("sm_"));
        CHECK(e["size"].get<std::uint64_t>() > 0);
        CHECK(e.contains("compressed"));
        REQUIRE(e["kernels"].size() == 5);
    }

    const CliResult human = run_kcache({"inspect-binary", path});
    REQUIRE(human.exit_code == 0);
    CHECK_THAT(human.out, Catch::StartsWith(path + ": fatbin, 3 entries\nentry 0: "));
    CHECK_THAT(human.out, Catch::Contains("  kernel by_value: 5 params, 56 bytes\n"));
}

TEST_CASE("inspect-binary: files that are not binaries", "[loader][cli]") {
    TempDir dir;
    const std::string text = (dir / "notes.txt").string();
    write_file(text, "just some text\n");
    CliResult r = run_kcache({"inspect-binary", text, "--json"});
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK(r.err == "kcache: " + text +
                       ": not a cubin, fatbin or PTX file (text without a .version directive)\n");

    const std::string broken = (dir / "broken.cubin").string();
    write_file(broken, axpy_cubin().substr(0, 200));
    r = run_kcache({"inspect-binary", broken});
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::StartsWith("kcache: " + broken + ": cubin: "));

    r = run_kcache({"inspect-binary", (dir / "missing").string()});
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("No such file or directory"));

    r = run_kcache({"inspect-binary"});
    CHECK(r.exit_code == 2);
}

}  // namespace kcache::test
