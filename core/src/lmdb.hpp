// Thin helpers over the LMDB C API: error mapping and MDB_val conversions.
#pragma once

#include <lmdb.h>

#include <string>
#include <string_view>

#include "kcache/core/error.hpp"

namespace kcache::core::lmdb {

// errno for an LMDB return code: MDB_MAP_FULL -> ENOSPC, MDB_CORRUPTED -> EIO, ...
int to_errno(int rc);
// An Error whose message is "<what>: <lmdb's description>".
Error error(int rc, std::string_view what);

inline MDB_val val(std::string_view bytes) {
    return MDB_val{bytes.size(), const_cast<char*>(bytes.data())};
}
inline std::string_view view(const MDB_val& v) {
    return {static_cast<const char*>(v.mv_data), v.mv_size};
}

// Owns an MDB_cursor for the duration of a scope.
class Cursor {
  public:
    Cursor() = default;
    ~Cursor() {
        if (m_cursor) mdb_cursor_close(m_cursor);
    }
    Cursor(const Cursor&) = delete;
    Cursor& operator=(const Cursor&) = delete;
    int open(MDB_txn* txn, MDB_dbi dbi) { return mdb_cursor_open(txn, dbi, &m_cursor); }
    MDB_cursor* get() const { return m_cursor; }

  private:
    MDB_cursor* m_cursor = nullptr;
};

}  // namespace kcache::core::lmdb
