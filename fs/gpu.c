/*
 * gpu.c - the shared-arena server for GPU clients (-o cuda=on).
 *
 * A GPU client (libtensorfs-cuda) moves a tensor between the GPU and a
 * file with one DMA straight from or into the DRAM arena, instead of a
 * FUSE read or write and a copy through a bounce buffer. This file serves
 * it: a unix socket (protocol in cuda/gpu_proto.h) hands out the arena's
 * memfd, pins the blocks of a file range in the cache, answers with their
 * slot offsets, and on release commits a write as a pwrite would: size,
 * mtime, and the kernel's page cache of the range dropped. A reader that
 * pins in windows asks ahead (PREFETCH) for the windows it will pin next,
 * so that blocks on nvme load while it copies the window it holds.
 *
 * One thread (tfs-gpu) accepts connections; only the mount owner's uid is
 * served, and a client refused is told why before the hang-up. The socket
 * lies in a 0700 folder that the daemon makes where no other user can
 * rename or replace it (fs_gpu_sock_dir). Each
 * connection has its own thread (tfs-gpu-conn), owned and joined by the
 * accept thread or by fs_gpu_stop. A connection thread alone touches its
 * pins; when the client closes or dies the thread releases them all. Pins
 * of all clients together stay below tb_client_pins, so that clients can
 * never starve the daemon's own readers and writers. A write pin holds
 * the file's io lock shared; a truncate waits for it only a bounded time
 * (ops_data.c fs_io_lock_excl). Every fd a client sends is closed once used.
 *
 * With cuda=on the daemon also registers the arena with CUDA when a GPU
 * is there (cuMemHostRegister, through libcuda loaded at run time, so the
 * daemon needs no CUDA to build or run); without one it says so once.
 *
 * This file holds that registration, the server's start and stop, and the
 * contents of /.tensorfs/gpu (fs_gpu_json, which ctl.c calls). The socket
 * and the protocol are gpu_conn.c's, the pins gpu_pin.c's; they share
 * gpu_int.h. Calls go gpu.c -> gpu_conn.c -> gpu_pin.c, and from gpu_pin.c
 * to req.c, ctl_names.c, the inode table, prefetch.c and the block store;
 * never to the FUSE ops or the control files' contents.
 */
#include "gpu_int.h"
#include "json_count.h"
#include "log.h"
#include "../cuda/gpu_proto.h"
#include "../cuda/gpu_sock.h"

#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- CUDA registration of the arena ---- */

static const char *cu_err(struct gpu_cuda *cu, int rc)
{
	cu_errstr_fn errstr = cu->lib ? (cu_errstr_fn)dlsym(cu->lib, "cuGetErrorString") : NULL;
	const char *s = NULL;

	if (errstr && errstr(rc, &s) == 0 && s)
		return s;
	return "unknown CUDA error";
}

/* Pin the arena for DMA where a GPU is present; never fails the mount. */
static void cuda_register(struct fs_gpu *g)
{
	struct gpu_cuda *cu = &g->cu;
	cu_init_fn init;
	cu_count_fn count;
	cu_device_fn device;
	cu_retain_fn retain;
	cu_register_fn reg;
	int n = 0, rc;

	cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cu->lib) {
		snprintf(cu->why, sizeof(cu->why), "no GPU: libcuda.so.1 cannot be loaded");
		goto plain;
	}
	init = (cu_init_fn)dlsym(cu->lib, "cuInit");
	count = (cu_count_fn)dlsym(cu->lib, "cuDeviceGetCount");
	device = (cu_device_fn)dlsym(cu->lib, "cuDeviceGet");
	retain = (cu_retain_fn)dlsym(cu->lib, "cuDevicePrimaryCtxRetain");
	reg = (cu_register_fn)dlsym(cu->lib, "cuMemHostRegister_v2");
	cu->release = (cu_release_fn)dlsym(cu->lib, "cuDevicePrimaryCtxRelease_v2");
	cu->push = (cu_push_fn)dlsym(cu->lib, "cuCtxPushCurrent_v2");
	cu->pop = (cu_pop_fn)dlsym(cu->lib, "cuCtxPopCurrent_v2");
	cu->unregister = (cu_unregister_fn)dlsym(cu->lib, "cuMemHostUnregister");
	if (!init || !count || !device || !retain || !reg || !cu->release || !cu->push ||
	    !cu->pop || !cu->unregister) {
		snprintf(cu->why, sizeof(cu->why), "no GPU: libcuda.so.1 lacks the driver API");
		goto plain;
	}
	rc = init(0);
	if (rc == 0)
		rc = count(&n);
	if (rc || n == 0) {
		snprintf(cu->why, sizeof(cu->why), "no GPU: %s",
			 rc ? cu_err(cu, rc) : "the driver sees no device");
		goto plain;
	}
	rc = device(&cu->dev, 0);
	if (rc == 0)
		rc = retain(&cu->ctx, cu->dev);
	if (rc) {
		snprintf(cu->why, sizeof(cu->why), "cannot open GPU 0: %s", cu_err(cu, rc));
		goto plain;
	}
	cu->push(cu->ctx);
	rc = reg(g->arena.base, g->arena.bytes, GPU_CU_PORTABLE);
	cu->pop(&cu->ctx);
	if (rc) {
		snprintf(cu->why, sizeof(cu->why), "cannot register the arena with CUDA: %s",
			 cu_err(cu, rc));
		cu->release(cu->dev);
		cu->ctx = NULL;
		goto plain;
	}
	cu->registered = true;
	snprintf(cu->why, sizeof(cu->why), "arena registered with CUDA (%d GPU(s))", n);
	log_info("cuda=on: the %zu MiB DRAM arena is pinned for DMA by CUDA", g->arena.bytes >> 20);
	return;
plain:
	log_warn("cuda=on: %s; the DRAM arena stays plain (clients still share it)", cu->why);
	if (cu->lib)
		dlclose(cu->lib);
	cu->lib = NULL;
}

static void cuda_unregister(struct fs_gpu *g)
{
	struct gpu_cuda *cu = &g->cu;

	if (cu->registered) {
		cu->push(cu->ctx);
		cu->unregister(g->arena.base);
		cu->pop(&cu->ctx);
		cu->release(cu->dev);
		cu->registered = false;
	}
	if (cu->lib)
		dlclose(cu->lib);
	cu->lib = NULL;
}

/* ---- start, stop, and the control file ---- */

static void gpu_free(struct fs_gpu *g)
{
	if (g->lfd >= 0)
		close(g->lfd);
	if (g->path[0] && unlink(g->path) < 0 && errno != ENOENT)
		log_warn("cannot remove the gpu socket %s: %s", g->path, strerror(errno));
	if (g->dir[0] && rmdir(g->dir) < 0)
		log_warn("cannot remove the gpu socket's folder %s: %s", g->dir, strerror(errno));
	if (g->wake_pipe[0] >= 0) {
		close(g->wake_pipe[0]);
		close(g->wake_pipe[1]);
	}
	cuda_unregister(g);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

int fs_gpu_start(struct fs *fs, struct fuse_session *se, char *err, size_t errlen)
{
	struct fs_gpu *g;
	int ret;

	if (!fs->cfg->cuda)
		return 0;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->fs = fs;
	g->se = se;
	g->lfd = -1;
	g->wake_pipe[0] = g->wake_pipe[1] = -1;
	g->owner = getuid();
	g->bs = fs->bs;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cv, NULL);
	tb_arena(fs->tb, &g->arena);
	tb_client_pins(fs->tb, &g->max_pins, &g->max_wpins);
	if (getrandom(&g->id, sizeof(g->id), 0) != sizeof(g->id))
		g->id = (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);
	cuda_register(g);
	fs->gpu = g;
	if (g->arena.fd < 0) {
		/* Clients see no socket in the gpu file and take the pread path. */
		log_warn("cuda=on: the DRAM arena is not a sealed memfd; GPU clients "
			 "will read and write through FUSE");
		return 0;
	}
	ret = fs_gpu_sock_dir(g, err, errlen);
	if (ret == 0)
		ret = fs_gpu_listen(g);
	if (ret == 0 && pipe2(g->wake_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
		ret = -errno;
	if (ret == 0)
		ret = -pthread_create(&g->thread, NULL, fs_gpu_accept_main, g);
	if (ret) {
		if (g->dir[0] && g->path[0])
			snprintf(err, errlen, "cuda=on: cannot serve the GPU socket in %s: %s",
				 g->dir, strerror(-ret));
		fs->gpu = NULL;
		gpu_free(g);
		return ret;
	}
	pthread_setname_np(g->thread, "tfs-gpu");
	g->thread_started = true;
	log_info("cuda=on: GPU clients connect to %s", g->path);
	return 0;
}

void fs_gpu_stop(struct fs *fs)
{
	struct fs_gpu *g = fs->gpu;
	char c = WAKE_STOP;

	if (!g)
		return;
	if (g->thread_started) {
		/* Blocking now: the stop must not be lost in a full pipe. */
		fcntl(g->wake_pipe[1], F_SETFL, 0);
		if (write(g->wake_pipe[1], &c, 1) != 1)
			log_err("cannot stop the gpu socket thread: %s", strerror(errno));
		pthread_join(g->thread, NULL);
	}
	/* Hang up on every client; each thread then releases its pins. */
	pthread_mutex_lock(&g->lock);
	g->stopping = true;
	pthread_cond_broadcast(&g->cv);
	for (struct gpu_conn *cn = g->conns; cn; cn = cn->next)
		shutdown(cn->fd, SHUT_RDWR);
	pthread_mutex_unlock(&g->lock);
	fs_gpu_reap(g, true);
	fs->gpu = NULL;
	gpu_free(g);
}

struct json_t *fs_gpu_json(struct fs *fs)
{
	struct fs_gpu *g = fs->gpu;
	char id[20];
	json_t *j = json_object();

	json_object_set_new(j, "enabled", json_boolean(g != NULL));
	if (!g) {
		json_object_set_new(j, "socket", json_null());
		return j;
	}
	snprintf(id, sizeof(id), "%016llx", (unsigned long long)g->id);
	pthread_mutex_lock(&g->lock);
	json_object_set_new(j, "socket", g->thread_started ? json_string(g->path) : json_null());
	json_object_set_new(j, "id", json_string(id));
	json_object_set_new(j, "arena_bytes", json_integer((json_int_t)g->arena.bytes));
	json_object_set_new(j, "block_size", json_integer((json_int_t)g->bs));
	json_object_set_new(j, "huge_pages", json_boolean(g->arena.huge));
	json_object_set_new(j, "cuda_registered", json_boolean(g->cu.registered));
	json_object_set_new(j, "cuda", json_string(g->cu.why));
	const struct fs_count counts[] = {
	    {"max_pins", g->max_pins},
	    {"max_write_pins", g->max_wpins},
	    {"clients", g->nlive},
	    {"pinned_blocks", g->pinned},
	    {"write_pinned_blocks", g->wpinned},
	    {"pins", g->pins_total},
	    {"read_bytes", g->read_bytes},
	    {"write_bytes", g->write_bytes},
	    {"failed_writes", g->failed_writes},
	    {"refused", g->refused},
	    {"prefetches", g->prefetches},
	    {"prefetch_bytes", g->prefetch_bytes},
	};
	fs_json_counts(j, counts, sizeof(counts) / sizeof(counts[0]));
	pthread_mutex_unlock(&g->lock);
	return j;
}
