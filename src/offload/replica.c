/* Replicated memory nodes: placement, failover and re-replication
 * (replica.h, docs/offload.md "Replicas and failover"). */
#include "replica.h"
#include "flextier/offload.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NODE_UP = 0, NODE_DOWN, NODE_REPAIRING };

struct ft_rset {
    ft_rset_params p;
    char names[FT_MAX_REMOTES][FT_URI_MAX];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state[FT_MAX_REMOTES];
    double next_probe[FT_MAX_REMOTES];
    ft_rset_stats st;
    pthread_t thr;
    int started, stop;
};

/* What the repair of one node copies (visit's context). */
typedef struct {
    ft_rset *r;
    int node;
    uint64_t objects, bytes;
} repair_ctx;

int ft_rset_replicas(const ft_rset *r) { return r ? r->p.replicas : 1; }

int ft_rset_node(const ft_rset *r, uint32_t base, int j)
{
    return (int)((base + (uint32_t)j) % (uint32_t)r->p.n);
}

int ft_rset_pick(ft_rset *r, uint32_t base, int avoid)
{
    int got = -1;
    pthread_mutex_lock(&r->mu);
    for (int j = 0; j < r->p.replicas && got < 0; j++) {
        int nd = ft_rset_node(r, base, j);
        if (nd != avoid && r->state[nd] == NODE_UP) got = nd;
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

int ft_rset_writable(ft_rset *r, int node)
{
    pthread_mutex_lock(&r->mu);
    int ok = r->state[node] != NODE_DOWN;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

int ft_rset_up_count(ft_rset *r)
{
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->p.n; i++) n += r->state[i] == NODE_UP;
    pthread_mutex_unlock(&r->mu);
    return n;
}

int ft_rset_failed(ft_rset *r, int node, ft_status st)
{
    if (!r || r->p.replicas < 2 || node < 0 || node >= r->p.n) return 0;
    if (st == FT_ERR_INVALID_ARG || st == FT_ERR_NOMEM || st == FT_ERR_BUFFER_SMALL) return 0;
    pthread_mutex_lock(&r->mu);
    if (r->state[node] == NODE_UP) {   /* a failover: reads leave a node they used */
        r->state[node] = NODE_DOWN;
        r->next_probe[node] = ft_now() + r->p.probe_ms / 1000.0;
        r->st.failovers++;
        FT_LOG(FT_LOG_WARN, "%s: memory node %s failed (%s): reading its replicas elsewhere; it is filled "
               "again when it answers", r->p.what, r->names[node], ft_status_str(st));
        pthread_cond_broadcast(&r->cv);
    } else if (r->state[node] == NODE_REPAIRING) {
        /* not back yet: a write (or a request from before the failover)
         * failed while it was being probed; no reader used it since */
        r->state[node] = NODE_DOWN;
        r->next_probe[node] = ft_now() + r->p.probe_ms / 1000.0;
        FT_LOG(FT_LOG_DEBUG, "%s: memory node %s still failing (%s) while probed", r->p.what, r->names[node],
               ft_status_str(st));
    }
    pthread_mutex_unlock(&r->mu);
    return 1;
}

void ft_rset_get_stats(ft_rset *r, ft_rset_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}

/* One object node `rc->node` should hold: present, or copied from a live
 * replica (the stored frame as it is: content-addressed keys name the same
 * bytes everywhere). */
static ft_status repair_one(void *vctx, const char *key, uint32_t base)
{
    repair_ctx *rc = vctx;
    ft_rset *r = rc->r;
    pthread_mutex_lock(&r->mu);
    int stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    if (stop) return FT_ERR_CANCELED;
    ft_tensor_stat ts;
    ft_status st = ft_stat_tensor(r->p.stores[rc->node], key, &ts);
    if (st == FT_OK) return FT_OK;
    if (st != FT_ERR_NOT_FOUND) return st;
    for (int j = 0; j < r->p.replicas; j++) {
        int src = ft_rset_node(r, base, j);
        if (src == rc->node) continue;
        pthread_mutex_lock(&r->mu);
        int up = r->state[src] == NODE_UP;
        pthread_mutex_unlock(&r->mu);
        if (!up) continue;
        void *frame = NULL;
        size_t size = 0;
        if ((st = ft_store_get_frame(r->p.stores[src], key, &frame, &size))) continue;
        st = ft_store_put_frame(r->p.stores[rc->node], key, frame, size);
        ft_free_aligned(frame);
        if (st) return st;
        rc->objects++;
        rc->bytes += size;
        return FT_OK;
    }
    return ft_set_error(FT_ERR_NOT_FOUND, "%s: no live replica holds %s", r->p.what, key);
}

static void *repair_main(void *arg)
{
    ft_rset *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        int node = -1;
        double now = ft_now(), wake = now + 3600;
        for (int i = 0; i < r->p.n; i++) {
            if (r->state[i] != NODE_DOWN) continue;
            if (r->next_probe[i] <= now) { node = i; break; }
            if (r->next_probe[i] < wake) wake = r->next_probe[i];
        }
        if (node < 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double w = wake - now;
            if (w > 1) w = 1;
            ts.tv_sec += (time_t)w;
            ts.tv_nsec += (long)((w - (double)(time_t)w) * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            continue;
        }
        r->state[node] = NODE_REPAIRING;   /* writers include it from now on */
        pthread_mutex_unlock(&r->mu);
        ft_store_stats ss;
        double t0 = ft_now();
        ft_status st = ft_store_stats_get(r->p.stores[node], &ss);   /* reconnects */
        repair_ctx rc = {r, node, 0, 0};
        if (st == FT_OK && r->p.each) st = r->p.each(r->p.user, node, repair_one, &rc);
        pthread_mutex_lock(&r->mu);
        if (st == FT_OK && !r->stop && r->state[node] == NODE_REPAIRING) {   /* no write failed meanwhile */
            r->state[node] = NODE_UP;
            r->st.repairs++;
            r->st.repaired_objects += rc.objects;
            r->st.repaired_bytes += rc.bytes;
            FT_LOG(FT_LOG_WARN, "%s: memory node %s is back: %llu objects (%.1f MiB) copied to it from replicas "
                   "in %.2f s", r->p.what, r->names[node], (unsigned long long)rc.objects,
                   (double)rc.bytes / 1048576.0, ft_now() - t0);
        } else {
            if (r->state[node] == NODE_REPAIRING) r->state[node] = NODE_DOWN;
            r->next_probe[node] = ft_now() + r->p.probe_ms / 1000.0;
            if (st && st != FT_ERR_NET && st != FT_ERR_TIMEOUT)
                FT_LOG(FT_LOG_DEBUG, "%s: memory node %s not repaired yet: %s", r->p.what, r->names[node],
                       ft_last_error());
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

ft_status ft_rset_create(const ft_rset_params *p, ft_rset **out)
{
    if (!p || !out || p->n < 1 || p->n > FT_MAX_REMOTES || p->replicas < 1 || p->replicas > p->n || !p->stores ||
        !p->names)
        return ft_set_error(FT_ERR_INVALID_ARG, "replicas: %d of %d nodes", p ? p->replicas : 0, p ? p->n : 0);
    ft_rset *r = calloc(1, sizeof *r);
    if (!r) return FT_ERR_NOMEM;
    r->p = *p;
    for (int i = 0; i < p->n; i++) snprintf(r->names[i], sizeof r->names[i], "%s", p->names[i] ? p->names[i] : "?");
    r->p.names = NULL;
    if (r->p.probe_ms <= 0) r->p.probe_ms = 250;
    if (!r->p.what) r->p.what = "remote tier";
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (r->p.replicas > 1) {
        if (pthread_create(&r->thr, NULL, repair_main, r)) {
            pthread_mutex_destroy(&r->mu);
            pthread_cond_destroy(&r->cv);
            free(r);
            return ft_set_error(FT_ERR_NOMEM, "replicas: repair thread");
        }
        r->started = 1;
    }
    *out = r;
    return FT_OK;
}

void ft_rset_free(ft_rset *r)
{
    if (!r) return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thr, NULL);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
