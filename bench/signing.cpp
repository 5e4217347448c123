// Signed entries (issue 32): what signing costs a push and verifying costs a pull, against
// the push's and the pull's own time, measured in one run on one redis-server this program
// starts (a Unix socket in a temp dir, no persistence).
//
// Triton-shaped entries (a cubin, its PTX, JSON metadata, a small launcher) are written
// into a db, then for each of several rounds:
//   push     the entries pushed unsigned (namespace u<i>), then signed (namespace s<i>)
//   pull     each namespace pulled into a fresh db: unsigned with no trust file, signed
//            with a trust file naming the key (every signature and SHA-256 checked)
// and, apart from Redis, the cryptography alone on the same entries: per entry the
// SHA-256 of every file plus one Ed25519 signature (what a push adds) and one Ed25519
// verification plus the SHA-256s (what a pull adds). The figures: medians per entry,
// and the crypto's share of an unsigned push's and pull's time (the goal: <= 2%).
//
//   kcache-bench-signing [--entries N] [--rounds R] [--cubin-kib K]
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "bench_support.hpp"
#include "kcache/remote/remote.hpp"
#include "kcache/remote/trust.hpp"
#include "protocol.hpp"

namespace core = kcache::core;
namespace remote = kcache::remote;
namespace proto = kcache::remote::proto;
using namespace kcache::bench;

namespace {

std::unique_ptr<core::Store> open_db(const std::filesystem::path& path) {
    core::OpenOptions o;
    o.path = path.string();
    o.durability = core::Durability::none;  // the figures are of Redis and crypto, not fsync
    return must(core::Store::open(o), "open db");
}

pid_t start_redis(const std::filesystem::path& dir) {
    const std::string socket = (dir / "redis.sock").string();
    const pid_t pid = fork();
    if (pid == 0) {
        const int null = open("/dev/null", O_RDWR);
        dup2(null, STDOUT_FILENO);
        execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", socket.c_str(),
               "--save", "", "--appendonly", "no", "--dir", dir.c_str(), nullptr);
        _exit(127);
    }
    for (int i = 0; i < 250 && access(socket.c_str(), F_OK) != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (access(socket.c_str(), F_OK) != 0) {
        std::fprintf(stderr, "redis-server did not start (is it installed?)\n");
        std::exit(77);
    }
    return pid;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t entries = 200, rounds = 5, cubin_kib = 256;
    CLI::App app{"signed entries: sign and verify cost against push and pull"};
    app.add_option("--entries", entries, "entries per round (default 200)");
    app.add_option("--rounds", rounds, "rounds; medians are reported (default 5)");
    app.add_option("--cubin-kib", cubin_kib, "size of each entry's cubin (default 256 KiB)");
    CLI11_PARSE(app, argc, argv);

    TempDir tmp("kcache-bench-signing");
    const pid_t redis = start_redis(tmp.path());
    remote::Options base;
    base.servers.push_back(
        must(remote::parse_endpoint("unix:" + (tmp / "redis.sock").string()), "endpoint"));
    base.op_timeout_ns = 30'000'000'000;

    // The key, its file and a trust file naming it.
    const auto key = must(remote::SigningKey::generate(), "key");
    const std::string key_file = (tmp / "node.key").string();
    must(key.save(key_file), "save key");
    const std::string trust_file = (tmp / "trusted-keys").string();
    remote::TrustFile trust;
    trust.keys.push_back({key.public_key(), "node", false});
    must(remote::save_trust_file(trust_file, trust), "trust file");

    // The source db.
    auto source = open_db(tmp / "source");
    std::vector<std::string> names;
    std::uint64_t entry_bytes = 0;
    {
        auto txn = must(source->write(), "write");
        for (std::size_t i = 0; i < entries; ++i) {
            const std::string cubin = make_cubin(i, cubin_kib * 1024);
            const std::string ptx = make_ptx(i, 64 * 1024);
            const std::string json = make_json(i, 1024);
            const std::string launcher = make_cubin(i + 1'000'000, 4096);
            const FileSpec files[] = {{"kernel.cubin", cubin},
                                      {"kernel.ptx", ptx},
                                      {"kernel.json", json},
                                      {"launcher.so", launcher}};
            names.push_back(entry_name(i));
            must(put_entry(txn, names.back(), files, core::Origin{1, "bench"}), "put");
            if (i == 0) entry_bytes = cubin.size() + ptx.size() + json.size() + launcher.size();
        }
        must(txn.commit(), "commit");
    }

    // The crypto alone, on the same entries' images.
    std::vector<core::EntryImage> images;
    {
        auto txn = must(source->read(), "read");
        for (const std::string& n : names)
            images.push_back(
                must(core::read_image(txn, must(txn.find_entry(n), "find"), true), "image"));
    }

    std::vector<double> push_u, push_s, pull_u, pull_s, sign_c, verify_c, sha_c, ed_sign_c,
        ed_verify_c;
    for (std::size_t round = 0; round < rounds; ++round) {
        const std::string nu = fmt::format("u{}", round), ns = fmt::format("s{}", round);
        auto time_push = [&](const std::string& space, const std::string& signing) {
            remote::Options o = base;
            o.ns = space;
            o.signing_key = signing;
            auto r = must(remote::Remote::create(o), "remote");
            const auto t0 = SteadyClock::now();
            for (const std::string& n : names) must(r->push(*source, n), "push");
            return seconds_since(t0) / static_cast<double>(entries);
        };
        auto time_pull = [&](const std::string& space, const std::string& trusted) {
            remote::Options o = base;
            o.ns = space;
            o.trusted_keys = trusted;
            auto r = must(remote::Remote::create(o), "remote");
            const auto dir = tmp / fmt::format("pull-{}", space);
            auto db = open_db(dir);
            const auto t0 = SteadyClock::now();
            const auto summary = r->pull_entries(*db, names);
            const double per = seconds_since(t0) / static_cast<double>(entries);
            if (summary.pulled != entries) {
                std::fprintf(stderr, "pulled %llu of %zu\n",
                             static_cast<unsigned long long>(summary.pulled), entries);
                std::exit(1);
            }
            db.reset();
            std::filesystem::remove_all(dir);
            return per;
        };
        push_u.push_back(time_push(nu, ""));
        push_s.push_back(time_push(ns, key_file));
        pull_u.push_back(time_pull(nu, ""));
        pull_s.push_back(time_pull(ns, trust_file));

        // Sign: every file's SHA-256 and one signature; verify: one verification and
        // every SHA-256 again (as pull.cpp does, before writing).
        // (the images copied into manifests first: not timed)
        std::vector<proto::Manifest> signed_manifests(images.size());
        for (std::size_t i = 0; i < images.size(); ++i)
            static_cast<core::EntryImage&>(signed_manifests[i]) = images[i];
        auto t0 = SteadyClock::now();
        for (proto::Manifest& m : signed_manifests) {
            m.signature = proto::Signature{};
            for (const auto& f : m.files) {
                if (f.type == core::FileType::regular)
                    m.signature->sha256.push_back(remote::sha256(f.content));
            }
            m.signature->key.assign(reinterpret_cast<const char*>(key.public_key().raw.data()), 32);
            m.signature->signature = key.sign(must(proto::signed_statement(ns, m), "statement"));
        }
        sign_c.push_back(seconds_since(t0) / static_cast<double>(entries));
        t0 = SteadyClock::now();
        std::size_t good = 0;
        for (const proto::Manifest& m : signed_manifests) {
            bool ok = remote::verify_signature(key.public_key(),
                                               must(proto::signed_statement(ns, m), "statement"),
                                               m.signature->signature);
            std::size_t k = 0;
            for (const auto& f : m.files) {
                if (f.type == core::FileType::regular)
                    ok = ok && remote::sha256(f.content) == m.signature->sha256[k++];
            }
            good += ok ? 1 : 0;
        }
        verify_c.push_back(seconds_since(t0) / static_cast<double>(entries));
        // Their parts: the SHA-256s alone, one Ed25519 signature, one verification.
        t0 = SteadyClock::now();
        std::size_t bytes = 0;
        for (const core::EntryImage& image : images) {
            for (const auto& f : image.files) bytes += remote::sha256(f.content).size();
        }
        sha_c.push_back(seconds_since(t0) / static_cast<double>(entries));
        const std::string statement = must(proto::signed_statement(ns, signed_manifests[0]), "s");
        std::string sig;
        t0 = SteadyClock::now();
        for (std::size_t i = 0; i < entries; ++i) sig = key.sign(statement);
        ed_sign_c.push_back(seconds_since(t0) / static_cast<double>(entries));
        t0 = SteadyClock::now();
        for (std::size_t i = 0; i < entries; ++i)
            good += remote::verify_signature(key.public_key(), statement, sig) ? 0 : 1;
        ed_verify_c.push_back(seconds_since(t0) / static_cast<double>(entries));
        if (good != entries || bytes == 0) {
            std::fprintf(stderr, "verification failed\n");
            std::exit(1);
        }
    }
    kill(redis, SIGTERM);
    waitpid(redis, nullptr, 0);

    const double pu = median(push_u), ps = median(push_s), lu = median(pull_u), ls = median(pull_s),
                 sc = median(sign_c), vc = median(verify_c);
    fmt::print("signed entries: {} entries of {} ({} files), {} rounds, medians per entry\n",
               entries, human_bytes(entry_bytes), 4, rounds);
    fmt::print("{:<34} {:>10}\n", "", "us/entry");
    fmt::print("{:<34} {:>10.1f}\n", "push, unsigned", pu * 1e6);
    fmt::print("{:<34} {:>10.1f}\n", "push, signed", ps * 1e6);
    fmt::print("{:<34} {:>10.1f}\n", "pull, no trust file", lu * 1e6);
    fmt::print("{:<34} {:>10.1f}\n", "pull, verified (trust file)", ls * 1e6);
    fmt::print("{:<34} {:>10.1f}\n", "sign alone (SHA-256s + Ed25519)", sc * 1e6);
    fmt::print("{:<34} {:>10.1f}\n", "verify alone (Ed25519 + SHA-256s)", vc * 1e6);
    const double sha = median(sha_c), eds = median(ed_sign_c), edv = median(ed_verify_c);
    fmt::print("{:<34} {:>10.1f}\n", "  of which SHA-256s", sha * 1e6);
    fmt::print("{:<34} {:>10.1f}\n", "  of which Ed25519 sign", eds * 1e6);
    fmt::print("{:<34} {:>10.1f}\n", "  of which Ed25519 verify", edv * 1e6);
    fmt::print("SHA-256 throughput: {:.0f} MB/s\n", static_cast<double>(entry_bytes) / sha / 1e6);
    fmt::print("\nEd25519 alone / unsigned push {:5.2f}%, / unverified pull {:5.2f}%\n",
               100 * eds / pu, 100 * edv / lu);
    fmt::print("sign / unsigned push     {:6.2f}%   (signed - unsigned push: {:+.2f}%)\n",
               100 * sc / pu, 100 * (ps - pu) / pu);
    fmt::print("verify / unverified pull {:6.2f}%   (verified - unverified pull: {:+.2f}%)\n",
               100 * vc / lu, 100 * (ls - lu) / lu);
    return 0;
}
