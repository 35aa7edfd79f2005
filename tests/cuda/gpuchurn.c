/*
 * gpuchurn.c - the activation offloader's traffic of files through the
 * GPU socket, on the CPU copy engine (cuda/copy_cpu.c), run by
 * test_gpu_churn.sh:
 *
 *   gpuchurn DIR STEPS FILES MAXKIB
 *
 * Each step, a writer thread creates FILES files in DIR as
 * tensorfs_offload.py does (O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC) and
 * writes each with tfs_gpu_write, 4 KiB to MAXKIB KiB of data made from
 * the step and the file's number; a reader thread then reads the step's
 * files back with tfs_gpu_read in reverse order, checks every byte,
 * closes and unlinks each, while the writer goes on with the next step:
 * the creates of one step meet the reads and unlinks of the step before.
 * Every other step takes the names of the step two before (unlinked by
 * then), the others new ones. The first file must take the zero-copy
 * path. Every create, write, read and unlink must succeed: a failure
 * names the step, the file and the errno. At the end DIR is empty. The
 * last line says how many bytes went each way and how long it took.
 *
 * Exit status: 0 pass, 1 fail.
 */
#include "gputest.h"
#include "tensorfs_cuda.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIN_BYTES 4096
#define AHEAD 1 /* steps the writer may be ahead of the reader */

struct file {
	int fd;
	size_t len;
	char path[4096];
};

static const char *dir;
static unsigned steps, nfiles;
static size_t max_bytes;
static struct file *files[AHEAD + 1]; /* a step's files, by step % (AHEAD + 1) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static unsigned written, read_done; /* steps done by each thread; lock */
static uint64_t bytes;		    /* lock */

/* The data of file i of step s: len and bytes, the same for writer and reader. */
static size_t make(unsigned s, unsigned i, uint8_t *buf)
{
	uint64_t seed = (uint64_t)s << 32 | i | 1;
	size_t len = MIN_BYTES + gt_rnd(&seed) % (max_bytes - MIN_BYTES + 1);

	gt_fill(buf, len, &seed);
	return len;
}

static void name(unsigned s, unsigned i, char *path, size_t n)
{
	/* Odd steps take the names of the step two before; even steps new ones. */
	unsigned owner = s % 2 && s >= 2 ? s - 2 : s;

	snprintf(path, n, "%s/act-%d-%u", dir, (int)getpid(), owner * nfiles + i);
}

static void *writer(void *arg)
{
	uint8_t *buf = malloc(max_bytes);

	(void)arg;
	CHECK(buf, "out of memory");
	for (unsigned s = 0; s < steps; s++) {
		struct file *f = files[s % (AHEAD + 1)];

		pthread_mutex_lock(&lock);
		while (s > read_done + AHEAD)
			pthread_cond_wait(&cond, &lock);
		pthread_mutex_unlock(&lock);
		for (unsigned i = 0; i < nfiles; i++) {
			ssize_t n;

			name(s, i, f[i].path, sizeof(f[i].path));
			f[i].fd = open(f[i].path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
			CHECK(f[i].fd >= 0, "step %u: create of %s: %s", s + 1, f[i].path,
			      strerror(errno));
			if (s == 0 && i == 0)
				CHECK(tfs_gpu_path(f[i].fd) == TFS_GPU_PATH_ZEROCOPY,
				      "%s does not take the zero-copy path", f[i].path);
			f[i].len = make(s, i, buf);
			n = tfs_gpu_write(f[i].fd, 0, f[i].len, buf, NULL);
			CHECK(n == (ssize_t)f[i].len, "step %u: tfs_gpu_write of %s: %zd: %s",
			      s + 1, f[i].path, n, tfs_gpu_error());
		}
		pthread_mutex_lock(&lock);
		written = s + 1;
		pthread_cond_broadcast(&cond);
		pthread_mutex_unlock(&lock);
	}
	free(buf);
	return NULL;
}

static void *reader(void *arg)
{
	uint8_t *want = malloc(max_bytes), *got = malloc(max_bytes);

	(void)arg;
	CHECK(want && got, "out of memory");
	for (unsigned s = 0; s < steps; s++) {
		struct file *f = files[s % (AHEAD + 1)];
		uint64_t sum = 0;

		pthread_mutex_lock(&lock);
		while (written <= s)
			pthread_cond_wait(&cond, &lock);
		pthread_mutex_unlock(&lock);
		for (unsigned i = nfiles; i-- > 0;) {
			size_t len = make(s, i, want);
			ssize_t n;

			memset(got, 0, len);
			n = tfs_gpu_read(f[i].fd, 0, len, got, NULL);
			CHECK(n == (ssize_t)len, "step %u: tfs_gpu_read of %s: %zd of %zu: %s",
			      s + 1, f[i].path, n, len, tfs_gpu_error());
			CHECK(memcmp(got, want, len) == 0, "step %u: %s read back wrong", s + 1,
			      f[i].path);
			CHECK(close(f[i].fd) == 0, "close %s: %s", f[i].path, strerror(errno));
			CHECK(unlink(f[i].path) == 0, "step %u: unlink of %s: %s", s + 1, f[i].path,
			      strerror(errno));
			sum += len;
		}
		pthread_mutex_lock(&lock);
		read_done = s + 1;
		bytes += sum;
		pthread_cond_broadcast(&cond);
		pthread_mutex_unlock(&lock);
	}
	free(want);
	free(got);
	return NULL;
}

int main(int argc, char **argv)
{
	struct timespec t0, t1;
	pthread_t w, r;
	struct dirent *e;
	DIR *d;

	if (argc != 5) {
		fprintf(stderr, "usage: %s DIR STEPS FILES MAXKIB\n", argv[0]);
		return 1;
	}
	dir = argv[1];
	steps = (unsigned)atoi(argv[2]);
	nfiles = (unsigned)atoi(argv[3]);
	max_bytes = (size_t)atoi(argv[4]) << 10;
	CHECK(steps > 0 && nfiles > 0 && max_bytes >= MIN_BYTES, "bad arguments");
	for (unsigned k = 0; k <= AHEAD; k++) {
		files[k] = calloc(nfiles, sizeof(struct file));
		CHECK(files[k], "out of memory");
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK(pthread_create(&w, NULL, writer, NULL) == 0, "pthread_create");
	CHECK(pthread_create(&r, NULL, reader, NULL) == 0, "pthread_create");
	pthread_join(w, NULL);
	pthread_join(r, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	d = opendir(dir);
	CHECK(d, "opendir %s: %s", dir, strerror(errno));
	while ((e = readdir(d)))
		CHECK(strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0, "%s/%s is left",
		      dir, e->d_name);
	closedir(d);
	printf("churn: %u steps of %u files, %llu MiB written and read back, %.1f s\n", steps,
	       nfiles, (unsigned long long)(bytes >> 20),
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	printf("bytes %llu seconds %.3f\n", (unsigned long long)bytes,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	for (unsigned k = 0; k <= AHEAD; k++)
		free(files[k]);
	return 0;
}
