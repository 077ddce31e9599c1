// session_tp.c: session_open's tensor-parallel step (session.h, docs/distributed.md).
#include "host/runtime/session.h"

#include <stdlib.h>
#include <string.h>

#include "host/runtime/tp_mpi.h"
#include "model/forward_cuda.h"

// Every rank's checkpoint digest against rank 0's.
static int same_checkpoint(session *s, tp_comm *c, verr *err) {
    char mine[65], *all = malloc((size_t)65 * c->size);
    verr why;
    int failed = !all ? verr_set(&why, "out of memory") : model_digest(&s->m, mine, &why);
    if (tp_agree(c, !failed, why.msg, err) || c->gather(c, mine, 65, all, err)) {
        free(all);
        return -1;
    }
    int rc = 0;
    for (int r = 1; r < c->size && !rc; r++)
        if (memcmp(all, all + (size_t)r * 65, 64) != 0)
            rc = verr_set(err, "rank %d loaded a different checkpoint from rank 0 (sha256 of config.json and the "
                          "safetensors headers: %.12s... on rank %d, %.12s... on rank 0; this rank: %s): every rank "
                          "must load the same model", r, all + (size_t)r * 65, r, all, s->m.dir);
    free(all);
    return rc;
}

int session_tp_shard(session *s, const session_opts *o, int failed, int cuda_dev, verr *err) {
    tp_comm *c = o->tp_comm;
    if (!c)
        return verr_set(err, "--tp %d runs %d processes over MPI: launch it as mpirun -np %d varent ... "
                        "(docs/distributed.md)", o->tp, o->tp, o->tp);
    if (c->size != o->tp)
        return verr_set(err, "--tp %d: the tensor-parallel group has %d ranks", o->tp, c->size);
    if (tp_agree(c, !failed, err->msg, err)) return -1;
    tp_shard plan;
    if (tp_shard_plan(&s->m.cfg, c->rank, c->size, &plan, err) || same_checkpoint(s, c, err)) return -1;
    verr why;
    int bad = model_shard(&s->m, &plan, &why);
    return tp_agree(c, !bad, why.msg, err);
}

int session_tp_device(const session_opts *o, int cuda_dev, int n_devices) {
    if (cuda_dev < 0 || o->tp <= 1 || !o->tp_comm || strchr(o->device, ':') || n_devices <= 0) return cuda_dev;
    // One rank per GPU: the node's ranks take its GPUs in turn (Open MPI, MPICH, Slurm).
    const char *vars[] = { "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID" };
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v) % n_devices;
    }
    return o->tp_comm->rank % n_devices;
}

int session_tp_join_cuda(session *s, const session_opts *o, verr *err) {
    tp_comm *c = o->tp_comm;
    unsigned char id[CUDA_TP_ID_BYTES] = { 0 }, *all = malloc((size_t)CUDA_TP_ID_BYTES * c->size);
    verr why = { { 0 } };
    int bad = !all ? verr_set(&why, "out of memory") : c->rank == 0 ? cuda_forward_tp_id(id, &why) : 0;
    // rank 0's NCCL unique id to every rank, over MPI; then every rank joins the NCCL group
    if (tp_agree(c, !bad, why.msg, err) || c->gather(c, id, sizeof id, all, err)) {
        free(all);
        return -1;
    }
    bad = cuda_forward_tp_join(s->cu, all, o->tp_timeout, &why);
    free(all);
    return tp_agree(c, !bad, why.msg, err);
}
