// Clang's thread-safety analysis (-Wthread-safety) for kcache: the attribute macros, and
// a mutex, a scoped lock and a condition variable that carry them, and a reader-writer
// mutex with its two scoped locks.
//
// Why our own types: libstdc++'s std::mutex, std::shared_mutex and std::lock_guard carry
// no capability attributes, so clang cannot tell which lock a function holds.
// kcache::Mutex is a std::mutex that says what it is; MutexLock is the scoped lock the
// analysis follows (also across unlock() and lock() again, for a loop that lets the lock
// go while it works, and from a try_lock() that succeeded: std::adopt_lock); CondVar
// waits on a Mutex the caller holds. SharedMutex is a std::shared_mutex, held shared by a
// ReaderLock (std::shared_lock) or exclusively by a WriterLock (std::lock_guard). After
// LevelDB's port/thread_annotations.h and clang's documentation ("Thread Safety
// Analysis").
//
// How a unit uses them:
//   Mutex m_mutex KCACHE_LEVEL(5);          // lock_order.hpp: its place in the order
//   std::vector<int> m_queue GUARDED_BY(m_mutex);
//   void drain_locked() REQUIRES(m_mutex);  // called with m_mutex held
//   ...
//   MutexLock lock(m_mutex);
//   while (m_queue.empty()) m_wake.wait(m_mutex);  // no predicate lambdas: clang
//                                                  // analyzes a lambda on its own
//
//   SharedMutex m_map_mutex;
//   std::vector<int> m_map GUARDED_BY(m_map_mutex);
//   ReaderLock lock(m_map_mutex);   // reads m_map; WriterLock to change it
//
// Under GCC every macro is empty and the types are plain wrappers: the build is the
// same, and scripts/check_thread_safety.sh runs clang's analysis over every product
// source (core, remote, gui, loader, cli, fsd; a CTest test).
// Contract: as std::mutex, std::shared_mutex and std::condition_variable; nothing here
// fails otherwise.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define KCACHE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KCACHE_THREAD_ANNOTATION(x)
#endif

// On a type: objects of it are capabilities (locks) named `x` in messages.
#define CAPABILITY(x) KCACHE_THREAD_ANNOTATION(capability(x))
// On an RAII type that acquires a capability in its constructor and releases it in
// its destructor.
#define SCOPED_CAPABILITY KCACHE_THREAD_ANNOTATION(scoped_lockable)
// On a field: read and written only with capability `x` held.
#define GUARDED_BY(x) KCACHE_THREAD_ANNOTATION(guarded_by(x))
// On a pointer field: the object it points to is guarded by `x` (the pointer is not).
#define PT_GUARDED_BY(x) KCACHE_THREAD_ANNOTATION(pt_guarded_by(x))
// On a mutex: the order in which it nests with others (checked under
// -Wthread-safety-beta in clang 14; lock_order.hpp chains the levels).
#define ACQUIRED_BEFORE(...) KCACHE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KCACHE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// On a function: its caller holds the capabilities exclusively (REQUIRES) or at least
// shared (REQUIRES_SHARED).
#define REQUIRES(...) KCACHE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) KCACHE_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// On a function: it takes (ACQUIRE) or lets go of (RELEASE) the capabilities, or takes
// them when it returns `ret` (TRY_ACQUIRE); ACQUIRE_SHARED and RELEASE_SHARED, shared.
// A scoped lock's destructor says RELEASE() whichever way it holds.
#define ACQUIRE(...) KCACHE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KCACHE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) KCACHE_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) KCACHE_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) KCACHE_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// On a function: its caller must not hold the capabilities (it takes them itself).
// Checked only under -Wthread-safety-negative, which kcache does not use: documentation.
#define EXCLUDES(...) KCACHE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: asserts at run time that the capability is held; the analysis takes
// it as held from here.
#define ASSERT_CAPABILITY(x) KCACHE_THREAD_ANNOTATION(assert_capability(x))
// On a function: it returns a reference to the capability `x`.
#define RETURN_CAPABILITY(x) KCACHE_THREAD_ANNOTATION(lock_returned(x))
// On a function whose locking the analysis cannot follow; say why at each use.
#define NO_THREAD_SAFETY_ANALYSIS KCACHE_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace kcache {

class CondVar;

// A std::mutex the analysis knows. Not recursive; lock() by a thread that holds it is
// undefined behaviour, as for std::mutex.
class CAPABILITY("mutex") Mutex {
  public:
    Mutex() = default;
    Mutex(const Mutex&) = delete;
    Mutex& operator=(const Mutex&) = delete;

    void lock() ACQUIRE() { m_mutex.lock(); }
    void unlock() RELEASE() { m_mutex.unlock(); }
    bool try_lock() TRY_ACQUIRE(true) { return m_mutex.try_lock(); }
    // For the analysis only: the caller holds this mutex (a callback the holder runs).
    void assert_held() const ASSERT_CAPABILITY(this) {}

  private:
    friend class CondVar;
    std::mutex m_mutex;
};

// Holds a Mutex for its scope (std::lock_guard), and may let it go and take it again
// within it (std::unique_lock's unlock() and lock()).
class SCOPED_CAPABILITY MutexLock {
  public:
    explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : m_mutex(mutex) { m_mutex.lock(); }
    // Takes over a hold the caller has (a try_lock() that succeeded), as std::adopt_lock.
    MutexLock(Mutex& mutex, std::adopt_lock_t) REQUIRES(mutex) : m_mutex(mutex) {}
    ~MutexLock() RELEASE() {
        if (m_held) m_mutex.unlock();
    }
    MutexLock(const MutexLock&) = delete;
    MutexLock& operator=(const MutexLock&) = delete;

    void unlock() RELEASE() {
        m_mutex.unlock();
        m_held = false;
    }
    void lock() ACQUIRE() {
        m_mutex.lock();
        m_held = true;
    }

  private:
    Mutex& m_mutex;
    bool m_held = true;
};

// A condition variable waited on with a Mutex held (the caller's MutexLock). Write the
// predicate as a loop at the caller, where the analysis sees the lock:
//   while (!ready) wake.wait(mutex);
class CondVar {
  public:
    CondVar() = default;
    CondVar(const CondVar&) = delete;
    CondVar& operator=(const CondVar&) = delete;

    // Lets `mutex` go until notified (or spuriously), then holds it again.
    void wait(Mutex& mutex) REQUIRES(mutex) {
        Borrowed held(mutex);
        m_cv.wait(held.lock);
    }
    // As wait(), until `deadline` at the latest; false when it passed.
    template <class Clock, class Duration>
    bool wait_until(Mutex& mutex, const std::chrono::time_point<Clock, Duration>& deadline)
        REQUIRES(mutex) {
        Borrowed held(mutex);
        return m_cv.wait_until(held.lock, deadline) == std::cv_status::no_timeout;
    }
    // As wait(), for `timeout` at most; false when it passed.
    template <class Rep, class Period>
    bool wait_for(Mutex& mutex, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mutex) {
        return wait_until(mutex, std::chrono::steady_clock::now() + timeout);
    }

    void notify_one() { m_cv.notify_one(); }
    void notify_all() { m_cv.notify_all(); }

  private:
    // The caller's hold of a Mutex lent to std::condition_variable as a unique_lock, and
    // given back held, never unlocked, however the wait ends: also by unwinding, as when
    // the thread is cancelled in it (libfuse cancels its workers; glibc holds the mutex
    // again first). The caller's MutexLock lets it go, once (tests/core/test_locks.cpp).
    struct Borrowed {
        explicit Borrowed(Mutex& mutex) : lock(mutex.m_mutex, std::adopt_lock) {}
        ~Borrowed() { lock.release(); }
        Borrowed(const Borrowed&) = delete;
        Borrowed& operator=(const Borrowed&) = delete;
        std::unique_lock<std::mutex> lock;
    };

    std::condition_variable m_cv;
};

// A std::shared_mutex the analysis knows: held shared by readers (ReaderLock), or
// exclusively by one writer (WriterLock). Not recursive, either way.
class CAPABILITY("shared_mutex") SharedMutex {
  public:
    SharedMutex() = default;
    SharedMutex(const SharedMutex&) = delete;
    SharedMutex& operator=(const SharedMutex&) = delete;

    void lock() ACQUIRE() { m_mutex.lock(); }
    void unlock() RELEASE() { m_mutex.unlock(); }
    void lock_shared() ACQUIRE_SHARED() { m_mutex.lock_shared(); }
    void unlock_shared() RELEASE_SHARED() { m_mutex.unlock_shared(); }

  private:
    std::shared_mutex m_mutex;
};

// Holds a SharedMutex shared for its scope (std::shared_lock): fields it guards may be
// read, not written.
class SCOPED_CAPABILITY ReaderLock {
  public:
    explicit ReaderLock(SharedMutex& mutex) ACQUIRE_SHARED(mutex) : m_mutex(mutex) {
        m_mutex.lock_shared();
    }
    ~ReaderLock() RELEASE() { m_mutex.unlock_shared(); }
    ReaderLock(const ReaderLock&) = delete;
    ReaderLock& operator=(const ReaderLock&) = delete;

  private:
    SharedMutex& m_mutex;
};

// Holds a SharedMutex exclusively for its scope (std::lock_guard).
class SCOPED_CAPABILITY WriterLock {
  public:
    explicit WriterLock(SharedMutex& mutex) ACQUIRE(mutex) : m_mutex(mutex) { m_mutex.lock(); }
    ~WriterLock() RELEASE() { m_mutex.unlock(); }
    WriterLock(const WriterLock&) = delete;
    WriterLock& operator=(const WriterLock&) = delete;

  private:
    SharedMutex& m_mutex;
};

}  // namespace kcache
