/*
 * flextier/chat.h - chat templates: render a model's Jinja chat template
 * (tokenizer_config.json "chat_template" or chat_template.jinja) exactly as
 * Hugging Face transformers renders it with jinja2 (an immutable sandboxed
 * environment with trim_blocks and lstrip_blocks, the loopcontrols
 * extension, transformers' tojson / raise_exception / strftime_now / dict /
 * namespace globals). See docs/chat-templates.md for the Jinja subset and
 * what is refused.
 *
 * Thread-safety: a loaded ft_chat_template is immutable; any number of
 * threads may call ft_chat_template_apply on it at once.
 *
 * Errors (template syntax, raise_exception, type errors, what the sandbox
 * refuses, anything outside the supported subset) return a status with a
 * detail in ft_last_error() that names the template line. Rendering is
 * bounded (recursion depth, loop iterations, output and memory size): a
 * hostile template gets an error, never a hang or a crash.
 */
#ifndef FLEXTIER_CHAT_H
#define FLEXTIER_CHAT_H

#include "flextier/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ft_chat_template ft_chat_template;

/* Load the chat template of a model directory, where transformers looks:
 * chat_template.jinja (with additional_chat_templates/tool_use.jinja), else
 * tokenizer_config.json's "chat_template" (a string, or a list of {"name",
 * "template"} from which "default" is used, and "tool_use" instead when the
 * apply call passes tools and the model has one), else chat_template.json.
 * The special tokens (bos_token, eos_token, unk_token, sep_token,
 * pad_token, cls_token, mask_token) come from tokenizer_config.json (a
 * string or an AddedToken object {"content": ...}); absent ones are
 * undefined in the template.
 * FT_ERR_NOT_FOUND (detail says so) when the model has no chat template;
 * FT_ERR_CORRUPT for a malformed file; FT_ERR_UNSUPPORTED / FT_ERR_CORRUPT
 * for a template that does not parse (detail names the line). */
FT_API ft_status ft_chat_template_load_dir(const char *model_dir, ft_chat_template **out);

/* Compile a template from its source. bos_token / eos_token may be NULL
 * (then undefined in the template). */
FT_API ft_status ft_chat_template_load_string(const char *source, const char *bos_token,
                                              const char *eos_token, ft_chat_template **out);

/* Render. messages_json: a JSON array of OpenAI-style messages (objects).
 * add_generation_prompt: bound as a boolean. extra_json: NULL or a JSON
 * object of further variables (tools, documents, enable_thinking, any
 * key; a key given here overrides bos_token / eos_token / messages).
 * Variables the caller does not give are undefined, except tools and
 * documents, which are none (as transformers passes them). As transformers'
 * apply_chat_template does, message keys whose value is null are dropped
 * and a message's reasoning given as "reasoning_content", "thinking" or
 * "reasoning" is visible under "thinking" and "reasoning_content".
 * strftime_now() reads SOURCE_DATE_EPOCH when it is set, else the clock
 * (local time, as Python's datetime.now()).
 * *out_text: malloc'd, NUL-terminated (free()); set only on success. */
FT_API ft_status ft_chat_template_apply(const ft_chat_template *t, const char *messages_json,
                                        int add_generation_prompt, const char *extra_json,
                                        char **out_text);

FT_API void ft_chat_template_free(ft_chat_template *t);   /* NULL ok */

/* Render with every variable given by one JSON object (messages,
 * add_generation_prompt, bos_token, eos_token, tools, ...): no message
 * normalization, JSON null bound as a defined none; this is what
 * `flextier chat-template render TEMPLATE VARS_JSON` runs. Same ownership
 * and errors as ft_chat_template_apply; *out_len excludes the NUL (the
 * render may contain NUL bytes from the variables' strings). */
FT_API ft_status ft_chat_template_render_json(const ft_chat_template *t, const char *vars_json,
                                              char **out_text, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
