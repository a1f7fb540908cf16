/* Offloading policy: parse, validate, format, place. */
#include "flextier/offload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *tier_names[FT_TIER_COUNT] = {"device", "host", "disk", "remote"};

const char *ft_tier_name(ft_tier t)
{
    return (unsigned)t < FT_TIER_COUNT ? tier_names[t] : "?";
}

void ft_policy_default(ft_policy *p)
{
    memset(p, 0, sizeof *p);
    p->w_pct[FT_TIER_DEVICE] = 100;
    p->c_pct[FT_TIER_DEVICE] = 100;
    p->a_pct[FT_TIER_DEVICE] = 100;
    p->gpu_batch_size = 1;
    p->num_gpu_batches = 1;
    p->compress_weights = FT_CODEC_RAW;
    p->compress_cache = FT_CODEC_RAW;
    p->replicas = 1;
}

static ft_status parse_pcts(const char *key, const char *v, float *out)
{
    float tmp[FT_TIER_COUNT] = {0};
    int n = 0;
    const char *q = v;
    while (*q) {
        if (n == FT_TIER_COUNT)
            return ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: at most %d percentages", key, v, FT_TIER_COUNT);
        char *end;
        double d = strtod(q, &end);
        if (end == q || d < 0 || d > 100 || !isfinite(d))
            return ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: percentages are numbers in 0..100", key, v);
        tmp[n++] = (float)d;
        if (*end == ',') end++;
        else if (*end) return ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: expected comma-separated numbers", key, v);
        q = end;
    }
    if (n < 2) return ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: give 2 to 4 percentages (device,host,disk,remote)", key, v);
    memcpy(out, tmp, sizeof tmp);
    return FT_OK;
}

static ft_status parse_codec(const char *key, const char *v, int cache, ft_codec_id *out)
{
    ft_codec_id c, e;
    if (ft_codec_parse(v, &c, &e))
        return ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: unknown compression", key, v);
    if (c == FT_CODEC_BYTEPLANE && e != FT_CODEC_ZSTD)
        return ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: byteplane uses zstd here", key, v);
    if (c != FT_CODEC_RAW && c != FT_CODEC_Q8 && c != FT_CODEC_Q4 && (cache || c != FT_CODEC_BYTEPLANE))
        return ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: %s", key, v,
                            cache ? "cache compression is none, q8 or q4" : "weight compression is none, bp, q8 or q4");
    *out = c;
    return FT_OK;
}

static ft_status parse_remotes(const char *v, ft_policy *p)
{
    uint32_t n = 0;
    const char *q = v;
    while (*q) {
        const char *end = strchr(q, ',');
        size_t len = end ? (size_t)(end - q) : strlen(q);
        if (n == FT_MAX_REMOTES) return ft_set_error(FT_ERR_INVALID_ARG, "at most %d remote nodes", FT_MAX_REMOTES);
        if (len == 0 || len >= FT_URI_MAX || (strncmp(q, "ucx://", 6) && strncmp(q, "agent://", 8)))
            return ft_set_error(FT_ERR_INVALID_ARG,
                                "remote '%.*s' is not ucx://HOST:PORT or agent://HOST:PORT[/NODE]",
                                (int)len, q);
        memcpy(p->remotes[n], q, len);
        p->remotes[n][len] = '\0';
        n++;
        q = end ? end + 1 : q + len;
    }
    p->n_remotes = n;
    return FT_OK;
}

ft_status ft_policy_parse(const char *spec, ft_policy *out)
{
    if (!spec || !out) return FT_ERR_INVALID_ARG;
    ft_policy p = *out;
    char *buf = strdup(spec);
    if (!buf) return FT_ERR_NOMEM;
    ft_status st = FT_OK;
    char *save = NULL;
    for (char *item = strtok_r(buf, " ;\t\n", &save); item && st == FT_OK; item = strtok_r(NULL, " ;\t\n", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1]) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "policy item '%s' is not key=value", item);
            break;
        }
        *eq = '\0';
        const char *k = item, *v = eq + 1;
        long n;
        char *end;
        if (!strcmp(k, "w")) st = parse_pcts(k, v, p.w_pct);
        else if (!strcmp(k, "c")) st = parse_pcts(k, v, p.c_pct);
        else if (!strcmp(k, "a")) st = parse_pcts(k, v, p.a_pct);
        else if (!strcmp(k, "gbs") || !strcmp(k, "ngb")) {
            n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 65536)
                st = ft_set_error(FT_ERR_INVALID_ARG, "policy %s=%s: an integer in 1..65536", k, v);
            else if (k[0] == 'g') p.gpu_batch_size = (uint32_t)n;
            else p.num_gpu_batches = (uint32_t)n;
        } else if (!strcmp(k, "rep")) {
            n = strtol(v, &end, 10);
            if (*end || n < 1 || n > FT_MAX_REMOTES)
                st = ft_set_error(FT_ERR_INVALID_ARG, "policy rep=%s: replicas are an integer in 1..%d", v, FT_MAX_REMOTES);
            else p.replicas = (uint32_t)n;
        } else if (!strcmp(k, "cw")) st = parse_codec(k, v, 0, &p.compress_weights);
        else if (!strcmp(k, "cc")) st = parse_codec(k, v, 1, &p.compress_cache);
        else if (!strcmp(k, "remote")) st = parse_remotes(v, &p);
        else if (!strcmp(k, "disk")) {
            if (strncmp(v, "file:", 5) || strlen(v) >= FT_URI_MAX)
                st = ft_set_error(FT_ERR_INVALID_ARG, "policy disk=%s: expected file:DIR", v);
            else snprintf(p.disk_uri, sizeof p.disk_uri, "%s", v);
        } else st = ft_set_error(FT_ERR_INVALID_ARG, "unknown policy item '%s' (w, c, a, gbs, ngb, cw, cc, remote, disk, rep)", k);
    }
    free(buf);
    if (st) return st;
    *out = p;
    return FT_OK;
}

static ft_status check_sum(const char *what, const float *pct)
{
    float s = 0;
    for (int t = 0; t < FT_TIER_COUNT; t++) s += pct[t];
    if (fabsf(s - 100.0f) > 0.01f)
        return ft_set_error(FT_ERR_INVALID_ARG, "%s percentages add up to %g, not 100", what, (double)s);
    return FT_OK;
}

ft_status ft_policy_validate(const ft_policy *p)
{
    ft_status st;
    if ((st = check_sum("weight (w=)", p->w_pct)) || (st = check_sum("cache (c=)", p->c_pct)) ||
        (st = check_sum("activation (a=)", p->a_pct)))
        return st;
    int one = 0;
    for (int t = 0; t < FT_TIER_COUNT; t++) one += p->a_pct[t] == 100.0f;
    if (!one) return ft_set_error(FT_ERR_UNSUPPORTED, "activations must be 100%% on one tier");
    if (p->gpu_batch_size < 1 || p->num_gpu_batches < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "gbs and ngb must be >= 1");
    if ((p->w_pct[FT_TIER_REMOTE] > 0 || p->c_pct[FT_TIER_REMOTE] > 0) && p->n_remotes == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "the policy puts data on the remote tier but no --remote node is given");
    if ((p->w_pct[FT_TIER_DISK] > 0 || p->c_pct[FT_TIER_DISK] > 0) && !p->disk_uri[0])
        return ft_set_error(FT_ERR_INVALID_ARG, "the policy puts data on the disk tier but no disk directory is given");
    if (p->replicas > 1 && p->replicas > p->n_remotes)
        return ft_set_error(FT_ERR_INVALID_ARG, "%u replicas need at least %u memory nodes (--remote gives %u)",
                            p->replicas, p->replicas, p->n_remotes);
    return FT_OK;
}

void ft_policy_format(const ft_policy *p, char *buf, size_t n)
{
    const float *w = p->w_pct, *c = p->c_pct, *a = p->a_pct;
    snprintf(buf, n, "w=%g,%g,%g,%g c=%g,%g,%g,%g a=%g,%g,%g,%g gbs=%u ngb=%u cw=%s cc=%s",
             (double)w[0], (double)w[1], (double)w[2], (double)w[3], (double)c[0], (double)c[1],
             (double)c[2], (double)c[3], (double)a[0], (double)a[1], (double)a[2], (double)a[3],
             p->gpu_batch_size, p->num_gpu_batches,
             p->compress_weights == FT_CODEC_RAW ? "none" : p->compress_weights == FT_CODEC_BYTEPLANE ? "bp" : ft_codec_name(p->compress_weights),
             p->compress_cache == FT_CODEC_RAW ? "none" : ft_codec_name(p->compress_cache));
    if (p->replicas > 1) {
        size_t l = strlen(buf);
        if (l < n) snprintf(buf + l, n - l, " rep=%u", p->replicas);
    }
}

void ft_policy_place(const ft_policy *p, const uint64_t *bytes, size_t n, ft_tier *out)
{
    double total = 0, acc = 0;
    for (size_t i = 0; i < n; i++) total += (double)bytes[i];
    for (size_t i = 0; i < n; i++) {
        double mid = total > 0 ? (acc + 0.5 * (double)bytes[i]) / total * 100.0 : 0;
        acc += (double)bytes[i];
        double edge = 0;
        ft_tier t = FT_TIER_DEVICE;
        int found = 0;
        for (int k = 0; k < FT_TIER_COUNT; k++) {
            edge += p->w_pct[k];
            if (p->w_pct[k] > 0 && mid <= edge + 1e-9) { t = (ft_tier)k; found = 1; break; }
        }
        if (!found)   /* rounding: the last tier with a share */
            for (int k = FT_TIER_COUNT - 1; k >= 0; k--)
                if (p->w_pct[k] > 0) { t = (ft_tier)k; break; }
        out[i] = t;
    }
}
