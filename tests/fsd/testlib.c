/* A shared library the fsd tests copy into the mount and dlopen from there (compilers
 * such as Triton dlopen launcher .so files from their cache dirs). */
#define KCACHE_TESTLIB_EXPORT __attribute__((visibility("default")))

static const char kcache_testlib_tag[] = "kcache-fsd-testlib";

/* Returns 2 * x + 1, and reads a constant so that the data segment is mapped too. */
KCACHE_TESTLIB_EXPORT int kcache_testlib_answer(int x) {
    return 2 * x + 1 + (kcache_testlib_tag[0] == 'k' ? 0 : 1000);
}
