/* Internal to src/offload: the remote tier's memory nodes as a replicated
 * set (docs/offload.md, "Replicas and failover").
 *
 * An object (a weight frame, a piece of one, a KV cache chunk) placed at
 * `base` has its replica j on node (base + j) % n, j < replicas. Readers
 * take the first replica whose node is up; a request that fails on a node
 * marks the node down (ft_rset_failed) and the caller retries on the next
 * replica, so a node killed mid-run costs one retry. A repair thread
 * probes down nodes; when one answers again it copies every object the
 * node should hold and lacks (the node is volatile: a restarted node is
 * empty) from a live replica, frame for frame, and only then marks it up
 * (readers return to it). Writers (the KV cache) also write to a node being
 * repaired, so nothing written meanwhile is missed. */
#ifndef FT_OFFLOAD_REPLICA_H
#define FT_OFFLOAD_REPLICA_H
#include "flextier/store.h"

typedef struct ft_rset ft_rset;

/* The repair thread asks the owner for the keys node `node` should hold:
 * each calls visit(vctx, key, base) for every such object (any order) and
 * returns the first error visit returned. Called on the repair thread,
 * without the set's lock; it must be safe against the owner's threads. */
typedef ft_status (*ft_rset_visit)(void *vctx, const char *key, uint32_t base);
typedef ft_status (*ft_rset_each)(void *user, int node, ft_rset_visit visit, void *vctx);

typedef struct ft_rset_params {
    int n;                        /* nodes, 1..FT_MAX_REMOTES           */
    int replicas;                 /* 1..n (1: no failover)              */
    ft_store *const *stores;      /* n stores, owned by the caller      */
    const char *const *names;     /* n URIs for messages                */
    int probe_ms;                 /* probe a down node this often (250) */
    ft_rset_each each;            /* NULL: nothing to re-replicate      */
    void *user;
    const char *what;             /* "weights", "KV cache": for messages */
} ft_rset_params;

typedef struct ft_rset_stats {
    uint64_t failovers;           /* up nodes given up on               */
    uint64_t repairs;             /* nodes filled again and marked up   */
    uint64_t repaired_objects, repaired_bytes;
} ft_rset_stats;

ft_status ft_rset_create(const ft_rset_params *p, ft_rset **out);
/* Stops the repair thread (waits for a probe or copy in progress). */
void ft_rset_free(ft_rset *r);
/* Node of replica j (j < replicas) of an object placed at base. */
int ft_rset_node(const ft_rset *r, uint32_t base, int j);
int ft_rset_replicas(const ft_rset *r);
/* The first replica of base whose node is up and is not `avoid` (-1:
 * none to avoid); -1 when none is left. */
int ft_rset_pick(ft_rset *r, uint32_t base, int avoid);
/* A node that may be written to: up, or being repaired. */
int ft_rset_writable(ft_rset *r, int node);
/* A request to `node` failed with st. Returns 1 when the caller should
 * retry on another replica: the node is marked down (once; a warning is
 * logged) and the repair thread starts probing it. Returns 0 (nothing
 * marked) with one replica, or for an error a replica cannot fix
 * (FT_ERR_INVALID_ARG, FT_ERR_NOMEM, FT_ERR_BUFFER_SMALL). */
int ft_rset_failed(ft_rset *r, int node, ft_status st);
/* Nodes up right now. */
int ft_rset_up_count(ft_rset *r);
void ft_rset_get_stats(ft_rset *r, ft_rset_stats *out);
#endif
