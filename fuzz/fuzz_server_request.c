/* Fuzz the server's request parser (src/server/request.c): the first byte
 * selects the endpoint (even: /v1/completions, odd: /v1/chat/completions
 * with a ChatML template), the rest is the body. Whatever the bytes, the
 * parser answers 0 with a prompt that fits the context and max_tokens in
 * range, or an HTTP status of 400..599 with a message; never a crash. The
 * tokenizer is the gpt2 fixture (tests/data in the source tree). */
#include "server/server_internal.h"
#include "flextier/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ft_tokenizer *tok;
static struct ft_chat_template *tmpl;
static int loaded;

static void load(void)
{
    loaded = 1;
    char p[1200];
#ifdef FT_SOURCE_DIR
    snprintf(p, sizeof p, "%s/tests/data/tokenizers/gpt2/tokenizer.json", FT_SOURCE_DIR);
#else
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    snprintf(p, sizeof p, "%s/../tests/data/tokenizers/gpt2/tokenizer.json", dir);
#endif
    if (ft_tokenizer_load(p, &tok) != FT_OK) abort();
    static const char chatml[] =
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    if (ft_chat_template_load_string(chatml, "<s>", "</s>", &tmpl) != FT_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ft_log_set_level(FT_LOG_ERROR);
    if (!size) return 0;
    if (!loaded) load();
    srv_limits L = {512, 4, 64, 256, (int)ft_tokenizer_vocab_size(tok), tok, tmpl};
    srv_gen g;
    char err[1024];
    const char *param = NULL;
    int code = srv_parse_request(&L, data[0] & 1, (const char *)data + 1, size - 1, &g, err, sizeof err, &param);
    if (code) {
        if (code < 400 || code > 599 || !err[0] || strlen(err) >= sizeof err) abort();
        return 0;
    }
    if (!g.plen || g.plen >= (size_t)L.ctx || g.max_tokens < 1 || (size_t)g.max_tokens + g.plen > (size_t)L.ctx ||
        g.n < 1 || g.n > (int)L.max_n || g.nstop > SRV_MAX_STOP)
        abort();
    for (size_t i = 0; i < g.plen; i++)
        if (g.prompt[i] < 0 || g.prompt[i] >= L.vocab) abort();
    srv_gen_free(&g);
    return 0;
}
