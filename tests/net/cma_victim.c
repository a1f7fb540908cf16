/* The test's setuid helper (test_cma.c installs a copy setuid-root): a
 * program a verified client execs. It holds a secret and prints where, as
 * the attack of issue 21 did, then waits to be killed. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char secret[64];

int main(void)
{
    strcpy(secret, "root-only secret of the setuid helper");
    printf("%016llx\n", (unsigned long long)(uintptr_t)secret);
    fflush(stdout);
    for (int i = 0; i < 600; i++) sleep(1);
    return 0;
}
