#include "lmdb.hpp"

#include <cerrno>

#include <fmt/format.h>

namespace kcache::core::lmdb {

int to_errno(int rc) {
    switch (rc) {
        case MDB_SUCCESS:
            return 0;
        case MDB_NOTFOUND:
            return ENOENT;
        case MDB_KEYEXIST:
            return EEXIST;
        case MDB_MAP_FULL:
        case MDB_TXN_FULL:
        case MDB_PAGE_FULL:
            return ENOSPC;
        // LMDB's own structure is broken: kCorruptDb (integrity.hpp), which kcache-fsd
        // answers by setting the db aside. A version mismatch is no damage.
        case MDB_CORRUPTED:
        case MDB_PAGE_NOTFOUND:
        case MDB_INVALID:
            return EUCLEAN;
        case MDB_VERSION_MISMATCH:
            return EIO;
        case MDB_BAD_VALSIZE:
            return ENAMETOOLONG;
        case MDB_READERS_FULL:
        case MDB_MAP_RESIZED:
            return EAGAIN;
        case MDB_DBS_FULL:
        case MDB_TLS_FULL:
        case MDB_CURSOR_FULL:
        case MDB_INCOMPATIBLE:
        case MDB_BAD_RSLOT:
        case MDB_BAD_TXN:
        case MDB_BAD_DBI:
        case MDB_PANIC:
            return EIO;
        default:
            return rc > 0 ? rc : EIO;  // LMDB passes errno values through
    }
}

Error error(int rc, std::string_view what) {
    return Error{to_errno(rc), fmt::format("{}: {}", what, mdb_strerror(rc))};
}

}  // namespace kcache::core::lmdb
