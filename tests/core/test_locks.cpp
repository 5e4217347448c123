// kcache::Mutex, MutexLock and CondVar (core/include/kcache/core/thread_annotations.hpp)
// where the analysis cannot help: a wait that ends by unwinding; a MutexLock that adopts
// a try_lock(); SharedMutex's readers together and its writer alone.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "kcache/core/thread_annotations.hpp"

namespace {

struct Waiter {
    kcache::Mutex mutex;
    kcache::CondVar never;  // nobody notifies it: the wait ends only by cancellation
    std::atomic<bool> waiting{false};
    std::atomic<bool> probe{false};   // the waiter, unwinding, asks the test to look
    std::atomic<bool> looked{false};  // the test has looked
};

// Runs while the waiter's stack unwinds, between CondVar::wait's frame and the
// waiter's MutexLock: the mutex must still be the waiter's there (the MutexLock lets it
// go next). The test thread looks, with try_lock, while this waits for it.
struct LookWhileUnwinding {
    Waiter& w;
    ~LookWhileUnwinding() {
        w.probe = true;
        while (!w.looked) sched_yield();
    }
};

void* wait_forever(void* arg) {
    auto& w = *static_cast<Waiter*>(arg);
    kcache::MutexLock lock(w.mutex);
    LookWhileUnwinding look{w};
    w.waiting = true;
    for (;;) w.never.wait(w.mutex);  // a cancellation point
}

}  // namespace

// libfuse cancels its loop's worker threads when the session ends, and a worker may be
// waiting on a CondVar then (the daemon's takeover replay). glibc holds the mutex again
// before the unwinding starts; a wait that unlocked it while unwinding, and a MutexLock
// that unlocked it once more, would free it under the waiter's scope and could free
// another thread's hold (ThreadSanitizer reported it as an unlock of an unlocked mutex).
TEST_CASE("locks: a thread cancelled in CondVar::wait holds its mutex until its MutexLock ends",
          "[core][locks]") {
    Waiter w;
    pthread_t thread;
    REQUIRE(pthread_create(&thread, nullptr, &wait_forever, &w) == 0);
    while (!w.waiting) sched_yield();
    {  // the waiter is in the wait (or about to be): it let the mutex go
        kcache::MutexLock lock(w.mutex);
    }
    REQUIRE(pthread_cancel(thread) == 0);
    while (!w.probe) sched_yield();
    const bool held_while_unwinding = !w.mutex.try_lock();
    if (!held_while_unwinding) w.mutex.unlock();
    w.looked = true;
    void* result = nullptr;
    REQUIRE(pthread_join(thread, &result) == 0);
    CHECK(result == PTHREAD_CANCELED);
    CHECK(held_while_unwinding);
    // And once its scope ended, the mutex is free, exactly once.
    REQUIRE(w.mutex.try_lock());
    w.mutex.unlock();
}

TEST_CASE("locks: a MutexLock that adopts a try_lock() lets the mutex go once, at its end",
          "[core][locks]") {
    kcache::Mutex mutex;
    REQUIRE(mutex.try_lock());
    {
        kcache::MutexLock lock(mutex, std::adopt_lock);
        bool taken = true;
        std::thread other([&] {
            taken = mutex.try_lock();
            if (taken) mutex.unlock();
        });
        other.join();
        CHECK_FALSE(taken);  // still held: adopting took nothing and gave nothing back
    }
    REQUIRE(mutex.try_lock());
    mutex.unlock();
}

TEST_CASE("locks: SharedMutex is held by readers together and by a writer alone", "[core][locks]") {
    kcache::SharedMutex mutex;
    std::atomic<bool> wrote{false};
    std::thread writer;
    {
        kcache::ReaderLock reader(mutex);
        // A second reader gets in while the first holds it (a writer's hold would hang it).
        std::thread second([&] { kcache::ReaderLock lock(mutex); });
        second.join();
        writer = std::thread([&] {
            kcache::WriterLock lock(mutex);
            wrote = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK_FALSE(wrote.load());  // the writer waits for the reader
    }
    writer.join();  // the reader let go: the writer got it
    CHECK(wrote.load());
    {
        kcache::WriterLock lock(mutex);  // and let it go at its end
    }
    kcache::ReaderLock again(mutex);
}
