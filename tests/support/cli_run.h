/* Test support: running the flextier program and shell commands, reading
 * what they wrote. */
#ifndef FT_SUPPORT_CLI_RUN_H
#define FT_SUPPORT_CLI_RUN_H
#include <stddef.h>

/* The flextier program under test: $FT_BIN (ctest sets it), else
 * ./flextier. */
const char *ft_test_bin(void);

/* system() of the formatted command: its exit status, or -1 when it did
 * not exit normally (a signal) or the command does not fit 4 KiB. */
int ft_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The whole file plus a terminating NUL (free() it); *n (may be NULL) gets
 * its length. NULL when it cannot be read. */
char *ft_slurp(const char *path, size_t *n);

/* Does dir/name contain needle? If not, says so on stderr with the file's
 * text. */
int ft_file_has(const char *dir, const char *name, const char *needle);

/* A fresh directory /tmp/ft_<tag>_XXXXXX, removed with everything in it
 * when the test program exits; exits the program if it cannot be made. */
const char *ft_test_tmpdir(const char *tag);
#endif
