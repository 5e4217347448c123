// Reading the files of an entry, or of a directory, from a snapshot: the one walk the
// CLI (`show`, `cat`), the inspector's detail and the loader share.
//
// Every function reads inside `txn` only and returns copies (EntryFile owns its
// strings), valid after the transaction ends. Thread-safety: that of the Txn (one
// thread at a time). Failures: core's read errors (EIO on a damaged record, ENOENT
// when a node is gone), and ENOTDIR where a directory is expected.
#pragma once

#include <functional>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

// What a walk does after visiting a node.
enum class Walk {
    next,  // go on (into the node, if it is a directory)
    skip,  // go on, but not into this directory
    stop,  // end the walk (not an error)
};

// Visits every node below directory `dir`, depth first in name order, a directory
// before what it holds; paths are relative to `dir` ("a", "a/b"). ENOTDIR when `dir`
// is not a directory. Special nodes (fifos, sockets, devices) are not visited, here nor by
// Txn::for_each_entry_file; a file with several names is visited under each.
Status walk_below(const Txn& txn, Ino dir, const std::function<Walk(const EntryFile&)>& fn);

// The regular files and symlinks of `entry` (Txn::for_each_entry_file without its
// directories), sorted by path.
Result<std::vector<EntryFile>> entry_files(const Txn& txn, const EntryInfo& entry);

}  // namespace kcache::core
