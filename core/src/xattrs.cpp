// Extended attributes (xattrs.hpp): the `xattrs` table, key inode + name.
#include "kcache/core/xattrs.hpp"

#include <sys/stat.h>

#include <cerrno>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kcache::core {
using records::Inode;

namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
    return s.substr(0, prefix.size()) == prefix;
}

// A name the table may hold: ERANGE for its length, EOPNOTSUPP for a namespace kcache
// does not keep (system.*, POSIX ACLs among them, and unknown prefixes).
Status check_name(std::string_view name) {
    if (name.empty() || name.size() > kMaxXattrName) {
        return fail(ERANGE, fmt::format("an attribute name is 1 to {} bytes ({} given)",
                                        kMaxXattrName, name.size()));
    }
    if (starts_with(name, "user.") || starts_with(name, "trusted.") ||
        starts_with(name, "security.")) {
        if (name.find('\0') != std::string_view::npos)
            return fail(EINVAL, "an attribute name holds a NUL byte");
        return {};
    }
    return fail(EOPNOTSUPP, fmt::format("attribute namespace of '{}' not supported (user., "
                                        "trusted. and security. are)",
                                        name));
}

bool is_user(std::string_view name) {
    return starts_with(name, "user.");
}

bool user_allowed(const Inode& node) {
    return is_regular(node.mode) || is_dir(node.mode);
}

std::string key_of(Ino ino, std::string_view name) {
    std::string key = records::u64_key(ino);
    key.append(name);
    return key;
}

}  // namespace

namespace ops {

Status drop_xattrs(Tx& tx, Ino ino) {
    if (!tx.db.has_xattrs) return {};
    const std::string prefix = records::u64_key(ino);
    std::vector<std::string> keys;
    KCACHE_TRY(tx.scan(tx.db.xattrs, prefix, prefix, [&](std::string_view key, std::string_view) {
        keys.emplace_back(key);
        return true;
    }));
    for (const auto& key : keys) KCACHE_TRY(tx.del(tx.db.xattrs, key));
    return {};
}

}  // namespace ops

Result<std::string> get_xattr(const Txn& txn, Ino ino, std::string_view name) {
    const Tx tx = TxnAccess::tx(txn);
    KCACHE_TRY(check_name(name));
    const Inode node = KCACHE_TRY(tx.inode(ino));
    if (is_user(name) && !user_allowed(node))
        return fail(ENODATA, "user attributes are on regular files and directories only");
    if (!tx.db.has_xattrs) return fail(ENODATA, fmt::format("no attribute '{}'", name));
    auto value = KCACHE_TRY(tx.get(tx.db.xattrs, key_of(ino, name)));
    if (!value) return fail(ENODATA, fmt::format("no attribute '{}' on inode {}", name, ino));
    return std::string(*value);
}

Result<std::vector<std::string>> list_xattrs(const Txn& txn, Ino ino, bool privileged) {
    const Tx tx = TxnAccess::tx(txn);
    KCACHE_TRY(tx.inode(ino));  // ENOENT for a node that is gone
    std::vector<std::string> names;
    if (!tx.db.has_xattrs) return names;
    const std::string prefix = records::u64_key(ino);
    KCACHE_TRY(tx.scan(tx.db.xattrs, prefix, prefix, [&](std::string_view key, std::string_view) {
        const std::string_view name = key.substr(prefix.size());
        if (privileged || !starts_with(name, "trusted.")) names.emplace_back(name);
        return true;
    }));
    return names;
}

Status set_xattr(WriteTxn& txn, Ino ino, std::string_view name, std::string_view value, int flags) {
    Tx tx = TxnAccess::tx(txn);
    if (flags & ~(kXattrCreate | kXattrReplace)) return fail(EINVAL, "setxattr flags");
    if (flags == (kXattrCreate | kXattrReplace))
        return fail(EINVAL, "XATTR_CREATE and XATTR_REPLACE together");
    KCACHE_TRY(check_name(name));
    if (value.size() > kMaxXattrValue) {
        return fail(E2BIG, fmt::format("an attribute value is at most {} bytes ({} given)",
                                       kMaxXattrValue, value.size()));
    }
    Inode node = KCACHE_TRY(tx.inode(ino));
    if (is_user(name) && !user_allowed(node))
        return fail(EPERM, "user attributes are on regular files and directories only");
    if (!tx.db.has_xattrs) return fail(EROFS, "this db has no attribute table (opened read-only)");
    const std::string key = key_of(ino, name);
    const bool exists = KCACHE_TRY(tx.get(tx.db.xattrs, key)).has_value();
    if (exists && (flags & kXattrCreate))
        return fail(EEXIST, fmt::format("attribute '{}' exists", name));
    if (!exists && (flags & kXattrReplace))
        return fail(ENODATA, fmt::format("no attribute '{}' to replace", name));
    KCACHE_TRY(tx.put(tx.db.xattrs, key, value));
    node.ctime_ns = tx.now();
    return tx.put_inode(node);
}

Status remove_xattr(WriteTxn& txn, Ino ino, std::string_view name) {
    Tx tx = TxnAccess::tx(txn);
    KCACHE_TRY(check_name(name));
    Inode node = KCACHE_TRY(tx.inode(ino));
    if (is_user(name) && !user_allowed(node))
        return fail(EPERM, "user attributes are on regular files and directories only");
    const std::string key = key_of(ino, name);
    if (!tx.db.has_xattrs || !KCACHE_TRY(tx.get(tx.db.xattrs, key)).has_value())
        return fail(ENODATA, fmt::format("no attribute '{}' on inode {}", name, ino));
    KCACHE_TRY(tx.del(tx.db.xattrs, key));
    node.ctime_ns = tx.now();
    return tx.put_inode(node);
}

}  // namespace kcache::core
