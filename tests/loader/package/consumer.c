/* Built against an installed kcache: the C ABI from C. */
#include <stdio.h>

#include <kcache/loader.h>

int main(int argc, char** argv) {
    kcache_cache* cache = NULL;
    kcache_entry* entry = NULL;
    kcache_selection selection;
    if (argc != 3) return 2;
    if (kcache_cache_open(argv[1], &cache) != KCACHE_OK ||
        kcache_entry_open(cache, argv[2], &entry) != KCACHE_OK ||
        kcache_entry_select_binary(entry, 90, &selection) != KCACHE_OK) {
        fprintf(stderr, "%s\n", kcache_last_error());
        return 1;
    }
    printf("%s %s\n", kcache_cache_kind(cache), selection.file);
    kcache_entry_close(entry);
    kcache_cache_close(cache);
    return 0;
}
