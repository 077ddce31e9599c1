// tp_mpi.h: the processes of an MPI launch (mpirun -np N varent ...) as tensor-parallel
// groups (model/tp.h) and as the ranks that split the agents. Compiled with MPI when
// make finds it (VARENT_MPI; make MPI=0 leaves it out); without it every call but
// tp_mpi_launched fails, saying how to build with it.
//
// Ranks that stop answering must not hang the others: every collective runs under a
// watchdog, and a rank that waits longer than the timeout prints which collective and
// exits, which makes mpirun stop the whole job. A rank that dies is noticed by mpirun
// itself, which stops the rest.
#ifndef VARENT_TP_MPI_H
#define VARENT_TP_MPI_H

#include "host/util/err.h"
#include "model/tp.h"

typedef struct tp_mpi tp_mpi;

// 1 when an MPI launcher started this process (its environment says so): the CLI then
// joins the MPI world before anything else.
int tp_mpi_launched(void);
// Joins the world (MPI_Init). err_fd: where fatal messages go from any rank (the CLI
// silences the stderr of ranks other than 0, so it passes a copy of the original).
// timeout_s: how long MPI's start-up may wait for the other ranks before this rank
// stops (0: forever), as tp_mpi_set_timeout for the collectives later.
int tp_mpi_init(int *argc, char ***argv, int err_fd, double timeout_s, tp_mpi **w, verr *err);
// Every rank of the launch (the seed's broadcast).
tp_comm *tp_mpi_world(tp_mpi *w);
int tp_mpi_rank(const tp_mpi *w);
int tp_mpi_size(const tp_mpi *w);
// Seconds a collective may wait for the other ranks before this rank gives up (default
// 300; 0: forever).
void tp_mpi_set_timeout(tp_mpi *w, double seconds);
// Splits the world into size / tp groups of tp consecutive ranks: *group is this rank's
// tensor-parallel group, *across the ranks holding the same position in every group
// (rank r of each; the agents' exchange). The comms belong to w. -1 with err when tp
// does not divide the world size.
int tp_mpi_split(tp_mpi *w, int tp, tp_comm **group, tp_comm **across, verr *err);
// Every rank of c calls this with its own outcome (ok 0: failed, msg says why); all
// return 0 if every rank succeeded, else -1 with err naming the first failed rank and
// its message. Keeps the ranks in step after work that can fail on one rank alone.
int tp_agree(tp_comm *c, int ok, const char *msg, verr *err);
// Stops every rank of the launch (MPI_Abort) with exit status code.
void tp_mpi_abort(tp_mpi *w, int code);
// Leaves the world (MPI_Finalize) and frees w.
void tp_mpi_finalize(tp_mpi *w);

#endif
