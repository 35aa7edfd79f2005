/*
 * rank.h - the handshake between swapbench's parent process and its ranks,
 * through the memory they share: a rank publishes a phase (init, then each
 * iteration) and posts "done"; the parent, once every rank is done, prints
 * the phase and posts "go" for the next one.
 *
 * main.c (the parent) maps it and drives its half; a rank's half is
 * sb_rank_sync (rank.c), which the workloads call, as sb_run_iters does.
 */
#ifndef SWAPBENCH_RANK_H
#define SWAPBENCH_RANK_H

#include <semaphore.h>

/* The memory the parent shares with the ranks. */
struct sb_shared {
	sem_t done; /* posted by a rank when it finished a phase */
	sem_t go;   /* posted by the parent: a rank may start its next phase */
	int iters;
	int abort; /* set by the parent before it releases the ranks to stop */
};

#endif
