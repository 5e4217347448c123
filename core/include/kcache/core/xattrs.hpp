// Extended attributes of a node (setxattr(2) and friends), kept in the db.
//
// Each attribute is one row of the `xattrs` table: key inode number (big-endian) +
// name, value the raw bytes. They belong to the inode (every name of a hard-linked file
// shares them), survive remounts and takeovers like everything in the db, and go with
// the inode: the removal of its last name, an rmdir, an eviction of its entry
// (ops::remove_node). They do not travel with an entry: `kcache export`, bundles and the
// shared tier carry files' names, modes and contents only (docs/operations.md says why).
//
// Namespaces, as the kernel's local file systems apply them:
// - `user.*`: regular files and directories only (another node: EPERM to set, ENODATA
//   to read); who may set them (the owner, or write permission) is the kernel's check
//   (default_permissions) before the request reaches the daemon.
// - `trusted.*`: stored as given; the kernel lets only CAP_SYS_ADMIN reach them, and
//   list_xattrs leaves them out for others (`privileged` false).
// - `security.*`: stored as the kernel passes them (security.capability, SELinux labels).
// - `system.*` (POSIX ACLs among them) and any other prefix: EOPNOTSUPP (no ACLs).
// Limits and errors as Linux's: a name of 1 to kMaxXattrName bytes (ERANGE otherwise),
// a value of at most kMaxXattrValue bytes (E2BIG), ENODATA for a missing attribute,
// XATTR_CREATE on an existing one EEXIST, XATTR_REPLACE on a missing one ENODATA; a
// missing inode is ENOENT. A change sets the inode's ctime, as ext4 does.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/store.hpp"

namespace kcache::core {

inline constexpr std::size_t kMaxXattrName = 255;     // XATTR_NAME_MAX
inline constexpr std::size_t kMaxXattrValue = 65536;  // XATTR_SIZE_MAX

// setxattr(2)'s flags: XATTR_CREATE and XATTR_REPLACE have these values.
inline constexpr int kXattrCreate = 1;
inline constexpr int kXattrReplace = 2;

// The value of `name` on `ino`: ENODATA when it has none.
Result<std::string> get_xattr(const Txn& txn, Ino ino, std::string_view name);
// The names on `ino`, in byte order; `privileged` false leaves trusted.* out.
Result<std::vector<std::string>> list_xattrs(const Txn& txn, Ino ino, bool privileged);
// Sets `name` to `value` (`flags`: 0, kXattrCreate or kXattrReplace; another is EINVAL).
Status set_xattr(WriteTxn& txn, Ino ino, std::string_view name, std::string_view value, int flags);
// Removes `name`: ENODATA when it is not there.
Status remove_xattr(WriteTxn& txn, Ino ino, std::string_view name);

}  // namespace kcache::core
