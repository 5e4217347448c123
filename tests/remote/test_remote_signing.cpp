// Signed entries (issue 32, items 1 and 5): a push signs its manifest, a pull verifies
// the signature against the trust file and every file's SHA-256 before it writes, and
// each poisoning (a manifest tampered after signing, one replayed under another name or
// namespace, a file swapped under a valid manifest, an unsigned entry, an untrusted key,
// a revoked key) is a miss with its cause counted and nothing written to the db.

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "kcache/remote/trust.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

using kcache::test::RedisServer;
using kcache::test::run_cli;
using kcache::test::TempDir;
using kcache::test::TestDb;
namespace core = kcache::core;
namespace proto = kcache::remote::proto;
namespace remote = kcache::remote;

namespace {

const std::string kTriton = "triton/4FD1E3QZ7KXAB2MC5N6P7Q8R9S0T1U2V3W4X5Y6Z7A8B9C0D1E2F";
const std::string kOther = "triton/9ZZ1E3QZ7KXAB2MC5N6P7Q8R9S0T1U2V3W4X5Y6Z7A8B9C0D1E2F";

// A Triton-shaped entry under `name`: inline files, a blob of two chunks, a symlink.
void add_entry(TestDb& db, const std::string& name, std::uint32_t seed = 1) {
    db.put(name + "/kernel.cubin",
           kcache::test::random_bytes(proto::kChunkBytes + 1000, seed));  // a blob
    db.put(name + "/kernel.json", "{\"name\": \"kernel\", \"num_warps\": 4}\n");
    db.put(name + "/launcher.so",
           "\x7f"
           "ELF small launcher",
           0755);
    db.put(name + "/empty", "");
    db.symlink(name + "/current", "kernel.cubin");
}

// Key files and trust files in a private directory (mode 0700, this user's).
struct Keys {
    TempDir dir;
    std::string key_file(const remote::SigningKey& key, const std::string& name) {
        const std::string path = (dir / (name + ".key")).string();
        REQUIRE(key.save(path));
        return path;
    }
    std::string trust_file(const std::vector<remote::TrustedKey>& keys,
                           const std::string& name = "trusted-keys") {
        const std::string path = (dir / name).string();
        ::unlink(path.c_str());
        remote::TrustFile t;
        t.keys = keys;
        REQUIRE(remote::save_trust_file(path, t));
        return path;
    }
};

remote::SigningKey new_key() {
    auto key = remote::SigningKey::generate();
    REQUIRE(key);
    return std::move(*key);
}

std::unique_ptr<remote::Remote> make_remote(const RedisServer& redis, const std::string& ns,
                                            const std::string& signing_key = {},
                                            const std::string& trusted_keys = {}) {
    auto o = kcache::test::fast_failing_options(redis);
    o.ns = ns;
    o.signing_key = signing_key;
    o.trusted_keys = trusted_keys;
    auto r = remote::Remote::create(std::move(o));
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r);
    return std::move(*r);
}

remote::EntryResult pull(remote::Remote& r, TestDb& db, const std::string& name) {
    auto result = r.pull(db.store(), name);
    INFO((result ? result->detail : result.error().message));
    REQUIRE(result);
    return *result;
}

proto::Manifest read_manifest(RedisServer& redis, const std::string& ns, const std::string& name) {
    const auto value = redis.command({"GET", proto::manifest_key(ns, name)});
    REQUIRE(value.type == remote::Reply::Type::string);
    auto m = proto::decode_manifest(value.str);
    REQUIRE(m);
    return *m;
}

void write_manifest(RedisServer& redis, const std::string& ns, const std::string& name,
                    const proto::Manifest& m) {
    CHECK(redis.command({"SET", proto::manifest_key(ns, name), proto::encode(m)}).is_ok());
}

// The poisoning's common end: a miss with its cause, counted, and nothing in the db.
void check_refused(remote::Remote& r, TestDb& db, const std::string& name, remote::Rejection why,
                   core::Counter counter) {
    const auto result = pull(r, db, name);
    INFO(result.detail);
    CHECK(result.outcome == remote::Outcome::rejected);
    CHECK(result.rejection == why);
    CHECK(result.detail.starts_with(std::string(remote::rejection_name(why))));
    CHECK_FALSE(db.has_entry(name));
    CHECK(db.entries() == 0);
    REQUIRE(remote::record_counts(db.store(), r.counts()));
    CHECK(db.counter(counter) == 1);
    CHECK(db.counter(core::Counter::remote_hits) == 0);
}

}  // namespace

TEST_CASE("trust: keys, public key text, trust file format and signatures", "[remote][trust]") {
    const remote::SigningKey key = new_key();
    const remote::PublicKey pub = key.public_key();
    CHECK(pub.text().starts_with("kcache-ed25519:"));
    CHECK(pub.id().size() == 16);
    auto parsed = remote::parse_public_key(pub.text());
    REQUIRE(parsed);
    CHECK(*parsed == pub);
    CHECK_FALSE(remote::parse_public_key("kcache-ed25519:short"));
    CHECK_FALSE(remote::parse_public_key("ssh-ed25519 AAAA"));

    const std::string sig = key.sign("message");
    CHECK(sig.size() == remote::kSignatureBytes);
    CHECK(remote::verify_signature(pub, "message", sig));
    CHECK_FALSE(remote::verify_signature(pub, "messagE", sig));
    CHECK_FALSE(remote::verify_signature(new_key().public_key(), "message", sig));

    remote::TrustFile t;
    t.keys.push_back({pub, "ci job", false});
    t.keys.push_back({new_key().public_key(), "", true});
    auto back = remote::parse_trust_file(remote::format_trust_file(t));
    REQUIRE(back);
    REQUIRE(back->keys.size() == 2);
    CHECK(back->keys[0].name == "ci job");
    CHECK_FALSE(back->keys[0].revoked);
    CHECK(back->keys[1].revoked);
    auto bad = remote::parse_trust_file("trust kcache-ed25519:nope\n");
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.find("line 1") != std::string::npos);
    CHECK_FALSE(remote::parse_trust_file("allow " + pub.text() + "\n"));
    CHECK_FALSE(remote::parse_trust_file("trust " + pub.text() + "\nrevoke " + pub.text()));

    // A private key others may read is refused, as ssh refuses one.
    Keys keys;
    const std::string path = keys.key_file(key, "k");
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    auto loaded = remote::SigningKey::load(path);
    REQUIRE(loaded);
    CHECK(loaded->public_key() == pub);
    REQUIRE(::chmod(path.c_str(), 0644) == 0);
    auto refused = remote::SigningKey::load(path);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == EACCES);
}

TEST_CASE("trust: a trust file others may write or own is refused", "[remote][trust]") {
    RedisServer redis;
    Keys keys;
    const std::string path = keys.trust_file({{new_key().public_key(), "a", false}});
    CHECK(remote::check_trust_file(path));
    auto open_with = [&]() {
        auto o = kcache::test::fast_failing_options(redis);
        o.trusted_keys = path;
        return remote::Remote::create(std::move(o));
    };
    CHECK(open_with());

    REQUIRE(::chmod(path.c_str(), 0646) == 0);  // world-writable
    auto world = open_with();
    REQUIRE_FALSE(world);
    CHECK(world.error().code == EACCES);
    CHECK(world.error().message.find("writable by group or others") != std::string::npos);
    REQUIRE(::chmod(path.c_str(), 0664) == 0);  // group-writable
    CHECK_FALSE(open_with());
    REQUIRE(::chmod(path.c_str(), 0644) == 0);
    CHECK(open_with());

    // Its directory: others must not be able to replace the file.
    REQUIRE(::chmod(keys.dir.str().c_str(), 0777) == 0);
    auto dir = open_with();
    REQUIRE_FALSE(dir);
    CHECK(dir.error().message.find("directory") != std::string::npos);
    REQUIRE(::chmod(keys.dir.str().c_str(), 0700) == 0);

    if (::geteuid() == 0) {  // another owner (only root can give a file away)
        REQUIRE(::chown(path.c_str(), 4321, 4321) == 0);
        auto other = open_with();
        REQUIRE_FALSE(other);
        CHECK(other.error().message.find("uid 4321") != std::string::npos);
    }
}

TEST_CASE("signed entries: a signed push is pulled verified and remembers its signer",
          "[remote][trust]") {
    RedisServer redis;
    Keys keys;
    const remote::SigningKey key = new_key();
    const std::string key_file = keys.key_file(key, "node-a");
    const std::string trust = keys.trust_file({{key.public_key(), "node-a", false}});
    TestDb a, b;
    add_entry(a, kTriton);

    auto pusher = make_remote(redis, "t", key_file);
    auto pushed = pusher->push(a.store(), kTriton);
    REQUIRE(pushed);
    CHECK(pushed->outcome == remote::Outcome::uploaded);
    CHECK(pushed->signer == key.public_key().id());
    const auto value = redis.command({"GET", proto::manifest_key("t", kTriton)});
    CHECK(value.str.starts_with("KCM2"));
    const proto::Manifest m = read_manifest(redis, "t", kTriton);
    REQUIRE(m.signature);
    CHECK(m.signature->sha256.size() == 4);  // the regular files

    auto puller = make_remote(redis, "t", {}, trust);
    CHECK(puller->verifying());
    const auto result = pull(*puller, b, kTriton);
    CHECK(result.outcome == remote::Outcome::pulled);
    CHECK(result.signer == key.public_key().id());
    CHECK(b.snapshot(kTriton) == a.snapshot(kTriton));
    {
        auto txn = b.store().read();
        REQUIRE(txn);
        auto entry = txn->find_entry(kTriton);
        REQUIRE(entry);
        CHECK(core::is_fleet_entry(*entry));
        CHECK(remote::signer_of(*entry) == key.public_key().id());
    }
    REQUIRE(remote::record_counts(b.store(), puller->counts()));
    CHECK(b.counter(core::Counter::remote_hits) == 1);
    CHECK(b.counter(core::Counter::remote_rejected_bad) == 0);

    // `kcache show` names the signer; `kcache evict --signer` removes what it signed.
    add_entry(b, "triton/LOCALKERNEL0000000000000000000000000000000000000", 9);
    b.close();
    auto show = run_cli({"--db", b.path(), "show", kTriton});
    INFO(show.out << show.err);
    CHECK(show.exit_code == 0);
    CHECK(show.out.find("signer") != std::string::npos);
    CHECK(show.out.find(key.public_key().id()) != std::string::npos);
    auto bad_id = run_cli({"--db", b.path(), "evict", "--signer", "nothex"});
    CHECK(bad_id.exit_code == 2);
    auto evict = run_cli({"--db", b.path(), "evict", "--signer", key.public_key().id()});
    INFO(evict.out << evict.err);
    CHECK(evict.exit_code == 0);
    CHECK(evict.out.find("evicted 1 entry signed by") != std::string::npos);
    CHECK_FALSE(b.has_entry(kTriton));
    CHECK(b.has_entry("triton/LOCALKERNEL0000000000000000000000000000000000000"));
}

TEST_CASE("signed entries: without a trust file everything is accepted as before",
          "[remote][trust]") {
    RedisServer redis;
    TestDb a, b;
    add_entry(a, kTriton);
    auto pusher = make_remote(redis, "t");
    REQUIRE(pusher->push(a.store(), kTriton));
    CHECK(redis.command({"GET", proto::manifest_key("t", kTriton)}).str.starts_with("KCM1"));
    auto puller = make_remote(redis, "t");
    CHECK_FALSE(puller->verifying());
    const auto result = pull(*puller, b, kTriton);
    CHECK(result.outcome == remote::Outcome::pulled);
    CHECK(result.signer.empty());
    CHECK(b.snapshot(kTriton) == a.snapshot(kTriton));
}

TEST_CASE("poisoning: unsigned, untrusted and revoked entries are misses, nothing written",
          "[remote][trust][poison]") {
    RedisServer redis;
    Keys keys;
    const remote::SigningKey trusted = new_key(), stranger = new_key(), revoked = new_key();
    const std::string trust = keys.trust_file(
        {{trusted.public_key(), "ci", false}, {revoked.public_key(), "old node", true}});
    TestDb a;
    add_entry(a, kTriton);

    SECTION("unsigned") {
        REQUIRE(make_remote(redis, "t")->push(a.store(), kTriton));
        TestDb b;
        auto puller = make_remote(redis, "t", {}, trust);
        check_refused(*puller, b, kTriton, remote::Rejection::unsigned_entry,
                      core::Counter::remote_rejected_unsigned);
        // `kcache why` names the cause, though nothing of the entry is in the db.
        b.close();
        auto why = run_cli({"--db", b.path(), "why", kTriton});
        INFO(why.out << why.err);
        CHECK(why.exit_code == 0);
        CHECK(why.out.find("refused") != std::string::npos);
        CHECK(why.out.find("unsigned") != std::string::npos);
        auto why_json = run_cli({"--db", b.path(), "why", kTriton, "--json"});
        CHECK(why_json.out.find("\"remote_rejected\"") != std::string::npos);
        // Left in Redis: a node that trusts unsigned entries still reads it.
        CHECK(redis.command({"EXISTS", proto::manifest_key("t", kTriton)}).integer == 1);
    }
    SECTION("untrusted key") {
        REQUIRE(make_remote(redis, "t", keys.key_file(stranger, "s"))->push(a.store(), kTriton));
        TestDb b;
        auto puller = make_remote(redis, "t", {}, trust);
        check_refused(*puller, b, kTriton, remote::Rejection::untrusted,
                      core::Counter::remote_rejected_untrusted);
    }
    SECTION("revoked key") {
        REQUIRE(make_remote(redis, "t", keys.key_file(revoked, "r"))->push(a.store(), kTriton));
        TestDb b;
        auto puller = make_remote(redis, "t", {}, trust);
        check_refused(*puller, b, kTriton, remote::Rejection::revoked,
                      core::Counter::remote_rejected_revoked);
        // Compiled here since: `kcache why` tells the miss and that the tier refused it.
        add_entry(b, kTriton, 5);
        b.close();
        auto why = run_cli({"--db", b.path(), "why", "--classify", kTriton});
        INFO(why.out << why.err);
        CHECK(why.exit_code == 0);
        CHECK(why.out.find("revoked") != std::string::npos);
    }
}

TEST_CASE(
    "poisoning: a manifest altered after signing, replayed or with a file swapped is a "
    "miss, nothing written",
    "[remote][trust][poison]") {
    RedisServer redis;
    Keys keys;
    const remote::SigningKey key = new_key();
    const std::string key_file = keys.key_file(key, "ci");
    const std::string trust = keys.trust_file({{key.public_key(), "ci", false}});
    TestDb a;
    add_entry(a, kTriton);
    add_entry(a, kOther, 2);
    auto pusher = make_remote(redis, "t", key_file);
    REQUIRE(pusher->push(a.store(), kTriton));
    REQUIRE(pusher->push(a.store(), kOther));
    const proto::Manifest m = read_manifest(redis, "t", kTriton);
    auto file = [](proto::Manifest& man, const std::string& path) -> proto::Node& {
        for (proto::Node& n : man.files) {
            if (n.path == path) return n;
        }
        FAIL("no file " << path);
        return man.files.front();
    };
    TestDb b;
    auto puller = make_remote(redis, "t", {}, trust);

    SECTION("tampered after signing: a file's mode") {
        proto::Manifest evil = m;
        file(evil, "kernel.json").mode = 04755;  // set-uid: the signed mode was 0644
        write_manifest(redis, "t", kTriton, evil);
        check_refused(*puller, b, kTriton, remote::Rejection::bad,
                      core::Counter::remote_rejected_bad);
    }
    SECTION("tampered after signing: a symlink's target") {
        proto::Manifest evil = m;
        file(evil, "current").target = "launcher.so";
        write_manifest(redis, "t", kTriton, evil);
        check_refused(*puller, b, kTriton, remote::Rejection::bad,
                      core::Counter::remote_rejected_bad);
    }
    SECTION("a valid manifest replayed under another entry name") {
        proto::Manifest evil = m;
        evil.name = kOther;  // what the puller asks for, so check_manifest passes
        write_manifest(redis, "t", kOther, evil);
        check_refused(*puller, b, kOther, remote::Rejection::bad,
                      core::Counter::remote_rejected_bad);
    }
    SECTION("a valid manifest replayed under another namespace") {
        // Byte for byte, with its blobs, into namespace "u".
        const auto value = redis.command({"GET", proto::manifest_key("t", kTriton)});
        CHECK(redis.command({"SET", proto::manifest_key("u", kTriton), value.str}).is_ok());
        for (const proto::Node& n : m.files) {
            if (n.type != core::FileType::regular || n.has_content || n.size == 0) continue;
            const auto h = redis.command({"GET", proto::blob_key("t", n.digest)});
            CHECK(redis.command({"SET", proto::blob_key("u", n.digest), h.str}).is_ok());
            for (std::uint32_t i = 0; i < proto::chunk_count(n.size); ++i) {
                const auto c = redis.command({"GET", proto::chunk_key("t", n.digest, i)});
                CHECK(redis.command({"SET", proto::chunk_key("u", n.digest, i), c.str}).is_ok());
            }
        }
        auto other_ns = make_remote(redis, "u", {}, trust);
        check_refused(*other_ns, b, kTriton, remote::Rejection::bad,
                      core::Counter::remote_rejected_bad);
    }
    SECTION("a file swapped under a valid manifest: inline content") {
        // Same size, its XXH3 digest made to match (a digest names, it does not bind):
        // only the signed SHA-256 tells.
        proto::Manifest evil = m;
        proto::Node& n = file(evil, "launcher.so");
        REQUIRE(n.has_content);
        n.content =
            "\x7f"
            "ELF EVIL! launcher";
        REQUIRE(n.content.size() == n.size);
        n.digest = core::digest_of(n.content);
        write_manifest(redis, "t", kTriton, evil);
        check_refused(*puller, b, kTriton, remote::Rejection::bad,
                      core::Counter::remote_rejected_bad);
    }
    SECTION("a file swapped under a valid manifest: a blob") {
        proto::Manifest evil = m;
        proto::Node& n = file(evil, "kernel.cubin");
        REQUIRE_FALSE(n.has_content);
        const std::string other = kcache::test::random_bytes(n.size, 77);
        n.digest = core::digest_of(other);
        const std::uint32_t chunks = proto::chunk_count(other.size());
        for (std::uint32_t i = 0; i < chunks; ++i) {
            const std::string raw =
                other.substr(std::size_t{i} * proto::kChunkBytes, proto::kChunkBytes);
            CHECK(
                redis.command({"SET", proto::chunk_key("t", n.digest, i), proto::encode_chunk(raw)})
                    .is_ok());
        }
        CHECK(redis
                  .command({"SET", proto::blob_key("t", n.digest),
                            proto::encode(proto::BlobHeader{other.size(), chunks})})
                  .is_ok());
        write_manifest(redis, "t", kTriton, evil);
        check_refused(*puller, b, kTriton, remote::Rejection::bad,
                      core::Counter::remote_rejected_bad);
    }
    SECTION("a signature stripped from a signed manifest") {
        proto::Manifest evil = m;
        evil.signature.reset();
        write_manifest(redis, "t", kTriton, evil);
        check_refused(*puller, b, kTriton, remote::Rejection::unsigned_entry,
                      core::Counter::remote_rejected_unsigned);
    }
    SECTION("and the untouched entry pulls") {
        const auto result = pull(*puller, b, kTriton);
        CHECK(result.outcome == remote::Outcome::pulled);
        CHECK(b.snapshot(kTriton) == a.snapshot(kTriton));
    }
}

TEST_CASE("poisoning: without a trust file a signed manifest is still checked against its key",
          "[remote][trust][poison]") {
    RedisServer redis;
    Keys keys;
    const remote::SigningKey key = new_key();
    TestDb a, b;
    add_entry(a, kTriton);
    REQUIRE(make_remote(redis, "t", keys.key_file(key, "k"))->push(a.store(), kTriton));
    proto::Manifest evil = read_manifest(redis, "t", kTriton);
    evil.files.back().mode = 0777;
    write_manifest(redis, "t", kTriton, evil);
    auto puller = make_remote(redis, "t");
    check_refused(*puller, b, kTriton, remote::Rejection::bad, core::Counter::remote_rejected_bad);
}

TEST_CASE("protocol: signed manifests round-trip, a bad signature section is corrupt",
          "[remote][trust]") {
    proto::Manifest m;
    m.name = "triton/ABC";
    m.writer = "host";
    proto::Node f;
    f.path = "a.json";
    f.mode = 0644;
    f.size = 2;
    f.content = "{}";
    f.has_content = true;
    f.digest = core::digest_of(f.content);
    m.files.push_back(f);
    CHECK(proto::encode(m).starts_with("KCM1"));
    auto unsigned_back = proto::decode_manifest(proto::encode(m));
    REQUIRE(unsigned_back);
    CHECK_FALSE(unsigned_back->signature);

    m.signature =
        proto::Signature{std::string(32, 'k'), std::string(64, 's'), {remote::sha256("{}")}};
    const std::string value = proto::encode(m);
    CHECK(value.starts_with("KCM2"));
    auto back = proto::decode_manifest(value);
    REQUIRE(back);
    REQUIRE(back->signature);
    CHECK(back->signature->key == m.signature->key);
    CHECK(back->signature->signature == m.signature->signature);
    CHECK(back->signature->sha256 == m.signature->sha256);
    auto statement = proto::signed_statement("ns", *back);
    REQUIRE(statement);
    CHECK(*statement != *proto::signed_statement("other", *back));

    // A SHA-256 count that is not the regular file count is corrupt.
    m.signature->sha256.push_back(remote::sha256("x"));
    auto wrong = proto::decode_manifest(proto::encode(m));
    REQUIRE_FALSE(wrong);
    CHECK(wrong.error().code == EBADMSG);
    CHECK_FALSE(proto::signed_statement("ns", m));
}

TEST_CASE("signed push: replaces a manifest its own policy refuses, keeps one it accepts",
          "[remote][trust]") {
    RedisServer redis;
    Keys keys;
    const remote::SigningKey first = new_key(), second = new_key();
    const std::string first_key = keys.key_file(first, "first");
    const std::string second_key = keys.key_file(second, "second");
    const std::string both = keys.trust_file(
        {{first.public_key(), "first", false}, {second.public_key(), "second", false}}, "both");
    TestDb a;
    add_entry(a, kTriton);
    auto signer_of_manifest = [&] {
        const proto::Manifest m = read_manifest(redis, "t", kTriton);
        REQUIRE(m.signature);
        return m.signature->key;
    };
    auto raw = [](const remote::SigningKey& k) {
        return std::string(reinterpret_cast<const char*>(k.public_key().raw.data()), 32);
    };

    // An unsigned manifest got there first: a signed push replaces it.
    REQUIRE(make_remote(redis, "t")->push(a.store(), kTriton));
    auto replaced = make_remote(redis, "t", first_key, both)->push(a.store(), kTriton);
    REQUIRE(replaced);
    CHECK(replaced->outcome == remote::Outcome::uploaded);
    CHECK(signer_of_manifest() == raw(first));
    {
        TestDb b;
        const auto result = pull(*make_remote(redis, "t", {}, both), b, kTriton);
        CHECK(result.outcome == remote::Outcome::pulled);
        CHECK(result.signer == first.public_key().id());
    }

    // A manifest signed by a key the pusher trusts stays: first writer wins.
    auto kept = make_remote(redis, "t", second_key, both)->push(a.store(), kTriton);
    REQUIRE(kept);
    CHECK(kept->outcome == remote::Outcome::already_remote);
    CHECK(signer_of_manifest() == raw(first));

    // Once its key is revoked, a push by a trusted key replaces it.
    const std::string revoked = keys.trust_file(
        {{first.public_key(), "first", true}, {second.public_key(), "second", false}}, "revoked");
    auto again = make_remote(redis, "t", second_key, revoked)->push(a.store(), kTriton);
    REQUIRE(again);
    CHECK(again->outcome == remote::Outcome::uploaded);
    CHECK(signer_of_manifest() == raw(second));
    TestDb c;
    CHECK(pull(*make_remote(redis, "t", {}, revoked), c, kTriton).outcome ==
          remote::Outcome::pulled);
}
