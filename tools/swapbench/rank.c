/*
 * rank.c - a rank's side of a run: the time and bytes of a handle's
 * requests added to the phase they belong to (sb_finish), the workload's
 * iterations run one by one (sb_run_iters), and each phase published to
 * the parent, waiting until the next may start (sb_rank_sync, the rank's
 * half of the handshake of rank.h). The workloads call it, so that they
 * need nothing of main.c; it calls aio_handle.c.
 */
#include <errno.h>
#include <semaphore.h>

#include "aio_handle.h"
#include "rank.h"
#include "swapbench.h"

int sb_finish(struct ah_handle *h, bool read, struct sb_phase *ph, struct sb_verify *v)
{
	struct ah_result res;
	int ret;

	if (!ah_pending(h))
		return 0;
	ret = ah_wait(h, &res);
	if (read) {
		ph->read_s += res.busy_s;
		ph->read_bytes += res.bytes;
	} else {
		ph->write_s += res.busy_s;
		ph->write_bytes += res.bytes;
	}
	v->errors += res.errors;
	return ret;
}

int sb_run_iters(const struct sb_config *cfg, struct sb_rank *r, int (*iteration)(void *w, int k),
		 void *w)
{
	int ret = 0;

	for (int k = 1; k <= cfg->iters && !ret; k++) {
		ret = iteration(w, k);
		if (!ret)
			ret = sb_rank_sync(r, k);
	}
	return ret;
}

int sb_rank_sync(struct sb_rank *r, int k)
{
	struct sb_shared *sh = r->sync;

	sem_post(&sh->done);
	if (k >= sh->iters)
		return 0;
	while (sem_wait(&sh->go) && errno == EINTR)
		;
	return sh->abort ? -ECANCELED : 0;
}
