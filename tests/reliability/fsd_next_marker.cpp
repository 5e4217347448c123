// Linked into kcache-fsd-next only (tests/reliability/CMakeLists.txt): the upgrade test
// needs a second build of kcache-fsd that is another binary, and checks this text.
extern "C" {
extern const char kcache_fsd_next_marker[];
[[gnu::used]] const char kcache_fsd_next_marker[] = "kcache-fsd-next: a second build of kcache-fsd";
}
