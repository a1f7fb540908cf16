/* Test support: the reference fixtures recorded from transformers by
 * scripts/fixtures/gen_model_fixtures.py (tests/data/models{,-tf5}/NAME/):
 * fixtures.json (token prompts, greedy continuations, and for some the
 * prompts' texts) and logits.bin (per-position logits, f32). */
#ifndef FT_SUPPORT_FIXTURE_H
#define FT_SUPPORT_FIXTURE_H
#include <stddef.h>
#include <stdint.h>

#define FT_FIXTURE_MAXP   8    /* prompts kept */
#define FT_FIXTURE_MAXTOK 64   /* tokens kept per prompt */
#define FT_FIXTURE_MAXGEN 32   /* greedy tokens kept per prompt */

typedef struct ft_fixture {
    int     np;                                   /* prompts (<= MAXP) */
    int     ntexts, add_special;                  /* "texts", "add_special_tokens" */
    char    texts[FT_FIXTURE_MAXP][256];
    int32_t prompt[FT_FIXTURE_MAXP][FT_FIXTURE_MAXTOK];
    size_t  plen[FT_FIXTURE_MAXP];
    int32_t greedy[FT_FIXTURE_MAXP][FT_FIXTURE_MAXGEN];
    size_t  glen[FT_FIXTURE_MAXP];
    float  *logits;                               /* malloc'ed; ft_fixture_free */
    size_t  nlogits;
} ft_fixture;

/* $FT_TEST_DATA/SET/NAME (FT_TEST_DATA defaults to tests/data), e.g. set
 * "models" or "models-tf5". */
void ft_fixture_dir(const char *set, const char *name, char *dir, size_t n);

/* Load DIR/fixtures.json and DIR/logits.bin. 1 on success; 0 (with a line
 * on stderr naming the file) when either is missing or malformed, or when
 * a prompt, continuation or text is longer than the limits above. */
int ft_fixture_load(const char *dir, ft_fixture *f);
void ft_fixture_free(ft_fixture *f);

/* The fixture model directories of $FT_TEST_DATA/models (names, sorted),
 * listed once: *n of them, at most FT_FIXTURE_MAX_MODELS (more is a
 * failure of the caller's REQUIRE, never a silent cut). */
#define FT_FIXTURE_MAX_MODELS 64
const char (*ft_fixture_models(size_t *n))[256];

/* max |a[i] - b[i]|; NaN if any difference is NaN. */
float ft_max_abs_diff(const float *a, const float *b, size_t n);
#endif
