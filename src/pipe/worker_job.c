/* What a pipeline job may name (pipe_internal.h, docs/protocol.md "Trust
 * model"): the worker's operator decides where it reads models, which
 * memory nodes it logs in to with its node token and where it writes
 * weights; a driver holding the worker token only chooses among them. */
#include "pipe_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One answer for a path outside the root and a path that does not exist,
 * so that a driver cannot probe the worker's file system. */
static ft_status no_model(const char *name)
{
    return ft_set_error(FT_ERR_AUTH, "model '%.200s' is not available on this worker (not under its "
                        "--models directory, or not found)", name);
}

static ft_status check_model(const char *root, ft_pipe_stage_params *sp)
{
    if (!root) return ft_set_error(FT_ERR_AUTH, "this worker serves no models (its operator gives --models DIR)");
    char rroot[PATH_MAX], want[2 * PATH_MAX], real[PATH_MAX];
    if (!realpath(root, rroot))
        return ft_set_error(FT_ERR_IO, "the worker's --models directory %s is gone", root);
    const char *m = sp->model_dir;
    if (!m[0]) return no_model(m);
    /* relative names are under the root; absolute ones must resolve there */
    if (m[0] == '/') snprintf(want, sizeof want, "%s", m);
    else snprintf(want, sizeof want, "%s/%s", rroot, m);
    /* realpath resolves every symlink and "..": what is checked is where
     * the path really leads */
    if (!realpath(want, real)) return no_model(m);
    size_t rl = strlen(rroot);
    int under = !strcmp(rroot, "/") || (!strncmp(real, rroot, rl) && (real[rl] == '/' || real[rl] == 0));
    if (!under || strlen(real) >= sizeof sp->model_dir) return no_model(m);
    memcpy(sp->model_dir, real, strlen(real) + 1);   /* fits: checked above */
    return FT_OK;
}

static int listed(const char *v, const char *const *list, int n)
{
    for (int i = 0; i < n; i++)
        if (list[i] && !strcmp(v, list[i])) return 1;
    return 0;
}

ft_status ft_worker_job_check(const ft_worker_params *p, ft_pipe_stage_params *sp)
{
    ft_status st = check_model(p->models_dir, sp);
    if (st != FT_OK || !sp->policy[0]) return st;
    ft_policy pol;
    ft_policy_default(&pol);
    if ((st = ft_policy_parse(sp->policy, &pol)) != FT_OK) return st;
    for (uint32_t i = 0; i < pol.n_remotes; i++)
        if (!listed(pol.remotes[i], p->remotes, p->n_remotes))
            return ft_set_error(FT_ERR_AUTH, "the job names memory node '%.200s', which this worker's operator "
                                "did not allow (flextier worker --remote)", pol.remotes[i]);
    if (pol.disk_uri[0] && !listed(pol.disk_uri, p->disks, p->n_disks))
        return ft_set_error(FT_ERR_AUTH, "the job names disk directory '%.200s', which this worker's operator "
                            "did not allow (flextier worker --disk)", pol.disk_uri);
    return FT_OK;
}
