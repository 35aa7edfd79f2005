/*
 * prefetch.c - loads the files that come next in the learned cycle, and
 * files named by a hint, into the DRAM tier ahead of use.
 *
 * One thread (tfs-prefetch) wakes when the learner records a file or a
 * hint arrives. It asks the learner for the next files within a budget of
 * a quarter of the DRAM tier and issues their blocks in the prefetch class, which
 * devices serve after demand reads and before write-back. tb_prefetch
 * never waits: when the in-flight bound is reached the thread sleeps a
 * little and goes on, starting over whenever the cycle moves.
 */
#include "fs.h"
#include "log.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define AHEAD_MAX 64	     /* files looked ahead at most */
#define RETRY_NS 2000000L    /* when the prefetch class is full */
#define IDLE_MS 200	     /* wake to check the learner anyway */
#define HINTS_MAX 64
#define PREFETCH_SHARE 4 /* files ahead may fill a quarter of the DRAM tier */

/* Issue the blocks of one file; false when the cycle moved on (start over). */
static bool prefetch_file(struct fs *fs, uint64_t ino, uint64_t gen, bool hinted)
{
	struct fs_inode *in;
	uint64_t size, nblk;

	if (fs_iget(fs, ino, &in) != 0)
		return true;
	pthread_mutex_lock(&in->lock);
	size = in->rec.size;
	pthread_mutex_unlock(&in->lock);
	nblk = (size + fs->bs - 1) / fs->bs;
	for (uint64_t b = 0; b < nblk && !fs->pf_stop; b++) {
		int ret;

		pthread_rwlock_rdlock(&in->io);
		ret = tb_prefetch(fs->tb, ino, b);
		pthread_rwlock_unlock(&in->io);
		if (ret == -EAGAIN) {
			struct timespec ts = {0, RETRY_NS};

			nanosleep(&ts, NULL);
			b--;
		}
		if (!hinted && __atomic_load_n(&fs->learn.generation, __ATOMIC_RELAXED) != gen) {
			fs_iput(fs, in);
			return false;
		}
	}
	fs_iput(fs, in);
	return true;
}

static void *prefetch_main(void *arg)
{
	struct fs *fs = arg;
	uint64_t inos[AHEAD_MAX], seen_gen = 0;

	pthread_setname_np(pthread_self(), "tfs-prefetch");
	pthread_mutex_lock(&fs->pf_lock);
	while (!fs->pf_stop) {
		uint64_t hints[HINTS_MAX], gen;
		unsigned nh = fs->pf_nhints, n;

		memcpy(hints, fs->pf_hints, nh * sizeof(hints[0]));
		fs->pf_nhints = 0;
		pthread_mutex_unlock(&fs->pf_lock);

		for (unsigned i = 0; i < nh; i++)
			prefetch_file(fs, hints[i], 0, true);
		/* prefetch=off turns off the learned cycle's prefetch, not hints. */
		n = 0;
		gen = seen_gen;
		if (fs->cfg->prefetch)
			n = fs_learn_next(&fs->learn, inos, AHEAD_MAX,
					  fs->cfg->dram / PREFETCH_SHARE, &gen);
		if (gen != seen_gen) {
			seen_gen = gen;
			for (unsigned i = 0; i < n && !fs->pf_stop; i++)
				if (!prefetch_file(fs, inos[i], gen, false))
					break;
		}

		pthread_mutex_lock(&fs->pf_lock);
		if (!fs->pf_nhints && !fs->pf_stop &&
		    __atomic_load_n(&fs->learn.generation, __ATOMIC_RELAXED) == seen_gen) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += IDLE_MS * 1000000L;
			ts.tv_sec += ts.tv_nsec / 1000000000L;
			ts.tv_nsec %= 1000000000L;
			pthread_cond_timedwait(&fs->pf_cv, &fs->pf_lock, &ts);
		}
	}
	pthread_mutex_unlock(&fs->pf_lock);
	return NULL;
}

int fs_prefetch_start(struct fs *fs)
{
	pthread_mutex_init(&fs->pf_lock, NULL);
	pthread_cond_init(&fs->pf_cv, NULL);
	fs->pf_stop = false;
	if (pthread_create(&fs->pf_thread, NULL, prefetch_main, fs) != 0)
		return -EAGAIN;
	fs->pf_running = true;
	return 0;
}

void fs_prefetch_stop(struct fs *fs)
{
	if (!fs->pf_running)
		return;
	pthread_mutex_lock(&fs->pf_lock);
	fs->pf_stop = true;
	pthread_cond_signal(&fs->pf_cv);
	pthread_mutex_unlock(&fs->pf_lock);
	pthread_join(fs->pf_thread, NULL);
	fs->pf_running = false;
}

void fs_prefetch_kick(struct fs *fs)
{
	if (!fs->pf_running)
		return;
	pthread_mutex_lock(&fs->pf_lock);
	pthread_cond_signal(&fs->pf_cv);
	pthread_mutex_unlock(&fs->pf_lock);
}

int fs_prefetch_hint(struct fs *fs, uint64_t ino)
{
	int ret = 0;

	pthread_mutex_lock(&fs->pf_lock);
	if (fs->pf_nhints == HINTS_MAX)
		ret = -EBUSY;
	else
		fs->pf_hints[fs->pf_nhints++] = ino;
	pthread_cond_signal(&fs->pf_cv);
	pthread_mutex_unlock(&fs->pf_lock);
	return ret;
}
