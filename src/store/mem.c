/* mem: backend - frames in a hash table in this process. */
#include "store_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct mem_entry {
    char             *key;
    uint8_t          *frame;
    size_t            size;
    struct mem_entry *next;
} mem_entry;

#define MEM_BUCKETS 1024u

typedef struct mem_backend {
    ft_store_backend base;
    pthread_mutex_t  lock;
    mem_entry       *b[MEM_BUCKETS];
    uint64_t         count, used;
} mem_backend;

static unsigned bucket(const char *key)
{
    return (unsigned)(ft_xxh3(key, strlen(key)) % MEM_BUCKETS);
}

static mem_entry **find(mem_backend *m, const char *key)
{
    mem_entry **pp = &m->b[bucket(key)];
    while (*pp && strcmp((*pp)->key, key)) pp = &(*pp)->next;
    return pp;
}

static ft_status mem_put(ft_store_backend *b, const char *key, const void *frame, size_t size)
{
    mem_backend *m = (mem_backend *)b;
    uint8_t *copy = ft_malloc_aligned(size ? size : 1, 64);
    if (!copy) return ft_set_error(FT_ERR_NOMEM, "mem: %zu bytes", size);
    memcpy(copy, frame, size);
    pthread_mutex_lock(&m->lock);
    mem_entry **pp = find(m, key);
    if (*pp) {
        ft_free_aligned((*pp)->frame);
        m->used -= (*pp)->size;
        (*pp)->frame = copy;
        (*pp)->size = size;
    } else {
        mem_entry *e = calloc(1, sizeof *e);
        char *k = e ? strdup(key) : NULL;
        if (!k) {
            pthread_mutex_unlock(&m->lock);
            free(e);
            ft_free_aligned(copy);
            return ft_set_error(FT_ERR_NOMEM, "mem: entry");
        }
        e->key = k;
        e->frame = copy;
        e->size = size;
        *pp = e;
        m->count++;
    }
    m->used += size;
    pthread_mutex_unlock(&m->lock);
    return FT_OK;
}

static ft_status mem_get(ft_store_backend *b, const char *key, ft_buf *out, size_t *size)
{
    mem_backend *m = (mem_backend *)b;
    pthread_mutex_lock(&m->lock);
    mem_entry *e = *find(m, key);
    ft_status st;
    if (!e) {
        st = ft_set_error(FT_ERR_NOT_FOUND, "no tensor '%s'", key);
    } else if ((st = ft_buf_reserve(out, e->size)) == FT_OK) {
        memcpy(out->p, e->frame, e->size);
        *size = e->size;
    }
    pthread_mutex_unlock(&m->lock);
    return st;
}

static ft_status mem_del(ft_store_backend *b, const char *key)
{
    mem_backend *m = (mem_backend *)b;
    pthread_mutex_lock(&m->lock);
    mem_entry **pp = find(m, key), *e = *pp;
    if (e) {
        *pp = e->next;
        m->count--;
        m->used -= e->size;
    }
    pthread_mutex_unlock(&m->lock);
    if (!e) return ft_set_error(FT_ERR_NOT_FOUND, "no tensor '%s'", key);
    ft_free_aligned(e->frame);
    free(e->key);
    free(e);
    return FT_OK;
}

static ft_status mem_stat(ft_store_backend *b, const char *key, ft_frame_info *info)
{
    mem_backend *m = (mem_backend *)b;
    pthread_mutex_lock(&m->lock);
    mem_entry *e = *find(m, key);
    ft_status st = e ? ft_frame_parse(e->frame, e->size, info)
                     : ft_set_error(FT_ERR_NOT_FOUND, "no tensor '%s'", key);
    pthread_mutex_unlock(&m->lock);
    return st;
}

static ft_status mem_list(ft_store_backend *b, char ***keys, size_t *n)
{
    mem_backend *m = (mem_backend *)b;
    ft_keylist l = {0};
    ft_status st = FT_OK;
    pthread_mutex_lock(&m->lock);
    for (unsigned i = 0; i < MEM_BUCKETS && st == FT_OK; i++)
        for (mem_entry *e = m->b[i]; e && st == FT_OK; e = e->next)
            st = ft_keylist_add(&l, e->key, strlen(e->key));
    pthread_mutex_unlock(&m->lock);
    if (st != FT_OK) { ft_list_free(l.v, l.n); return st; }
    *keys = l.v;
    *n = l.n;
    return FT_OK;
}

static ft_status mem_stats(ft_store_backend *b, ft_store_stats *out)
{
    mem_backend *m = (mem_backend *)b;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&m->lock);
    out->used = m->used;
    out->tensors = m->count;
    pthread_mutex_unlock(&m->lock);
    return FT_OK;
}

static void mem_close(ft_store_backend *b)
{
    mem_backend *m = (mem_backend *)b;
    for (unsigned i = 0; i < MEM_BUCKETS; i++) {
        mem_entry *e = m->b[i];
        while (e) {
            mem_entry *n = e->next;
            ft_free_aligned(e->frame);
            free(e->key);
            free(e);
            e = n;
        }
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static const ft_store_ops mem_ops = {mem_put, mem_get, mem_del, mem_stat,
                                     mem_list, mem_stats, mem_close, NULL, NULL};

static ft_status mem_open(const char *spec, const ft_store_params *p, ft_store_backend **out)
{
    if (*spec) return ft_set_error(FT_ERR_INVALID_ARG, "mem: takes nothing after the colon (got 'mem:%s')", spec);
    mem_backend *m = calloc(1, sizeof *m);
    if (!m) return ft_set_error(FT_ERR_NOMEM, "mem: store");
    m->base.ops = &mem_ops;
    pthread_mutex_init(&m->lock, NULL);
    *out = &m->base;
    return FT_OK;
}

const ft_store_scheme ft_store_scheme_mem = {"mem:", "mem", "mem:", mem_open};
