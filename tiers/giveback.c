/*
 * giveback.c - the thread that gives free slab space back to the
 * filesystem (dev_give_back), and when it looks.
 *
 * A sync point that freed slots wakes it (giveback_arm); it looks at once,
 * and then every punch_after_ms while free slots with space are left. A
 * look marks the free slots that still have their space as seen, and
 * gives back those seen at the look before and not handed out since: free
 * all that while. So slots freed and taken again within punch_after_ms (a
 * swap's files rewritten every iteration) keep their space, and writing a
 * punched slot costs an allocation first (dev_engine.c slab_fill). The thread is
 * its own, not the flusher's: a punch frees extents, and with the discard
 * mount option waits for the drive to trim them; on the flusher that held
 * up write-back, and an fsync with it, for over a minute (fault-flusher).
 *
 * Mechanism: store.c starts it and flush.c's sync point arms it; it
 * calls only the devices (dev.c).
 */
#include "cache_int.h"

#include <pthread.h>

void giveback_arm(struct tb_store *s)
{
	if (s->give_back_ms || !s->cfg.punch_after_ms)
		return;
	s->give_back_ms = now_ms();
	pthread_cond_signal(&s->give_back_cv);
}

void *giveback_main(void *arg)
{
	struct tb_store *s = arg;

	pthread_setname_np(pthread_self(), "tfs-giveback");
	pthread_mutex_lock(&s->lock);
	while (!s->stopping) {
		uint64_t now = now_ms();
		struct timespec ts;
		bool more = false;

		if (!s->give_back_ms) {
			pthread_cond_wait(&s->give_back_cv, &s->lock);
			continue;
		}
		if (now < s->give_back_ms) {
			deadline_in(&ts, s->give_back_ms - now);
			pthread_cond_timedwait(&s->give_back_cv, &s->lock, &ts);
			continue;
		}
		s->give_back_ms = 0;
		pthread_mutex_unlock(&s->lock);
		for (unsigned i = 0; i < s->n_devs; i++)
			more |= dev_give_back(s->dev[i], &s->give_back_stop);
		pthread_mutex_lock(&s->lock);
		/* A sync point that freed slots meanwhile asked for a look sooner. */
		now = now_ms();
		if (more && (!s->give_back_ms || s->give_back_ms > now + s->cfg.punch_after_ms))
			s->give_back_ms = now + s->cfg.punch_after_ms;
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}
