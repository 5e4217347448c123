/* kcache-bench-c-reader: reads cache entries the way a native compiler or ccache
 * does (open, fstat for the size, read the whole file, close), so the hit flow can
 * be timed without Python's start-up and per-open overhead hiding the round trips.
 *
 * Usage: kcache-bench-c-reader ROOT N SALT
 * reads ROOT/<SALT><i:06d>/{k.json,k.cubin,k.ptx} for i in [0, N), the files
 * bench/fsd_flows.py's store flow writes; exits 1 if one is missing or empty. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char* const kNames[] = {"k.json", "k.cubin", "k.ptx"};

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s ROOT N SALT\n", argv[0]);
        return 2;
    }
    const char* root = argv[1];
    const long n = strtol(argv[2], NULL, 10);
    const char* salt = argv[3];
    char path[4096];
    char* buf = NULL;
    size_t cap = 0;
    unsigned long long total = 0;
    for (long i = 0; i < n; ++i) {
        for (size_t k = 0; k < sizeof kNames / sizeof kNames[0]; ++k) {
            snprintf(path, sizeof path, "%s/%s%06ld/%s", root, salt, i, kNames[k]);
            const int fd = open(path, O_RDONLY | O_CLOEXEC);
            struct stat st;
            if (fd < 0 || fstat(fd, &st) != 0) {
                perror(path);
                return 1;
            }
            /* The size from fstat, then reads until EOF, as ccache's read_file() does:
             * the final read that returns 0 is part of the pattern. */
            const size_t want = (size_t)st.st_size + 1;
            if (want > cap) {
                cap = want;
                buf = realloc(buf, cap);
                if (!buf) return 1;
            }
            size_t got = 0;
            for (;;) {
                const ssize_t r = read(fd, buf + got, cap - got);
                if (r < 0) {
                    perror(path);
                    return 1;
                }
                if (r == 0) break;
                got += (size_t)r;
                if (got == cap) {
                    cap *= 2;
                    buf = realloc(buf, cap);
                    if (!buf) return 1;
                }
            }
            close(fd);
            if (got == 0) {
                fprintf(stderr, "%s: empty\n", path);
                return 1;
            }
            total += got;
        }
    }
    free(buf);
    return total > 0 ? 0 : 1;
}
