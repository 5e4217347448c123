#include "kcache/remote/trust.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/core.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

namespace kcache::remote {

namespace {

struct PkeyFree {
    void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
struct MdCtxFree {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;
struct BioFree {
    void operator()(BIO* b) const { BIO_free(b); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

std::string base64(const unsigned char* data, std::size_t n) {
    std::string out(4 * ((n + 2) / 3) + 1, '\0');
    const int len =
        EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(n));
    out.resize(static_cast<std::size_t>(len));
    return out;
}

Status write_new_file(const std::string& path, std::string_view bytes, mode_t mode) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return core::fail(errno, fmt::format("cannot create {}", path));
    Status s;
    if (::fchmod(fd, mode) != 0 ||
        ::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()) ||
        ::fsync(fd) != 0) {
        s = core::fail(errno, fmt::format("cannot write {}", path));
    }
    ::close(fd);
    if (!s) ::unlink(path.c_str());
    return s;
}

std::string dir_of(const std::string& path) {
    const std::size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

// The trust file's rule for one path (the file, or its directory).
Status check_owner_and_mode(const std::string& path, const struct stat& st, bool dir) {
    const uid_t me = ::geteuid();
    if (st.st_uid != 0 && st.st_uid != me) {
        return core::fail(EACCES,
                          fmt::format("trust file {}{} is owned by uid {}, neither root nor this "
                                      "user (uid {}): refused",
                                      dir ? "directory " : "", path, st.st_uid, me));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        return core::fail(EACCES,
                          fmt::format("trust file {}{} is writable by group or others (mode "
                                      "{:04o}): refused",
                                      dir ? "directory " : "", path, st.st_mode & 07777));
    }
    return {};
}

}  // namespace

std::string sha256(std::string_view data) {
    std::string out(kSha256Bytes, '\0');
    unsigned int n = 0;
    EVP_Digest(data.data(), data.size(), reinterpret_cast<unsigned char*>(out.data()), &n,
               EVP_sha256(), nullptr);
    return out;
}

std::string PublicKey::text() const {
    return std::string(kPublicKeyPrefix) + base64(raw.data(), raw.size());
}

std::string PublicKey::id() const {
    const std::string digest =
        sha256(std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
    std::string hex;
    for (std::size_t i = 0; i < 8; ++i)
        hex += fmt::format("{:02x}", static_cast<unsigned char>(digest[i]));
    return hex;
}

Result<PublicKey> parse_public_key(std::string_view text) {
    auto bad = [&](std::string_view why) {
        return core::fail(
            EINVAL, fmt::format("not a kcache public key ({}): '{}'", why, text.substr(0, 80)));
    };
    if (!text.starts_with(kPublicKeyPrefix)) return bad("it must start with kcache-ed25519:");
    const std::string_view b64 = text.substr(kPublicKeyPrefix.size());
    // 32 bytes are 44 base64 characters, the last one '='.
    if (b64.size() != 44 || b64.back() != '=' || b64[42] == '=') return bad("wrong length");
    unsigned char out[33] = {};
    const int n = EVP_DecodeBlock(out, reinterpret_cast<const unsigned char*>(b64.data()), 44);
    if (n != 33) return bad("not base64");
    PublicKey key;
    std::memcpy(key.raw.data(), out, 32);
    if (key.text() != text) return bad("not canonical base64");
    return key;
}

bool verify_signature(const PublicKey& key, std::string_view message, std::string_view signature) {
    if (signature.size() != kSignatureBytes) return false;
    Pkey pkey(
        EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, key.raw.data(), key.raw.size()));
    MdCtx ctx(EVP_MD_CTX_new());
    if (!pkey || !ctx) return false;
    if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) != 1) return false;
    return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                            signature.size(),
                            reinterpret_cast<const unsigned char*>(message.data()),
                            message.size()) == 1;
}

struct SigningKey::Impl {
    Pkey pkey;
};

SigningKey::SigningKey(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {
    std::size_t n = m_public.raw.size();
    EVP_PKEY_get_raw_public_key(m_impl->pkey.get(), m_public.raw.data(), &n);
}
SigningKey::SigningKey(SigningKey&&) noexcept = default;
SigningKey& SigningKey::operator=(SigningKey&&) noexcept = default;
SigningKey::~SigningKey() = default;

Result<SigningKey> SigningKey::generate() {
    EVP_PKEY* raw = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
    if (!raw) return core::fail(EIO, "cannot generate an Ed25519 key (OpenSSL)");
    auto impl = std::make_unique<Impl>();
    impl->pkey.reset(raw);
    return SigningKey(std::move(impl));
}

Result<SigningKey> SigningKey::load(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return core::fail(errno, fmt::format("cannot open the signing key {}", path));
    struct stat st {};
    std::string text;
    Status s;
    if (::fstat(fd, &st) != 0) {
        s = core::fail(errno, fmt::format("cannot stat {}", path));
    } else if ((st.st_mode & 077) != 0) {
        s = core::fail(EACCES, fmt::format("signing key {} is readable or writable by group or "
                                           "others (mode {:04o}): chmod 600 it",
                                           path, st.st_mode & 07777));
    } else if (st.st_size > 64 * 1024) {
        s = core::fail(EINVAL, fmt::format("signing key {} is too large to be a key", path));
    } else {
        char buf[4096];
        for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, n);
    }
    ::close(fd);
    if (!s) return tl::unexpected(s.error());
    Bio bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
    Pkey pkey(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
    if (!pkey || EVP_PKEY_get_id(pkey.get()) != EVP_PKEY_ED25519) {
        return core::fail(EINVAL,
                          fmt::format("{} is not an Ed25519 private key in PEM (kcache keys "
                                      "generate makes one)",
                                      path));
    }
    auto impl = std::make_unique<Impl>();
    impl->pkey = std::move(pkey);
    return SigningKey(std::move(impl));
}

Status SigningKey::save(const std::string& path) const {
    Bio bio(BIO_new(BIO_s_mem()));
    if (!bio || PEM_write_bio_PrivateKey(bio.get(), m_impl->pkey.get(), nullptr, nullptr, 0,
                                         nullptr, nullptr) != 1) {
        return core::fail(EIO, "cannot encode the private key (OpenSSL)");
    }
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &data);
    return write_new_file(path, std::string_view(data, static_cast<std::size_t>(n)), 0600);
}

std::string SigningKey::sign(std::string_view message) const {
    std::string out(kSignatureBytes, '\0');
    std::size_t n = out.size();
    MdCtx ctx(EVP_MD_CTX_new());
    if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, m_impl->pkey.get()) != 1 ||
        EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n,
                       reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) != 1 ||
        n != kSignatureBytes) {
        return {};  // never for a valid key; an empty signature fails every check
    }
    return out;
}

const TrustedKey* TrustFile::find(const PublicKey& key) const {
    for (const TrustedKey& k : keys) {
        if (k.key == key) return &k;
    }
    return nullptr;
}

Result<TrustFile> parse_trust_file(std::string_view text) {
    TrustFile trust;
    std::istringstream in{std::string(text)};
    std::size_t number = 0;
    for (std::string line; std::getline(in, line);) {
        ++number;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        std::istringstream words(line);
        std::string verb, key, name;
        if (!(words >> verb) || verb.starts_with('#')) continue;
        auto bad = [&](std::string_view why) {
            return core::fail(EINVAL, fmt::format("trust file line {}: {}", number, why));
        };
        if (verb != "trust" && verb != "revoke")
            return bad(fmt::format("'{}' is neither trust nor revoke", verb.substr(0, 40)));
        if (!(words >> key)) return bad("no public key");
        auto parsed = parse_public_key(key);
        if (!parsed) return bad(parsed.error().message);
        std::getline(words >> std::ws, name);
        if (trust.find(*parsed)) return bad(fmt::format("key {} is named twice", parsed->id()));
        trust.keys.push_back({*parsed, name, verb == "revoke"});
    }
    return trust;
}

std::string format_trust_file(const TrustFile& trust) {
    std::string out =
        "# kcache trusted keys (docs/operations.md, \"Trust model\"): entries of the shared\n"
        "# tier are accepted only when signed by a `trust` key; a `revoke` key's are refused.\n";
    for (const TrustedKey& k : trust.keys) {
        out += fmt::format("{} {}{}{}\n", k.revoked ? "revoke" : "trust", k.key.text(),
                           k.name.empty() ? "" : " ", k.name);
    }
    return out;
}

Status check_trust_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        return core::fail(errno, fmt::format("trust file {}", path));
    if (!S_ISREG(st.st_mode))
        return core::fail(EACCES, fmt::format("trust file {} is not a regular file", path));
    KCACHE_TRY(check_owner_and_mode(path, st, false));
    const std::string dir = dir_of(path);
    if (::stat(dir.c_str(), &st) != 0)
        return core::fail(errno, fmt::format("trust file directory {}", dir));
    return check_owner_and_mode(dir, st, true);
}

Result<TrustFile> load_trust_file(const std::string& path) {
    KCACHE_TRY(check_trust_file(path));
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return core::fail(EIO, fmt::format("cannot read the trust file {}", path));
    auto trust = parse_trust_file(text.str());
    if (!trust) return tl::unexpected(core::with_context(trust.error(), path));
    return trust;
}

Status save_trust_file(const std::string& path, const TrustFile& trust) {
    const std::string dir = dir_of(path);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
        if (errno != ENOENT || ::mkdir(dir.c_str(), 0755) != 0 || ::stat(dir.c_str(), &st) != 0)
            return core::fail(errno, fmt::format("cannot make the directory {}", dir));
    }
    KCACHE_TRY(check_owner_and_mode(dir, st, true));
    const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
    ::unlink(tmp.c_str());
    KCACHE_TRY(write_new_file(tmp, format_trust_file(trust), 0644));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        return core::fail(err, fmt::format("cannot replace {}", path));
    }
    return {};
}

namespace {

std::string printable(std::string_view text) {
    std::string out(text.substr(0, 4096));
    for (char& c : out) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    return out;
}

}  // namespace

void record_rejection(const std::string& db_path, const RejectionRecord& r) {
    const std::string path = db_path + "/" + std::string(kRejectionsFile);
    const std::string line = fmt::format("{}\t{}\t{}\t{}\n", r.time_ns, printable(r.entry),
                                         printable(r.cause), printable(r.detail));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    (void)!::write(fd, line.data(), line.size());  // one write: lines do not interleave
    struct stat st {};
    const bool over =
        ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) > kMaxRejectionsBytes;
    ::close(fd);
    if (!over) return;
    // Keep the newest half (whole lines), replacing the file in one rename.
    std::ifstream in(path);
    std::stringstream all;
    all << in.rdbuf();
    std::string text = all.str();
    std::size_t from =
        text.size() > kMaxRejectionsBytes / 2 ? text.size() - kMaxRejectionsBytes / 2 : 0;
    from = text.find('\n', from);
    text = from == std::string::npos ? std::string() : text.substr(from + 1);
    const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
    ::unlink(tmp.c_str());
    if (write_new_file(tmp, text, 0644) && ::rename(tmp.c_str(), path.c_str()) != 0)
        ::unlink(tmp.c_str());
}

std::optional<RejectionRecord> last_rejection(const std::string& db_path, std::string_view entry) {
    std::ifstream in(db_path + "/" + std::string(kRejectionsFile));
    std::optional<RejectionRecord> found;
    for (std::string line; std::getline(in, line);) {
        const std::size_t a = line.find('\t');
        const std::size_t b = a == std::string::npos ? a : line.find('\t', a + 1);
        const std::size_t c = b == std::string::npos ? b : line.find('\t', b + 1);
        if (c == std::string::npos) continue;
        if (std::string_view(line).substr(a + 1, b - a - 1) != entry) continue;
        RejectionRecord r;
        r.time_ns = std::strtoll(line.c_str(), nullptr, 10);
        r.entry = line.substr(a + 1, b - a - 1);
        r.cause = line.substr(b + 1, c - b - 1);
        r.detail = line.substr(c + 1);
        found = std::move(r);
    }
    return found;
}

std::string signer_of(const core::EntryInfo& entry) {
    if (!core::is_fleet_entry(entry)) return {};
    const std::string& name = entry.populated_by_name;
    const std::size_t hash = name.rfind('#');
    if (hash == std::string::npos || name.size() - hash != 17) return {};
    const std::string id = name.substr(hash + 1);
    const bool hex = std::all_of(id.begin(), id.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    });
    return hex ? id : std::string();
}

std::string default_keys_dir() {
    if (const char* d = std::getenv("KCACHE_KEYS_DIR"); d && *d) return d;
    if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x)
        return std::string(x) + "/kcache/keys";
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.config/kcache/keys";
}

}  // namespace kcache::remote
