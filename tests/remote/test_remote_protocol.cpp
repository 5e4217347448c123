// The shared tier's pure parts: URLs, passwords, keys, and decoding of hostile values.

#include <cstdlib>

#include <fmt/core.h>
#include <catch2/catch.hpp>

#include "kcache/remote/remote.hpp"
#include "protocol.hpp"
#include "redis_fixture.hpp"

namespace remote = kcache::remote;
namespace proto = kcache::remote::proto;
namespace core = kcache::core;

TEST_CASE("remote URLs: redis:// and unix: forms, canonical ids, passwords refused", "[remote]") {
    auto tcp = remote::parse_endpoint("redis://ro@10.0.0.5:6380/2");
    REQUIRE(tcp);
    CHECK(!tcp->unix_socket);
    CHECK(tcp->host == "10.0.0.5");
    CHECK(tcp->port == 6380);
    CHECK(tcp->db == 2);
    CHECK(tcp->user == "ro");
    CHECK(tcp->id() == "redis://10.0.0.5:6380/2");  // no user: every node shards alike

    auto plain = remote::parse_endpoint("redis://cache");
    REQUIRE(plain);
    CHECK(plain->port == 6379);
    CHECK(plain->db == 0);
    auto v6 = remote::parse_endpoint("redis://[::1]:7000");
    REQUIRE(v6);
    CHECK(v6->host == "::1");
    CHECK(v6->id() == "redis://[::1]:7000/0");

    auto sock = remote::parse_endpoint("unix:/run/redis/redis.sock?db=3&user=writer");
    REQUIRE(sock);
    CHECK(sock->unix_socket);
    CHECK(sock->path == "/run/redis/redis.sock");
    CHECK(sock->db == 3);
    CHECK(sock->user == "writer");
    CHECK(remote::parse_endpoint("unix:///tmp/r.sock")->path == "/tmp/r.sock");

    auto secret = remote::parse_endpoint("redis://user:hunter2@host:6379");
    REQUIRE(!secret);
    CHECK(secret.error().code == EINVAL);
    CHECK(secret.error().message.find("hunter2") == std::string::npos);
    CHECK(!remote::parse_endpoint("unix:/s?password=hunter2"));
    for (const char* bad :
         {"http://host", "redis://", "redis://host:0", "redis://host:99999", "redis://host:x",
          "redis://host/db", "unix:relative.sock", "unix:/s?db=x", "redis://[::1"}) {
        INFO(bad);
        CHECK(!remote::parse_endpoint(bad));
    }
}

TEST_CASE("remote passwords come from a variable or a file and never show in errors", "[remote]") {
    kcache::test::TempDir dir;
    kcache::test::write_file(dir / "pw", "s3cret\nignored\n");
    CHECK(remote::load_password("", (dir / "pw").string()).value() == "s3cret");
    setenv("KCACHE_TEST_PW", "fromenv", 1);
    CHECK(remote::load_password("KCACHE_TEST_PW", "").value() == "fromenv");
    unsetenv("KCACHE_TEST_PW");
    CHECK(!remote::load_password("KCACHE_TEST_PW", ""));
    CHECK(!remote::load_password("", (dir / "missing").string()));
    CHECK(remote::load_password("", "").value().empty());
}

TEST_CASE("remote options and job tags are validated", "[remote]") {
    remote::Options o;
    CHECK(!remote::validate(o));  // no server
    o.servers.push_back(*remote::parse_endpoint("redis://h"));
    CHECK(remote::validate(o));
    o.ns = "a b";
    CHECK(!remote::validate(o));
    o.ns = "team.x-1";
    o.op_timeout_ns = 0;
    CHECK(!remote::validate(o));
    CHECK(remote::validate_job_tag("job-42:run.1"));
    CHECK(!remote::validate_job_tag(""));
    CHECK(!remote::validate_job_tag("a b"));
    CHECK(!remote::validate_job_tag(std::string(129, 'a')));
}

TEST_CASE("remote keys are versioned and namespaced", "[remote]") {
    const core::Digest d = core::digest_of("x");
    const std::string tag = fmt::format("{{{:016x}}}", core::digest_of("triton/ABC").low);
    CHECK(proto::manifest_key("ns", "triton/ABC") == "kc2:ns:m:" + tag + ":triton/ABC");
    CHECK(proto::lease_key("ns", "triton/ABC") == "kc2:ns:l:" + tag + ":triton/ABC");
    CHECK(proto::blob_key("ns", d) == "kc2:ns:b:{" + d.hex() + "}");
    CHECK(proto::chunk_key("ns", d, 3) == "kc2:ns:c:{" + d.hex() + "}:3");
    CHECK(proto::job_key("ns", "j1") == "kc2:ns:j:j1");
    CHECK(proto::chunk_count(0) == 0);
    CHECK(proto::chunk_count(1) == 1);
    CHECK(proto::chunk_count(proto::kChunkBytes) == 1);
    CHECK(proto::chunk_count(proto::kChunkBytes + 1) == 2);
}

namespace {

proto::Manifest sample_manifest() {
    proto::Manifest m;
    m.name = "triton/4FD1E3QZ7KXAB2M";
    m.kind = core::EntryKind::node;
    m.dir_mode = 0755;
    m.producer = core::Producer::triton;
    m.writer = "node-a";
    m.created_ns = 12345;
    proto::Node sub;
    sub.path = "sub";
    sub.type = core::FileType::directory;
    sub.mode = 0700;
    m.files.push_back(sub);
    proto::Node small;
    small.path = "sub/kernel.json";
    small.mode = 0644;
    small.content = "{\"name\": \"k\"}";
    small.size = small.content.size();
    small.digest = core::digest_of(small.content);
    small.has_content = true;
    m.files.push_back(small);
    proto::Node big;
    big.path = "kernel.cubin";
    big.mode = 0644;
    big.size = 100000;
    big.digest = core::digest_of("whatever");
    m.files.push_back(big);
    proto::Node link;
    link.path = "latest";
    link.type = core::FileType::symlink;
    link.mode = 0777;
    link.target = "kernel.cubin";
    m.files.push_back(link);
    return m;
}

}  // namespace

TEST_CASE("manifests round-trip and every damaged form is refused", "[remote]") {
    const proto::Manifest m = sample_manifest();
    const std::string value = proto::encode(m);
    auto back = proto::decode_manifest(value);
    REQUIRE(back);
    CHECK(back->name == m.name);
    CHECK(back->producer == core::Producer::triton);
    CHECK(back->writer == "node-a");
    REQUIRE(back->files.size() == 4);
    CHECK(back->files[1].content == m.files[1].content);
    CHECK(back->files[1].has_content);
    CHECK(!back->files[2].has_content);
    CHECK(back->files[2].digest == m.files[2].digest);
    CHECK(back->files[3].target == "kernel.cubin");

    // Every truncation and every flipped byte is EBADMSG, never a crash.
    for (std::size_t n = 0; n < value.size(); ++n) {
        auto cut = proto::decode_manifest(value.substr(0, n));
        CHECK(!cut);
        if (!cut) CHECK(cut.error().code == EBADMSG);
        std::string flipped = value;
        flipped[n] = static_cast<char>(flipped[n] ^ 0x20);
        CHECK(!proto::decode_manifest(flipped));
    }
    CHECK(!proto::decode_manifest(value + "x"));

    // An inlined file whose bytes do not match its digest is refused even with a valid checksum.
    proto::Manifest lying = m;
    lying.files[1].content[0] = 'X';
    CHECK(!proto::decode_manifest(proto::encode(lying)));
}

TEST_CASE("blob headers and chunks are bounds-checked", "[remote]") {
    const std::string header = proto::encode(proto::BlobHeader{3 * proto::kChunkBytes + 1, 4});
    auto h = proto::decode_blob_header(header);
    REQUIRE(h);
    CHECK(h->chunks == 4);
    CHECK(!proto::decode_blob_header(
        proto::encode(proto::BlobHeader{10, 2})));  // count does not fit the size
    CHECK(!proto::decode_blob_header(header.substr(0, header.size() - 1)));

    const std::string text(proto::kChunkBytes, 'a');                 // compresses: zstd
    const std::string random = kcache::test::random_bytes(1000, 7);  // does not: raw
    for (const std::string* raw : {&text, &random}) {
        const std::string chunk = proto::encode_chunk(*raw);
        std::string out = "prefix";
        REQUIRE(proto::decode_chunk(chunk, raw->size(), out));
        CHECK(out == "prefix" + *raw);
        std::string again;
        CHECK(
            !proto::decode_chunk(chunk, raw->size() - 1, again));  // the caller's length must match
        CHECK(again.empty());
        for (std::size_t n = 0; n < std::min<std::size_t>(chunk.size(), 64); ++n) {
            std::string cut;
            CHECK(!proto::decode_chunk(chunk.substr(0, n), raw->size(), cut));
        }
    }
    // A chunk that claims more than a chunk's raw bytes is refused before any allocation.
    std::string huge = proto::encode_chunk("abc");
    huge[1] = huge[2] = huge[3] = huge[4] = '\xff';
    std::string out;
    CHECK(!proto::decode_chunk(huge, 3, out));
}
