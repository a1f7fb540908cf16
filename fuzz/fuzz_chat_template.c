/* Fuzz the chat template parser and renderer. The first byte is a mode:
 * bit 3 clear: the rest is a template, rendered with fixed variables (bit 0
 * adds tools and tool calls, bit 1 add_generation_prompt); bit 3 set: the
 * rest is the messages JSON (what a server's clients send) applied with a
 * fixed tool-calling template through ft_chat_template_apply. Whatever the
 * input, parse and render return a status (never crash, hang or read out of
 * bounds), a render is deterministic, and every error says why; the limits
 * are small so that loops and recursion end fast. */
#include "flextier/chat.h"
#include "model/jinja.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *vars_plain =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi é 😀\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"reasoning_content\": \"r\"}, {\"role\": \"user\", \"content\": "
    "[{\"type\": \"text\", \"text\": \"part\"}, {\"type\": \"image\"}]}], \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"tools\": null, \"documents\": null, \"n\": 3, \"f\": 2.5, \"z\": null}";
static const char *vars_tools =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"weather?\"}, {\"role\": \"assistant\", \"content\": \"\", "
    "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get\", \"arguments\": "
    "{\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"18\"}], "
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"description\": \"d\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}], "
    "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

static const char *fixed_template =
    "{%- if tools %}{{ '<tools>' + tools|map(attribute='function')|map('tojson')|join('\\n') + '</tools>' }}{% endif %}"
    "{%- for m in messages %}{%- if m.content is string %}{% set c = m.content|trim %}"
    "{%- elif m.content is iterable %}{% set c = m.content|selectattr('type', 'equalto', 'text')|map(attribute='text')|join %}"
    "{%- else %}{% set c = m.content|string %}{% endif %}"
    "<|{{ m.role|default('?') }}|>{{ c }}{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{%- for tc in m.tool_calls|default([]) %}<call>{{ tc.function.name ~ (tc.function.arguments|tojson) }}</call>{% endfor %}"
    "{%- if loop.last and add_generation_prompt %}<|assistant|>{% endif %}{% endfor %}";

static void fuzz_messages(const uint8_t *data, size_t size, int agp)
{
    static ft_chat_template *t;
    if (!t && ft_chat_template_load_string(fixed_template, "<s>", "</s>", &t) != FT_OK) abort();
    char *msgs = malloc(size + 1);
    if (!msgs) return;
    memcpy(msgs, data, size);
    msgs[size] = 0;
    char *out = NULL;
    static const char *extra_tools =
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": {\"type\": \"object\"}}}]}";
    ft_status st = ft_chat_template_apply(t, msgs, agp, agp ? extra_tools : NULL, &out);
    if (st == FT_OK && !out) abort();
    if (st != FT_OK && (out || !*ft_last_error())) abort();
    free(out);
    free(msgs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t mode = data[0];
    if (mode & 8) {
        fuzz_messages(data + 1, size - 1, mode & 1);
        return 0;
    }
    ft_jinja *t = NULL;
    if (ft_jinja_parse((const char *)data + 1, size - 1, &t) != FT_OK) return 0;
    json_object *vars = json_tokener_parse((mode & 1) ? vars_tools : vars_plain);
    if (!vars) abort();
    json_object_object_add(vars, "add_generation_prompt", json_object_new_boolean(mode & 2));
    ft_jinja_limits lim = {.max_output = 1 << 18, .max_memory = 32 << 20, .max_steps = 200000, .max_depth = 100};
    char *out = NULL;
    size_t n = 0;
    ft_status st = ft_jinja_render(t, vars, 86400, &lim, &out, &n);
    if (st == FT_OK) {
        if (!out || out[n] != 0) abort();
        /* the render is deterministic */
        char *out2 = NULL;
        size_t n2 = 0;
        if (ft_jinja_render(t, vars, 86400, &lim, &out2, &n2) != FT_OK || n2 != n || memcmp(out, out2, n)) abort();
        free(out2);
    } else if (!*ft_last_error()) {
        abort();   /* every error says why */
    }
    free(out);
    json_object_put(vars);
    ft_jinja_free(t);
    return 0;
}
