// The FUSE-over-io_uring protocol, as far as kcache-fsd uses it. Debian's
// /usr/include/linux/fuse.h (protocol 7.38) predates it, so the definitions are
// repeated here from the kernel's include/uapi/linux/fuse.h (protocol 7.42, Linux
// 6.14+: "FUSE_OVER_IO_URING", "struct fuse_uring_ent_in_out", "struct
// fuse_uring_req_header", "enum fuse_uring_cmd", "struct fuse_uring_cmd_req"); the
// layouts are checked below. How the kernel fills and reads them is
// fs/fuse/dev_uring.c (uring_transport.cpp says what it relies on).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kcache::fsd::uring_abi {

// INIT flag (bit 41 of the 64-bit flags: bit 9 of flags2, read by the kernel only with
// FUSE_INIT_EXT): offered by the kernel when its module parameter enable_uring is on;
// set in the reply by a server that will register ring entries.
inline constexpr std::uint64_t kOverIoUring = std::uint64_t{1} << 41;
inline constexpr std::uint32_t kInitExt = std::uint32_t{1} << 30;  // FUSE_INIT_EXT

inline constexpr std::size_t kInOutHeaderSize = 128;  // FUSE_URING_IN_OUT_HEADER_SZ
inline constexpr std::size_t kOpInOutSize = 128;      // FUSE_URING_OP_IN_OUT_SZ

// struct fuse_uring_ent_in_out
struct EntInOut {
    std::uint64_t flags;
    std::uint64_t commit_id;   // the request's unique: what COMMIT_AND_FETCH names
    std::uint32_t payload_sz;  // bytes of the payload buffer in use (both directions)
    std::uint32_t padding;
    std::uint64_t reserved;
};

// struct fuse_uring_req_header: the first buffer of a ring entry.
struct ReqHeader {
    char in_out[kInOutHeaderSize];  // fuse_in_header in, fuse_out_header out
    char op_in[kOpInOutSize];       // the request's first argument (its per-op header)
    EntInOut ring_ent_in_out;
};

// enum fuse_uring_cmd: IORING_OP_URING_CMD's cmd_op on the /dev/fuse fd.
inline constexpr std::uint32_t kCmdRegister = 1;        // FUSE_IO_URING_CMD_REGISTER
inline constexpr std::uint32_t kCmdCommitAndFetch = 2;  // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

// struct fuse_uring_cmd_req: in the SQE's command area (a 128-byte SQE).
struct CmdReq {
    std::uint64_t flags;
    std::uint64_t commit_id;
    std::uint16_t qid;
    std::uint8_t padding[6];
};

static_assert(sizeof(EntInOut) == 32);
static_assert(offsetof(ReqHeader, op_in) == 128 && offsetof(ReqHeader, ring_ent_in_out) == 256);
static_assert(sizeof(ReqHeader) == 288);
static_assert(sizeof(CmdReq) == 24 && offsetof(CmdReq, qid) == 16);

}  // namespace kcache::fsd::uring_abi
