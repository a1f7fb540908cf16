/* Internal: the Jinja subset interpreter behind flextier/chat.h.
 *
 * ft_jinja_parse compiles a template (jinja2's lexer and parser rules with
 * trim_blocks and lstrip_blocks); ft_jinja_render renders it with the
 * variables of a json-c object, as jinja2's ImmutableSandboxedEnvironment
 * with transformers' globals and filters does. Both report errors through
 * ft_set_error with the template line. A parsed template is immutable:
 * renders may run concurrently. */
#ifndef FT_MODEL_JINJA_H
#define FT_MODEL_JINJA_H

#include "flextier/core.h"

#include <stddef.h>

struct json_object;

typedef struct ft_jinja ft_jinja;

/* Limits of one render (0 = default). */
typedef struct ft_jinja_limits {
    size_t max_output;      /* bytes of rendered text (default 16 MiB)     */
    size_t max_memory;      /* bytes the render may allocate (256 MiB)     */
    uint64_t max_steps;     /* evaluation steps, loops included (2e7)      */
    unsigned max_depth;     /* nesting of calls, expressions, blocks (200) */
} ft_jinja_limits;

/* src: the template (len bytes, need not be NUL-terminated). */
FT_API ft_status ft_jinja_parse(const char *src, size_t len, ft_jinja **out);
FT_API void ft_jinja_free(ft_jinja *t);

/* vars: a JSON object whose members become the template's variables
 * (NULL: none). now: the time strftime_now() formats (seconds since the
 * epoch, local time). *out is malloc'd and NUL-terminated; *out_len
 * excludes the NUL. */
FT_API ft_status ft_jinja_render(const ft_jinja *t, struct json_object *vars, int64_t now,
                                 const ft_jinja_limits *lim, char **out, size_t *out_len);

#endif
