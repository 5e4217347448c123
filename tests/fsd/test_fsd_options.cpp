// kcache-fsd's command line: the long options and their -o forms mean the same, and
// sizes and counts parse with core::parse_size. No mount: parse_options alone.
#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "options.hpp"

namespace {

using kcache::core::Durability;
using kcache::fsd::kBatchedSyncIntervalS;
using kcache::fsd::Options;
using Args = std::vector<std::string>;

kcache::core::Result<Options> parse(Args args) {
    args.insert(args.begin(), "kcache-fsd");
    args.push_back("/mnt/kcache");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return kcache::fsd::parse_options(static_cast<int>(argv.size()), argv.data());
}

Options must_parse(const Args& args) {
    auto o = parse(args);
    if (!o) FAIL("parse_options failed: " << o.error().message);
    return *o;
}

}  // namespace

TEST_CASE("options: durability: -o durability= and --durability are the same", "[options]") {
    SECTION("full: every commit synced, no sync timer") {
        for (const auto& args : {Args{"-o", "durability=full"}, Args{"--durability", "full"}}) {
            INFO(args[0] << " " << args[1]);
            const Options o = must_parse(args);
            CHECK(o.durability == Durability::full);
            CHECK(o.sync_interval_s == 0);
        }
    }
    SECTION("batched, the default: unsynced commits, synced by the timer") {
        for (const auto& args :
             {Args{}, Args{"-o", "durability=batched"}, Args{"--durability", "batched"},
              Args{"--durability", "none", "-o", "durability=batched"}}) {
            const Options o = must_parse(args);
            CHECK(o.durability == Durability::none);
            CHECK(o.sync_interval_s == kBatchedSyncIntervalS);
        }
    }
    SECTION("none: unsynced, no timer") {
        for (const auto& args : {Args{"-o", "durability=none"}, Args{"--durability", "none"}}) {
            const Options o = must_parse(args);
            CHECK(o.durability == Durability::none);
            CHECK(o.sync_interval_s == 0);
        }
    }
    SECTION("-o given last wins over the long option, both halves of it") {
        const Options o = must_parse({"--durability", "batched", "-o", "durability=full"});
        CHECK(o.durability == Durability::full);
        CHECK(o.sync_interval_s == 0);
    }
    SECTION("anything else is EINVAL") {
        CHECK(parse({"-o", "durability=sometimes"}).error().code == EINVAL);
        CHECK(parse({"--durability", "sometimes"}).error().code == EINVAL);
    }
}

TEST_CASE("options: counts and sizes parse with units, both forms", "[options]") {
    for (const bool dash_o : {true, false}) {
        INFO((dash_o ? "-o" : "long options"));
        const Args args =
            dash_o ? Args{"-o", "max_entries=1K,entry_depth=3,max_size=1T,max_file_size=512M"}
                   : Args{"--max-entries", "1K", "--entry-depth",   "3",
                          "--max-size",    "1T", "--max-file-size", "512M"};
        const Options o = must_parse(args);
        CHECK(o.max_entries == 1024);
        CHECK(o.entry_depth == 3);
        CHECK(o.max_bytes == std::uint64_t{1} << 40);
        CHECK(o.max_file_size == std::uint64_t{512} << 20);
        CHECK(o.fuse_options.empty());
    }
    CHECK(must_parse({"-o", "max_entries=100000"}).max_entries == 100000);
    CHECK(must_parse({"-o", "max_entries=1.5K"}).max_entries == 1536);
}

TEST_CASE("options: what is not a count or a size is an error naming the option", "[options]") {
    auto e = parse({"-o", "max_entries=lots"});
    REQUIRE_FALSE(e);
    CHECK(e.error().code == EINVAL);
    CHECK_THAT(e.error().message, Catch::Contains("max_entries"));
    CHECK(parse({"--max-entries", "lots"}).error().code == EINVAL);
    CHECK(parse({"-o", "entry_depth="}).error().code == EINVAL);
    // Never truncated to 32 bits (4G + 1 would be depth 1).
    CHECK(parse({"-o", "entry_depth=4294967297"}).error().code == ERANGE);
}

TEST_CASE("options: single flight's bound: -o single_flight_ms= and --single-flight-ms",
          "[options]") {
    CHECK(must_parse({}).single_flight_ms == 2000);  // on by default
    CHECK(must_parse({"-o", "single_flight_ms=500"}).single_flight_ms == 500);
    CHECK(must_parse({"--single-flight-ms", "0"}).single_flight_ms == 0);  // off
    CHECK(must_parse({"-o", "single_flight_ms=0"}).fuse_options.empty());  // ours, not libfuse's
    auto e = parse({"-o", "single_flight_ms=soon"});
    REQUIRE_FALSE(e);
    CHECK_THAT(e.error().message, Catch::Contains("single_flight_ms"));
    CHECK(parse({"-o", "single_flight_ms=3600001"}).error().code == ERANGE);
}

TEST_CASE("options: --remote-lease-ms needs --remote, renews leases by default, 0 turns them off",
          "[options]") {
    using kcache::remote::Options;
    CHECK(must_parse({"--remote", "unix:/run/redis.sock"}).remote->lease_ms ==
          Options::kLeaseRenewed);
    CHECK(must_parse({"--remote", "unix:/run/redis.sock", "--remote-lease-ms", "auto"})
              .remote->lease_ms == Options::kLeaseRenewed);
    CHECK(must_parse({"--remote", "unix:/run/redis.sock", "--remote-lease-ms", "0"})
              .remote->lease_ms == 0);
    // A read-only node takes no lease (it could not write one): a plain miss.
    CHECK(must_parse({"--remote", "unix:/run/redis.sock", "--remote-read-only"}).remote->lease_ms ==
          0);
    CHECK(parse({"--remote", "unix:/run/redis.sock", "--remote-lease-ms", "soon"}).error().code ==
          EINVAL);
    CHECK(must_parse({"--remote", "unix:/run/redis.sock", "--remote-lease-ms", "5000"})
              .remote->lease_ms == 5000);
    CHECK(parse({"--remote-lease-ms", "5000"}).error().code == EINVAL);
    CHECK(
        parse({"--remote", "unix:/run/redis.sock", "--remote-lease-ms", "3600001"}).error().code ==
        ERANGE);
}

TEST_CASE(
    "options: --job-tag and -o job_tag= are the same, validated, and need a writable --remote",
    "[options]") {
    const Args remote = {"--remote", "unix:/run/redis.sock"};
    auto with = [&](Args tail) {
        Args a = remote;
        a.insert(a.end(), tail.begin(), tail.end());
        return a;
    };
    CHECK(must_parse(remote).job_tag.empty());
    CHECK(must_parse(with({"--job-tag", "train-7"})).job_tag == "train-7");
    const Options o = must_parse(with({"-o", "job_tag=train:8,prefetch_job_tag=train-7"}));
    CHECK(o.job_tag == "train:8");
    CHECK(o.prefetch_job_tag == "train-7");
    CHECK(o.fuse_options.empty());  // ours, not libfuse's
    // -o comes last and wins, as for every option.
    CHECK(must_parse(with({"--job-tag", "a", "-o", "job_tag=b"})).job_tag == "b");

    auto bad = parse(with({"-o", "job_tag=has space"}));
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == EINVAL);
    CHECK(bad.error().message.find("job_tag") != std::string::npos);
    CHECK(bad.error().message.find("bad job tag") != std::string::npos);
    CHECK(parse(with({"--job-tag", std::string(129, 'x')})).error().code == EINVAL);
    CHECK(parse(with({"--prefetch-job-tag", "a/b"})).error().code == EINVAL);

    auto no_remote = parse({"--job-tag", "train-7"});
    REQUIRE_FALSE(no_remote);
    CHECK(no_remote.error().message.find("--remote") != std::string::npos);
    auto read_only = parse(with({"--remote-read-only", "--job-tag", "train-7"}));
    REQUIRE_FALSE(read_only);
    CHECK(read_only.error().message.find("--remote-read-only") != std::string::npos);
}

TEST_CASE("options: -o options that are not kcache's go to libfuse", "[options]") {
    const Options o = must_parse({"-o", "allow_other,max_entries=10,noatime"});
    CHECK(o.max_entries == 10);
    CHECK(o.fuse_options == Args{"allow_other", "noatime", "default_permissions"});
}

TEST_CASE("options: --remote takes the CLI's remote options, and refuses what the CLI refuses",
          "[options]") {
    CHECK_FALSE(must_parse({}).remote.has_value());
    const Options o =
        must_parse({"--remote", "unix:/run/redis.sock", "--remote", "redis://10.0.0.2:6380/2",
                    "--remote-namespace", "train", "--remote-timeout", "250ms",
                    "--remote-connect-timeout", "2s", "--remote-read-only"});
    REQUIRE(o.remote.has_value());
    REQUIRE(o.remote->servers.size() == 2);
    CHECK(o.remote->servers[0].unix_socket);
    CHECK(o.remote->servers[1].port == 6380);
    CHECK(o.remote->servers[1].db == 2);
    CHECK(o.remote->ns == "train");
    CHECK(o.remote->op_timeout_ns == 250'000'000);
    CHECK(o.remote->connect_timeout_ns == 2'000'000'000);
    CHECK(o.remote->read_only);

    auto with_password = parse({"--remote", "redis://u:secret@host:6379"});
    REQUIRE_FALSE(with_password);
    CHECK(with_password.error().message.find("secret") == std::string::npos);
    auto bad_deadline = parse({"--remote", "unix:/s", "--remote-timeout", "soon"});
    REQUIRE_FALSE(bad_deadline);
    CHECK(bad_deadline.error().message.find("soon") != std::string::npos);
    auto bad_ns = parse({"--remote", "unix:/s", "--remote-namespace", "a b"});
    REQUIRE_FALSE(bad_ns);
    auto read_only_db = parse({"--remote", "unix:/s", "--read-only"});
    REQUIRE_FALSE(read_only_db);
    CHECK(read_only_db.error().code == EINVAL);
}

TEST_CASE("options: --io-uring and -o io_uring are the same, off by default, and not for libfuse",
          "[options]") {
    CHECK_FALSE(must_parse({}).io_uring);
    CHECK(must_parse({"--io-uring"}).io_uring);
    const Options o = must_parse({"-o", "allow_other,io_uring"});
    CHECK(o.io_uring);
    for (const auto& f : o.fuse_options) CHECK(f != "io_uring");
    auto valued = parse({"-o", "io_uring=1"});
    REQUIRE_FALSE(valued);
    CHECK(valued.error().code == EINVAL);
}

TEST_CASE("options: --help returns the text for main to print, without exiting", "[options]") {
    // parse_options returns a Result: it reports, main decides (no std::exit inside).
    const Options o = must_parse({"--help"});
    CHECK(o.help.find("MOUNTPOINT") != std::string::npos);
    CHECK(o.help.find("--io-uring") != std::string::npos);
    CHECK(must_parse({"--foreground"}).help.empty());
}

TEST_CASE("options: relative paths come back absolute, against the working directory",
          "[options]") {
    // The daemon leaves its working directory when it detaches, and serves statfs from the
    // db's path: a relative --db made df and stat -f on the mount fail with ENOENT.
    const std::string cwd = std::filesystem::current_path().string();
    auto parse_argv = [](Args args) {
        args.insert(args.begin(), "kcache-fsd");
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        return kcache::fsd::parse_options(static_cast<int>(argv.size()), argv.data());
    };
    for (const auto& args : {Args{"--db", "pj/db", "mnt"}, Args{"-o", "db=pj/db", "mnt"},
                             Args{"pj/db", "mnt"}, Args{"--db", "./pj/x/../db", "a/../mnt/"}}) {
        INFO(args[0] << " " << args[1]);
        auto o = parse_argv(args);
        REQUIRE(o);
        CHECK(o->db == cwd + "/pj/db");
        CHECK(o->mountpoint == cwd + "/mnt");
    }
    auto absolute = parse_argv({"--db", "/var/cache/kcache", "/mnt/kcache"});
    REQUIRE(absolute);
    CHECK(absolute->db == "/var/cache/kcache");
    CHECK(absolute->mountpoint == "/mnt/kcache");
}
