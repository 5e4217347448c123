// The order the kernel puts between a daemon's replies and the requests that follow
// them, told to ThreadSanitizer (nothing without -fsanitize=thread).
//
// The kernel sends a request only after the replies it depends on (a RELEASE after the
// READ's reply, a READ after the OPEN's), so a handler may free what an earlier one
// used. TSan cannot see that order by itself: it models a read and a write of one fd as
// acquire and release only for an fd it saw opened, and the serving daemon's /dev/fuse
// fd is inherited from the keeper across exec; the io_uring rings are shared memory and
// io_uring_enter. Without these calls it reports every handle used on one thread and
// released on another. Every reply handed to the kernel releases, every request taken
// from it acquires, one object for all (as one /dev/fuse fd is). Called by both ways a
// reply goes (takeover.cpp's /dev/fuse io, uring_transport.cpp's rings).
#pragma once

namespace kcache::fsd::kernel_order {

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
inline char g_kernel_order;
inline void replied_to_kernel() {
    __tsan_release(&g_kernel_order);
}
inline void request_from_kernel() {
    __tsan_acquire(&g_kernel_order);
}
#else
inline void replied_to_kernel() {}
inline void request_from_kernel() {}
#endif

}  // namespace kcache::fsd::kernel_order
