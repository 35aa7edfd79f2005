/*
 * worker.h - start and stop one of the daemon's background threads.
 *
 * A worker (the rates thread in ctl.c, the pins thread in pins.c) is a
 * thread, a stop flag and a "running" flag, with the lock and condition
 * variable it sleeps on. fs_worker_start clears the stop flag and starts
 * the thread; fs_worker_stop, a no-op when the thread never started, sets
 * the flag under the lock, wakes the thread and joins it.
 */
#ifndef TFS_FS_WORKER_H
#define TFS_FS_WORKER_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

/* Start fn(arg) as *th; -EAGAIN when the thread could not be created. */
static inline int fs_worker_start(pthread_t *th, bool *stop, bool *running, void *(*fn)(void *),
				  void *arg)
{
	*stop = false;
	if (pthread_create(th, NULL, fn, arg) != 0)
		return -EAGAIN;
	*running = true;
	return 0;
}

/* Tell the thread th to stop (under lock, waking cv) and join it. */
static inline void fs_worker_stop(pthread_t th, pthread_mutex_t *lock, pthread_cond_t *cv,
				  bool *stop, bool *running)
{
	if (!*running)
		return;
	pthread_mutex_lock(lock);
	*stop = true;
	pthread_cond_signal(cv);
	pthread_mutex_unlock(lock);
	pthread_join(th, NULL);
	*running = false;
}

#endif
