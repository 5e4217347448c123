// Signed entries in the shared tier (docs/operations.md, "Trust model"): Ed25519 keys of
// the producers that push (a node, a CI job), the trust file that says whose entries a
// node accepts, and SHA-256. All cryptography is OpenSSL 3's (libcrypto): nothing here
// is our own.
//
// Formats (text, one line each, so that a person can read and edit them):
//  - a public key: `kcache-ed25519:<base64 of the 32 raw bytes>` (kPublicKeyPrefix), its
//    id 16 hex digits of the SHA-256 of the raw bytes (PublicKey::id(), what an entry
//    records as its signer and `kcache evict --signer` takes);
//  - a private key: a PKCS#8 PEM file (`openssl pkey` reads it), mode 0600;
//  - the trust file: lines `trust <public key> [name]` and `revoke <public key> [name]`;
//    blank lines and `#` comments are ignored. A revoked key stays named so that what it
//    signed is refused as revoked, not merely untrusted.
//
// The trust file's rule (check_trust_file): a regular file owned by root or by this
// process's effective user, not writable by group or others, in a directory that
// holds to the same rule, so that no other user can write or replace the list of whom
// this node trusts. A file that fails is refused (EACCES), never half used.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/types.hpp"

namespace kcache::remote {

using core::Result;
using core::Status;

inline constexpr std::string_view kPublicKeyPrefix = "kcache-ed25519:";
inline constexpr std::string_view kDefaultTrustFile = "/etc/kcache/trusted-keys";
inline constexpr std::size_t kSignatureBytes = 64;
inline constexpr std::size_t kSha256Bytes = 32;

// The SHA-256 of `data`: 32 raw bytes (OpenSSL EVP).
std::string sha256(std::string_view data);

struct PublicKey {
    std::array<unsigned char, 32> raw{};
    std::string text() const;  // kcache-ed25519:<base64>
    std::string id() const;    // 16 hex digits
    bool operator==(const PublicKey& other) const { return raw == other.raw; }
};
// EINVAL unless `text` is kcache-ed25519:<base64 of exactly 32 bytes>.
Result<PublicKey> parse_public_key(std::string_view text);

// True when `signature` is `key`'s Ed25519 signature of `message`.
bool verify_signature(const PublicKey& key, std::string_view message, std::string_view signature);

// A producer's private key. Thread-safe once made (signing only reads it).
class SigningKey {
  public:
    SigningKey(SigningKey&&) noexcept;
    SigningKey& operator=(SigningKey&&) noexcept;
    ~SigningKey();
    static Result<SigningKey> generate();
    // Reads a PEM file; EACCES when its group or others may read or write it (as ssh
    // refuses such a key), EINVAL when it is no Ed25519 private key.
    static Result<SigningKey> load(const std::string& path);
    // Writes it as PEM to a new file of mode 0600 (EEXIST if one is there).
    Status save(const std::string& path) const;
    const PublicKey& public_key() const { return m_public; }
    // The 64-byte Ed25519 signature of `message`.
    std::string sign(std::string_view message) const;

  private:
    struct Impl;
    explicit SigningKey(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
    PublicKey m_public;
};

struct TrustedKey {
    PublicKey key;
    std::string name;  // may be empty
    bool revoked = false;
};

struct TrustFile {
    std::vector<TrustedKey> keys;  // in file order, each key once
    const TrustedKey* find(const PublicKey& key) const;
};

// EINVAL naming the line for anything it cannot read.
Result<TrustFile> parse_trust_file(std::string_view text);
std::string format_trust_file(const TrustFile& trust);

// The rule above; EACCES naming what fails, ENOENT when there is no such file.
Status check_trust_file(const std::string& path);
// check_trust_file, then parse_trust_file.
Result<TrustFile> load_trust_file(const std::string& path);
// Replaces the file (a temporary in its directory renamed over it), mode 0644, making
// its directory (0755) when absent; the rule is checked on the directory first.
Status save_trust_file(const std::string& path, const TrustFile& trust);

// The key id of the signer of an entry the shared tier supplied (a pull records
// "fleet:<host>#<key id>" as its populating process); empty when unsigned or not fleet.
std::string signer_of(const core::EntryInfo& entry);

// The entries a db's pulls refused (Outcome::rejected), for `kcache why`: a file in the
// db's directory, kRejectionsFile, one line each "<time ns>\t<entry>\t<cause>\t<detail>"
// (control characters written as '?'), appended by every pull (kcache-fsd's read-through
// and prefetch, `kcache remote pull`) and cut to its newest half past kMaxRejectionsBytes.
// Best effort: a failure to write it loses the note, never the pull's outcome.
inline constexpr std::string_view kRejectionsFile = "remote-rejections";
inline constexpr std::size_t kMaxRejectionsBytes = std::size_t{1} << 20;
struct RejectionRecord {
    std::int64_t time_ns = 0;
    std::string entry, cause, detail;
};
void record_rejection(const std::string& db_path, const RejectionRecord& record);
// The newest record of `entry`, if any.
std::optional<RejectionRecord> last_rejection(const std::string& db_path, std::string_view entry);

// Where `kcache keys generate` keeps private keys: $KCACHE_KEYS_DIR, else
// $XDG_CONFIG_HOME/kcache/keys, else ~/.config/kcache/keys.
std::string default_keys_dir();

}  // namespace kcache::remote
