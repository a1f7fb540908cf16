/* Test support: how much of a file the page cache holds (mincore of a
 * mapping of it), and dropping a file's pages, for the tests that check
 * reads past the page cache (O_DIRECT) leave nothing cached. */
#ifndef FT_SUPPORT_PAGECACHE_H
#define FT_SUPPORT_PAGECACHE_H
#include <stdint.h>

/* Pages of [off, off + len) of the file at path in the page cache (len
 * UINT64_MAX: to the end); -1 when it cannot be told. An empty file: 0. */
long ft_test_cached_pages(const char *path, uint64_t off, uint64_t len);
/* The same over every file of a directory (not recursive); -1: unknown. */
long ft_test_dir_cached_pages(const char *dir);
/* Drop the file's pages from the page cache, written back first (dirty
 * pages stay). */
void ft_test_evict(const char *path);
/* ft_test_evict on every file of a directory; -1 when it cannot be read. */
int ft_test_dir_evict(const char *dir);
#endif
