// The floor's request counters: one slot per opcode it serves, named as libfuse's
// debug log names them, written to a file on request (floor_fsd.cpp).
#pragma once

#include <string>

namespace kcache::floor_fsd {

enum Op {
    LOOKUP,
    FORGET,
    BATCH_FORGET,
    GETATTR,
    SETATTR,
    MKDIR,
    UNLINK,
    RMDIR,
    RENAME,
    RENAME2,
    OPEN,
    READ,
    WRITE,
    STATFS,
    RELEASE,
    FSYNC,
    FLUSH,
    OPENDIR,
    READDIR,
    READDIRPLUS,
    RELEASEDIR,
    FSYNCDIR,
    CREATE,
    IOCTL,
    GETXATTR,
    SETXATTR,
    LISTXATTR,
    REMOVEXATTR,
    ACCESS,
    FALLOCATE,
    LSEEK,
    MKNOD,
    LINK,
    SYMLINK,
    READLINK,
    kOps
};

// One more request of `op` (a relaxed increment: no cost worth measuring).
void count(Op op);
// Where write_counts() writes; empty (the default): nowhere.
void set_counts_path(std::string path);
// Writes every count, "NAME n" a line, to a temporary name renamed into place, so a
// reader polling for the file never sees half of it.
void write_counts();

}  // namespace kcache::floor_fsd
