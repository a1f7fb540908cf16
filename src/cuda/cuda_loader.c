/* The CUDA backend's API in libflextier, in every build: each ft_cuda_*
 * function forwards to the plugin libflextier-cuda.so (cuda_plugin.h),
 * opened with dlopen the first time a function needs the backend. A
 * process that never asks for CUDA (a CPU run, --version, --help) maps no
 * CUDA library; freeing NULL, or asking the size of nothing, loads
 * nothing either.
 *
 * Where the plugin is looked for (docs/cuda.md "The plugin"), first found
 * wins:
 *   $FLEXTIER_CUDA_PLUGIN            a path (only this one when set)
 *   DIR/libflextier-cuda.so          DIR: where the object holding this
 *                                    code is (libflextier.so, or the
 *                                    program that linked the static
 *                                    library, or the Python module)
 *   DIR/flextier/libflextier-cuda.so an installed libflextier.so
 *   DIR/<bin to lib>/flextier/...    an installed program (bin/../lib/flextier)
 *   <libdir>/flextier/...            the configured install directory
 *   <build dir>/libflextier-cuda.so  the build tree (tests run from it)
 * A plugin from another build is refused (its build id differs): it would
 * read this build's models with its own copy of the engine. */
#define _GNU_SOURCE
#include "cuda_plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FT_CUDA_PLUGIN_BUILT
#define FT_CUDA_PLUGIN_BUILT 0
#endif
#ifndef FT_CUDA_BUILD_ID
#define FT_CUDA_BUILD_ID ""
#endif
#ifndef FT_CUDA_BIN_TO_PLUGIN
#define FT_CUDA_BIN_TO_PLUGIN "../lib/flextier"
#endif
#ifndef FT_CUDA_PLUGIN_INSTALL_DIR
#define FT_CUDA_PLUGIN_INSTALL_DIR ""
#endif
#ifndef FT_CUDA_PLUGIN_BUILD_DIR
#define FT_CUDA_PLUGIN_BUILD_DIR ""
#endif

#define NO_BACKEND "this build has no CUDA backend (configured with FT_CUDA=OFF, as a sanitizer/fuzzing/Python " \
                   "build, or without a CUDA compiler; rebuild with the CUDA toolkit installed, or set "        \
                   "FLEXTIER_CUDA_PLUGIN to the " FT_CUDA_PLUGIN_FILE " of this same build)"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const ft_cuda_plugin_api *g_api;
static ft_status g_status = FT_ERR_UNSUPPORTED;
static char g_why[1024];   /* why the plugin is not there (set once, read-only after) */

int ft_cuda_built(void) { return FT_CUDA_PLUGIN_BUILT; }

static void set_why(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_why(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_why, sizeof g_why, fmt, ap);   /* a long path is cut, not overrun */
    va_end(ap);
}

/* ------------------------------------------------------------- finding it */

/* Is any /dev/nvidia<N> present? (only to word an error) */
static int gpu_node(void)
{
    int node = 0;
    DIR *d = opendir("/dev");
    if (!d) return 0;
    struct dirent *e;
    while (!node && (e = readdir(d)))
        node = !strncmp(e->d_name, "nvidia", 6) && e->d_name[6] >= '0' && e->d_name[6] <= '9';
    closedir(d);
    return node;
}

struct find_self {
    uintptr_t addr;
    char path[PATH_MAX];
    int found;
};

static int find_self_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct find_self *f = arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (f->addr >= lo && f->addr < lo + ph->p_memsz) {
            /* the main program has no name here */
            const char *name = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
            if (!realpath(name, f->path)) snprintf(f->path, sizeof f->path, "%s", name);
            f->found = 1;
            return 1;
        }
    }
    return 0;
}

/* The directory of the object (library, program, module) this code is in. */
static int self_dir(char *out, size_t cap)
{
    struct find_self f = {.addr = (uintptr_t)(void *)self_dir};
    dl_iterate_phdr(find_self_cb, &f);
    if (!f.found) return -1;
    char *slash = strrchr(f.path, '/');
    if (!slash) return -1;
    *slash = 0;
    snprintf(out, cap, "%s", f.path);
    return 0;
}

/* Open one candidate: 1 loaded (g_api set), 0 not there, -1 there but
 * unusable (g_why says why). */
static int try_open(const char *given)
{
    if (access(given, F_OK)) return 0;
    char real[PATH_MAX];
    const char *path = realpath(given, real) ? real : given;   /* bin/../lib/... said plainly */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        if (!gpu_node())
            set_why("no NVIDIA GPU or driver found (and the CUDA backend %s cannot be loaded: %s)",
                     path, e ? e : "?");
        else
            set_why("cannot load the CUDA backend %s: %s", path, e ? e : "?");
        return -1;
    }
    ft_cuda_plugin_entry_fn entry;
    *(void **)&entry = dlsym(h, FT_CUDA_PLUGIN_ENTRY);
    const ft_cuda_plugin_api *a = entry ? entry() : NULL;
    if (!a) {
        set_why("%s is not a FlexTier CUDA backend plugin (no %s)", path, FT_CUDA_PLUGIN_ENTRY);
    } else if (a->abi != FT_CUDA_PLUGIN_ABI || a->size != sizeof *a || !a->build_id ||
               strcmp(a->build_id, FT_CUDA_BUILD_ID) || !*FT_CUDA_BUILD_ID) {
        set_why("the CUDA backend %s is from another build of FlexTier (%s, build %s; this library: %s, build %s): "
                 "use the plugin built with this library", path, a->abi == FT_CUDA_PLUGIN_ABI && a->version ? a->version : "?",
                 a->abi == FT_CUDA_PLUGIN_ABI && a->build_id ? a->build_id : "?", FT_VERSION_STRING,
                 *FT_CUDA_BUILD_ID ? FT_CUDA_BUILD_ID : "none");
        a = NULL;
    }
    if (!a) {
        dlclose(h);
        return -1;
    }
    g_api = a;   /* the plugin stays loaded for the life of the process */
    return 1;
}

static void load(void)
{
    const char *env = getenv("FLEXTIER_CUDA_PLUGIN");
    if (env && *env) {
        int r = try_open(env);
        if (r == 0) set_why("FLEXTIER_CUDA_PLUGIN=%s: no such file", env);
        return;
    }
    char dir[PATH_MAX], cand[6][PATH_MAX + 64];
    int n = 0;
    if (!self_dir(dir, sizeof dir)) {
        snprintf(cand[n++], sizeof cand[0], "%s/%s", dir, FT_CUDA_PLUGIN_FILE);
        snprintf(cand[n++], sizeof cand[0], "%s/flextier/%s", dir, FT_CUDA_PLUGIN_FILE);
        snprintf(cand[n++], sizeof cand[0], "%s/%s/%s", dir, FT_CUDA_BIN_TO_PLUGIN, FT_CUDA_PLUGIN_FILE);
    }
    if (*FT_CUDA_PLUGIN_INSTALL_DIR)
        snprintf(cand[n++], sizeof cand[0], "%s/%s", FT_CUDA_PLUGIN_INSTALL_DIR, FT_CUDA_PLUGIN_FILE);
    if (*FT_CUDA_PLUGIN_BUILD_DIR)
        snprintf(cand[n++], sizeof cand[0], "%s/%s", FT_CUDA_PLUGIN_BUILD_DIR, FT_CUDA_PLUGIN_FILE);
    for (int i = 0; i < n; i++) {
        int r = try_open(cand[i]);
        if (r > 0) return;
        if (r < 0) break;   /* found but unusable: that is the answer */
    }
    if (g_why[0]) return;
    if (!FT_CUDA_PLUGIN_BUILT) {
        set_why("%s", NO_BACKEND);
        return;
    }
    char dirs[sizeof g_why] = "";
    for (int i = 0; i < n; i++) {
        char *slash = strrchr(cand[i], '/');
        if (slash) *slash = 0;
        size_t o = strlen(dirs), l = strlen(cand[i]);
        if (o + l + 3 > sizeof dirs) break;
        memcpy(dirs + o, i ? ", " : " ", i ? 2 : 1);
        memcpy(dirs + o + (i ? 2 : 1), cand[i], l + 1);
    }
    set_why("the CUDA backend %s was not found (looked in%s; set FLEXTIER_CUDA_PLUGIN to its path)",
            FT_CUDA_PLUGIN_FILE, dirs);
}

/* The plugin's table, or NULL with the reason in ft_last_error(). */
static const ft_cuda_plugin_api *plugin(void)
{
    pthread_once(&g_once, load);
    if (!g_api) {
        ft_set_error(g_status, "%s", g_why);
        return NULL;
    }
    g_api->clear_error();
    g_api->set_log_level(ft_log_get_level());
    return g_api;
}

/* After a call into the plugin: its error detail becomes the caller's
 * (kept as it is when the plugin set none: a hook of the caller's failed). */
static ft_status done(ft_status st)
{
    if (st != FT_OK) {
        const char *e = g_api->last_error();
        if (e && *e) ft_set_error(st, "%s", e);
    }
    return st;
}

#define FORWARD(call)                                       \
    do {                                                    \
        const ft_cuda_plugin_api *P = plugin();             \
        if (!P) return g_status;                            \
        return done(P->call);                               \
    } while (0)

/* ----------------------------------------------------------- the API */

ft_status ft_cuda_available(char *detail, size_t n)
{
    const ft_cuda_plugin_api *P = plugin();
    if (!P) {
        if (detail && n) snprintf(detail, n, "%s", g_why);
        return g_status;
    }
    return done(P->available(detail, n));
}

ft_status ft_cuda_device_info_get(int device, ft_cuda_device_info *out) { FORWARD(device_info_get(device, out)); }
ft_status ft_cuda_malloc(size_t n, void **out) { FORWARD(malloc_(n, out)); }
ft_status ft_cuda_host_alloc(size_t n, void **out) { FORWARD(host_alloc(n, out)); }
ft_status ft_cuda_copy_to_device(void *dst, const void *src, size_t n) { FORWARD(copy_to_device(dst, src, n)); }
ft_status ft_cuda_copy_to_host(void *dst, const void *src, size_t n) { FORWARD(copy_to_host(dst, src, n)); }

/* Frees and queries on NULL need no backend (the session calls them on
 * every close, CPU or not); anything else came from the plugin. */
void ft_cuda_free(void *p)
{
    if (p && plugin()) g_api->free_(p);
}

void ft_cuda_host_free(void *p)
{
    if (p && plugin()) g_api->host_free(p);
}

ft_status ft_cuda_convert(void *dst, ft_dtype dst_dt, const void *src, ft_dtype src_dt, size_t n)
{
    FORWARD(convert(dst, dst_dt, src, src_dt, n));
}

ft_status ft_cuda_decoder_create(int device, ft_cuda_decoder **out)
{
    if (out) *out = NULL;
    FORWARD(decoder_create(device, out));
}

void ft_cuda_decoder_free(ft_cuda_decoder *d)
{
    if (d && plugin()) g_api->decoder_free(d);
}

ft_status ft_cuda_decode_frame(ft_cuda_decoder *d, const void *frame, size_t size, ft_dtype out_dtype, void *dst,
                               size_t cap, ft_frame_info *info)
{
    FORWARD(decode_frame(d, frame, size, out_dtype, dst, cap, info));
}

ft_status ft_cuda_qrow_encode(int bits, const float *src, size_t rows, size_t n, uint32_t group, void *dst)
{
    FORWARD(qrow_encode(bits, src, rows, n, group, dst));
}

ft_status ft_cuda_qrow_decode(int bits, const void *src, size_t rows, size_t n, uint32_t group, float *dst)
{
    FORWARD(qrow_decode(bits, src, rows, n, group, dst));
}

ft_status ft_cuda_layer_source_hook(void *source, int layer, ft_cuda_wsrc *src)
{
    FORWARD(layer_source_hook(source, layer, src));
}

ft_status ft_cuda_ctx_create(const ft_model *m, const ft_cuda_ctx_params *p, ft_cuda_ctx **out)
{
    if (out) *out = NULL;
    FORWARD(ctx_create(m, p, out));
}

void ft_cuda_ctx_free(ft_cuda_ctx *c)
{
    if (c && plugin()) g_api->ctx_free(c);
}

ft_status ft_cuda_ctx_forward(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                              const size_t *ntok, float *logits, int all_rows)
{
    FORWARD(ctx_forward(c, n, slots, tokens, ntok, logits, all_rows));
}

ft_status ft_cuda_ctx_forward_greedy(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                                     const size_t *ntok, int32_t *next)
{
    FORWARD(ctx_forward_greedy(c, n, slots, tokens, ntok, next));
}

void ft_cuda_ctx_reset(ft_cuda_ctx *c, int slot)
{
    if (c && plugin()) g_api->ctx_reset(c, slot);
}

int ft_cuda_ctx_seq_len(const ft_cuda_ctx *c, int slot) { return c && plugin() ? g_api->ctx_seq_len(c, slot) : 0; }

ft_status ft_cuda_ctx_kv(ft_cuda_ctx *c, int layer, int slot, float *k, float *v, int *len, int *kv_dim)
{
    FORWARD(ctx_kv(c, layer, slot, k, v, len, kv_dim));
}

void ft_cuda_ctx_get_stats(const ft_cuda_ctx *c, ft_cuda_stats *out)
{
    if (!out) return;
    if (c && plugin()) g_api->ctx_get_stats(c, out);
    else *out = (ft_cuda_stats){0};
}

/* The context as the generation loop sees it: forwarders of this file, so
 * errors reach the caller's ft_last_error() like every other call. */
static ft_status ops_forward_last(void *ctx, size_t n, const int *slots, const int32_t *const *tokens,
                                  const size_t *ntok, float *logits)
{
    return ft_cuda_ctx_forward(ctx, n, slots, tokens, ntok, logits, 0);
}

static ft_status ops_forward_greedy(void *ctx, size_t n, const int *slots, const int32_t *const *tokens,
                                    const size_t *ntok, int32_t *next)
{
    return ft_cuda_ctx_forward_greedy(ctx, n, slots, tokens, ntok, next);
}

static void ops_reset(void *ctx, int slot) { ft_cuda_ctx_reset(ctx, slot); }

void ft_cuda_ctx_forward_ops(ft_cuda_ctx *c, ft_forward_ops *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!c || !plugin()) return;   /* no context exists without the plugin */
    const ft_model *m = NULL;
    g_api->ctx_shape(c, &m, &out->max_batch, &out->max_seq);
    out->ctx = c;
    out->cfg = ft_model_get_config(m);
    out->forward = ops_forward_last;
    out->forward_greedy = ops_forward_greedy;
    out->reset = ops_reset;
}

ft_status ft_cuda_generate(ft_cuda_ctx *c, size_t n, const int32_t *const *prompts, const size_t *prompt_len,
                           const ft_gen_params *p, int32_t *const *out, size_t *n_out, ft_gen_stats *stats)
{
    if (!c) return plugin() ? ft_set_error(FT_ERR_INVALID_ARG, "generate: NULL context") : g_status;
    ft_forward_ops f;
    ft_cuda_ctx_forward_ops(c, &f);
    return ft_generate_with(&f, n, prompts, prompt_len, p, out, n_out, stats);
}

ft_status ft_cuda_host_weights_create(const ft_model *m, const ft_cuda_host_weights_params *p,
                                      ft_cuda_host_weights **out)
{
    if (out) *out = NULL;
    FORWARD(host_weights_create(m, p, out));
}

void ft_cuda_host_weights_free(ft_cuda_host_weights *hw)
{
    if (hw && plugin()) g_api->host_weights_free(hw);
}

uint64_t ft_cuda_host_weights_bytes(const ft_cuda_host_weights *hw)
{
    return hw && plugin() ? g_api->host_weights_bytes(hw) : 0;
}

ft_status ft_cuda_host_weights_hook(void *hw, int layer, ft_cuda_wsrc *src) { FORWARD(host_weights_hook(hw, layer, src)); }
