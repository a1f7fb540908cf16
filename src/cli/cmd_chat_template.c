/* flextier chat-template: render chat templates (debugging, checks).
 *   render TEMPLATE_FILE VARS_JSON   the template with every variable from a JSON object
 *   apply MODEL_DIR MESSAGES_JSON [--add-generation-prompt] [--extra JSON_FILE]
 *                                    the model's template as a server applies it */
#include "cli.h"
#include "flextier/chat.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: flextier chat-template render TEMPLATE_FILE VARS_JSON\n"
    "       flextier chat-template apply MODEL_DIR MESSAGES_JSON [--add-generation-prompt] [--extra FILE]\n"
    "\n"
    "render: prints the render of a Jinja chat template with the variables of a JSON\n"
    "  object file (messages, add_generation_prompt, bos_token, eos_token, tools,\n"
    "  documents, any other key; null is a defined none) to stdout exactly, as\n"
    "  Hugging Face transformers renders it with jinja2. Exits 1 with the template's\n"
    "  message where jinja2 raises (raise_exception, type errors, the sandbox).\n"
    "apply: the chat template of a model directory on a JSON array of messages, with\n"
    "  transformers' apply_chat_template conventions (tools/documents none unless\n"
    "  given in --extra, a JSON object of further variables).\n"
    "strftime_now() formats SOURCE_DATE_EPOCH when it is set, else the current time.\n"
    "'-' reads a file from stdin.\n";

/* a file as a NUL-terminated string (refuses NUL bytes inside) */
static ft_status read_text(const char *path, char **out)
{
    uint8_t *data;
    size_t n;
    ft_status st = ft_cli_read_file(path, &data, &n);
    if (st != FT_OK) return st;
    if (memchr(data, 0, n)) {
        ft_free_aligned(data);
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: contains a NUL byte", path);
    }
    char *s = malloc(n + 1);
    if (!s) { ft_free_aligned(data); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
    memcpy(s, data, n);
    s[n] = 0;
    ft_free_aligned(data);
    *out = s;
    return FT_OK;
}

static int write_out(const char *text, size_t n)
{
    if (n && fwrite(text, 1, n, stdout) != n) { fprintf(stderr, "flextier: chat-template: write error\n"); return FT_EXIT_ERR; }
    if (fflush(stdout)) { fprintf(stderr, "flextier: chat-template: write error\n"); return FT_EXIT_ERR; }
    return FT_EXIT_OK;
}

static int cmd_render(int argc, char **argv)
{
    if (argc != 3) return ft_cli_usage_error(usage_text, "chat-template render takes TEMPLATE_FILE VARS_JSON");
    char *src = NULL, *vars = NULL, *text = NULL;
    size_t n = 0;
    ft_chat_template *t = NULL;
    int rc = FT_EXIT_ERR;
    ft_status st = read_text(argv[1], &src);
    if (st == FT_OK) st = read_text(argv[2], &vars);
    if (st == FT_OK) st = ft_chat_template_load_string(src, NULL, NULL, &t);
    if (st == FT_OK) st = ft_chat_template_render_json(t, vars, &text, &n);
    if (st == FT_OK) rc = write_out(text, n);
    else rc = ft_cli_fail("chat-template", st);
    free(src);
    free(vars);
    free(text);
    ft_chat_template_free(t);
    return rc;
}

static int cmd_apply(int argc, char **argv)
{
    static const struct option opts[] = {
        {"add-generation-prompt", no_argument, NULL, 'g'}, {"extra", required_argument, NULL, 'e'},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int agp = 0, c;
    const char *extra_path = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "ge:h", opts, NULL)) != -1) {
        if (c == 'g') agp = 1;
        else if (c == 'e') extra_path = optarg;
        else if (c == 'h') { fputs(usage_text, stdout); return FT_EXIT_OK; }
        else return ft_cli_usage_error(usage_text, "chat-template apply: bad option");
    }
    if (argc - optind != 2) return ft_cli_usage_error(usage_text, "chat-template apply takes MODEL_DIR MESSAGES_JSON");
    char *msgs = NULL, *extra = NULL, *text = NULL;
    ft_chat_template *t = NULL;
    int rc;
    ft_status st = read_text(argv[optind + 1], &msgs);
    if (st == FT_OK && extra_path) st = read_text(extra_path, &extra);
    if (st == FT_OK) st = ft_chat_template_load_dir(argv[optind], &t);
    if (st == FT_OK) st = ft_chat_template_apply(t, msgs, agp, extra, &text);
    if (st == FT_OK) rc = write_out(text, strlen(text));
    else rc = ft_cli_fail("chat-template", st);
    free(msgs);
    free(extra);
    free(text);
    ft_chat_template_free(t);
    return rc;
}

int ft_cmd_chat_template(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? FT_EXIT_USAGE : FT_EXIT_OK;
    }
    if (!strcmp(argv[1], "render")) return cmd_render(argc - 1, argv + 1);
    if (!strcmp(argv[1], "apply")) return cmd_apply(argc - 1, argv + 1);
    return ft_cli_usage_error(usage_text, "chat-template: unknown action '%s'", argv[1]);
}
