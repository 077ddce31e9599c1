// ranks.h: the command line in an MPI launch (mpirun -np N varent CMD ...; docs/
// distributed.md). Every rank runs the same command on the same inputs in lock step:
// rank 0 prints and writes files, the others are silent (VARENT_VERBOSE_RANKS=1 keeps
// their stdout and stderr) and write nothing. This is the CLI's own process state.
#ifndef VARENT_CLI_RANKS_H
#define VARENT_CLI_RANKS_H

#include <stdint.h>

#include "host/cli/args.h"
#include "host/runtime/session.h"
#include "host/runtime/tp_mpi.h"

// Joins the MPI world when a launcher started this process; called first by main. 0, or
// an exit status after printing why.
int cli_ranks_start(int *argc, char ***argv);
// Leaves the world with the command's exit status rc: a clean end when every rank got
// the same result (0, or a usage error), else MPI_Abort so no rank waits on one that
// stopped. Returns rc.
int cli_ranks_end(int rc);
// The world of this launch; NULL when not launched by MPI.
tp_mpi *cli_ranks_world(void);
// Rank 0's value of x on every rank (x unchanged outside an MPI launch).
uint64_t cli_ranks_same(uint64_t x);
// The command splits the world into replicas (agents): --tp defaults to 1 and may be
// less than the ranks. Call before cli_session_opts.
void cli_ranks_replicas(void);
// --tp and --tp-timeout into o (cli_session_opts calls it): the degree (default: every
// rank of the launch; 1 after cli_ranks_replicas) and this rank's group. Without
// cli_ranks_replicas, --tp must use every rank.
void cli_ranks_session(args *a, session_opts *o);
// Rank 0's text on every rank (stdin reaches rank 0 alone under mpirun): *text and *len
// are replaced by rank 0's (NULL: none; rank 0's status goes with it). Outside an MPI
// launch nothing changes. Returns 0, or -1 when the exchange failed (the launch stops).
int cli_ranks_share(char **text, long *len, int *status);
// rd(arg) on rank 0, its text (or its error) on every rank: what reads stdin.
char *cli_ranks_read(char *(*rd)(const char *arg, verr *err), const char *arg, verr *err);
// fileio_read_all, with "-" (stdin) read by rank 0 and shared with every rank.
char *cli_read_all(const char *path, verr *err);
// The communicator across the groups (rank g of it: group g; the agents' exchange), or
// NULL outside an MPI launch. Valid after cli_ranks_session.
tp_comm *cli_ranks_across(void);

#endif
