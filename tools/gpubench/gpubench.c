/*
 * gpubench - how fast tensors move between a GPU and a tensorfs mount.
 *
 * H2D (file to GPU) and D2H (GPU to file) bandwidth of one file of --size
 * bytes, three ways:
 *
 *   library   tfs_gpu_read / tfs_gpu_write: with -o cuda=on, DMA between
 *             the GPU and the daemon's DRAM arena (the file is resident in
 *             DRAM: --size must fit the DRAM tier)
 *   fuse      pread / pwrite of the whole file through FUSE (O_DIRECT, so
 *             every byte passes the daemon, not the page cache) into a
 *             cudaHostAlloc'd buffer, plus cudaMemcpy
 *   ceiling   cudaMemcpy from / to the same cudaHostAlloc'd buffer
 *
 * Every D2H re-dirties the whole file: above the mount's dirty mark
 * (-o dirty=, half of dram by default) writers wait for write-back, and
 * D2H then measures the nvme tier, on both tensorfs ways alike.
 *
 * Each is run --iters times after one untimed round (which maps and
 * registers the arena); the best and the mean are shown, then the ratios
 * the GPU path aims at: library / ceiling >= 0.8, library / fuse >= 3 on
 * the zero-copy path; on the fallback path (a mount without cuda=on)
 * library / fuse >= 1.
 *
 * With --nvme-dir DIR (the mount's nvme folder, or any folder on the same
 * drive), a file of --size is also read from DIR with O_DIRECT, to give the
 * drive's read rate; with --size some times the DRAM tier, H2D through the
 * library then reads blocks from nvme, and library / nvme aims at >= 0.9.
 */
#include "tensorfs_cuda.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEF_SIZE (1UL << 30)
#define DEF_ITERS 5
#define FILE_NAME "gpubench.dat"
#define RAW_NAME "gpubench-raw.dat"
#define RAW_IO (64UL << 20) /* one O_DIRECT request on the nvme folder */

enum way { W_LIB, W_FUSE, W_CEIL, N_WAYS };
enum dir { H2D, D2H, N_DIRS };

static const char *const way_names[N_WAYS] = {"libtensorfs-cuda", "FUSE + cudaMemcpy",
					      "cudaMemcpy, cudaHostAlloc (ceiling)"};

struct bench {
	const char *mnt;
	size_t size;
	unsigned iters;
	int fd, dfd; /* the file; opened O_DIRECT for the FUSE way */
	void *dev, *host;
	cudaStream_t stream;
	double best[N_WAYS][N_DIRS], sum[N_WAYS][N_DIRS];
	const char *nvme_dir; /* --nvme-dir */
	int raw_fd;
	double raw_best;
	bool zerocopy;
};

static void usage(const char *prog)
{
	printf("usage: %s -m MOUNT [--size SIZE] [--iters N] [--nvme-dir DIR]\n\n"
	       "H2D and D2H GB/s between a GPU and a file on MOUNT: through libtensorfs-cuda,\n"
	       "through a FUSE read or write plus cudaMemcpy, and of cudaMemcpy from\n"
	       "cudaHostAlloc'd memory (the ceiling).\n\n"
	       "  -m, --mount MOUNT  a tensorfs mount; -o cuda=on for the zero-copy path\n"
	       "  -s, --size SIZE    bytes per transfer, with K, M or G (default 1G); it must\n"
	       "                     fit the mount's DRAM tier, and for D2H to measure DMA\n"
	       "                     rather than write-back, stay below its dirty mark\n"
	       "                     (-o dirty=, default half of dram)\n"
	       "  -n, --iters N      timed rounds of each (default %d)\n"
	       "  -d, --nvme-dir DIR also read a file of SIZE from DIR with O_DIRECT (the\n"
	       "                     drive's rate), against H2D through the library; give a\n"
	       "                     SIZE some times the DRAM tier to measure reads from nvme\n"
	       "  -h, --help         this text\n",
	       prog, DEF_ITERS);
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -1;
	switch (*end) {
	case 'k':
	case 'K':
		v <<= 10;
		end++;
		break;
	case 'm':
	case 'M':
		v <<= 20;
		end++;
		break;
	case 'g':
	case 'G':
		v <<= 30;
		end++;
		break;
	default:
		break;
	}
	if (*end || v == 0)
		return -1;
	*out = (size_t)v;
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die_cuda(cudaError_t e, const char *what)
{
	fprintf(stderr, "gpubench: %s: %s\n", what, cudaGetErrorString(e));
	exit(1);
}

#define CU(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess)                                                             \
			die_cuda(e_, #call);                                                       \
	} while (0)

static void full_io(bool write, int fd, void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)done)
				  : pread(fd, (char *)buf + done, len - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "gpubench: %s of %s at %zu: %s\n",
				write ? "pwrite" : "pread", FILE_NAME, done,
				n < 0 ? strerror(errno) : "end of file");
			exit(1);
		}
		done += (size_t)n;
	}
}

/* One transfer of the whole file, one way and direction; returns seconds. */
static double run_one(struct bench *b, enum way w, enum dir d)
{
	double t = now();
	ssize_t n;

	switch (w) {
	case W_LIB:
		n = d == H2D ? tfs_gpu_read(b->fd, 0, b->size, b->dev, b->stream)
			     : tfs_gpu_write(b->fd, 0, b->size, b->dev, b->stream);
		if (n != (ssize_t)b->size) {
			fprintf(stderr, "gpubench: tfs_gpu_%s: %zd: %s\n",
				d == H2D ? "read" : "write", n, tfs_gpu_error());
			exit(1);
		}
		break;
	case W_FUSE:
		if (d == H2D) {
			full_io(false, b->dfd, b->host, b->size);
			CU(cudaMemcpyAsync(b->dev, b->host, b->size, cudaMemcpyHostToDevice,
					   b->stream));
			CU(cudaStreamSynchronize(b->stream));
		} else {
			CU(cudaMemcpyAsync(b->host, b->dev, b->size, cudaMemcpyDeviceToHost,
					   b->stream));
			CU(cudaStreamSynchronize(b->stream));
			full_io(true, b->dfd, b->host, b->size);
		}
		break;
	default:
		CU(cudaMemcpyAsync(
		    d == H2D ? b->dev : b->host, d == H2D ? b->host : b->dev, b->size,
		    d == H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, b->stream));
		CU(cudaStreamSynchronize(b->stream));
		break;
	}
	return now() - t;
}

/* Seconds to read the raw file once, O_DIRECT, in RAW_IO requests. */
static double raw_read(struct bench *b)
{
	double t = now();

	for (size_t off = 0; off < b->size; off += RAW_IO) {
		size_t n = b->size - off < RAW_IO ? b->size - off : RAW_IO;
		ssize_t r = pread(b->raw_fd, b->host, n, (off_t)off);

		if (r != (ssize_t)n) {
			fprintf(stderr, "gpubench: pread of %s/%s: %s\n", b->nvme_dir, RAW_NAME,
				r < 0 ? strerror(errno) : "short read");
			exit(1);
		}
	}
	return now() - t;
}

static void raw_setup(struct bench *b)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s", b->nvme_dir, RAW_NAME);
	b->raw_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
	if (b->raw_fd < 0) {
		fprintf(stderr, "gpubench: %s with O_DIRECT: %s\n", path, strerror(errno));
		exit(1);
	}
	memset(b->host, 0x5A, b->size);
	full_io(true, b->raw_fd, b->host, b->size);
	fsync(b->raw_fd);
	b->raw_best = 1e30;
}

static void setup(struct bench *b)
{
	char path[4096], name[256] = "";
	struct cudaDeviceProp prop;
	int n = 0, path_kind;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n == 0) {
		fprintf(stderr, "gpubench: no CUDA GPU: %s\n",
			e != cudaSuccess ? cudaGetErrorString(e) : "no device");
		exit(1);
	}
	if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
		snprintf(name, sizeof(name), "%s", prop.name);
	CU(cudaMalloc(&b->dev, b->size));
	CU(cudaHostAlloc(&b->host, b->size, cudaHostAllocDefault));
	CU(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
	CU(cudaMemset(b->dev, 0x5A, b->size));
	snprintf(path, sizeof(path), "%s/%s", b->mnt, FILE_NAME);
	b->fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (b->fd < 0) {
		fprintf(stderr, "gpubench: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	b->dfd = open(path, O_RDWR | O_DIRECT);
	if (b->dfd < 0) {
		fprintf(stderr, "gpubench: %s with O_DIRECT: %s\n", path, strerror(errno));
		exit(1);
	}
	path_kind = tfs_gpu_path(b->fd);
	b->zerocopy = path_kind == TFS_GPU_PATH_ZEROCOPY;
	printf("gpubench: %zu MiB, %u rounds; GPU 0: %s; %s: %s\n", b->size >> 20, b->iters, name,
	       b->mnt,
	       path_kind == TFS_GPU_PATH_ZEROCOPY ? "zero-copy path"
						  : "fallback path (mounted without cuda=on?)");
}

static void report(const struct bench *b)
{
	double gb = (double)b->size / 1e9;
	double lib[N_DIRS], fuse[N_DIRS], ceil[N_DIRS];

	printf("\n%-38s %10s %10s %10s %10s\n", "", "H2D GB/s", "(mean)", "D2H GB/s", "(mean)");
	for (int w = 0; w < N_WAYS; w++)
		printf("%-38s %10.2f %10.2f %10.2f %10.2f\n", way_names[w], gb / b->best[w][H2D],
		       gb * b->iters / b->sum[w][H2D], gb / b->best[w][D2H],
		       gb * b->iters / b->sum[w][D2H]);
	for (int d = 0; d < N_DIRS; d++) {
		lib[d] = gb / b->best[W_LIB][d];
		fuse[d] = gb / b->best[W_FUSE][d];
		ceil[d] = gb / b->best[W_CEIL][d];
	}
	printf("\n%-38s %10.2f %21.2f   (aim: %s)\n", "library / ceiling", lib[H2D] / ceil[H2D],
	       lib[D2H] / ceil[D2H], b->zerocopy ? ">= 0.80" : "none: fallback path");
	printf("%-38s %10.2f %21.2f   (aim: %s)\n", "library / FUSE", lib[H2D] / fuse[H2D],
	       lib[D2H] / fuse[D2H], b->zerocopy ? ">= 3" : ">= 1, fallback path");
	if (b->nvme_dir) {
		printf("%-38s %10.2f\n", "O_DIRECT read of --nvme-dir GB/s", gb / b->raw_best);
		printf("%-38s %10.2f %21s   (aim: >= 0.90 with SIZE > DRAM)\n", "library / nvme",
		       lib[H2D] / (gb / b->raw_best), "");
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"mount", required_argument, NULL, 'm'}, {"size", required_argument, NULL, 's'},
	    {"iters", required_argument, NULL, 'n'}, {"nvme-dir", required_argument, NULL, 'd'},
	    {"help", no_argument, NULL, 'h'},	     {NULL, 0, NULL, 0}};
	struct bench b = {.size = DEF_SIZE, .iters = DEF_ITERS};
	int c;

	while ((c = getopt_long(argc, argv, "m:s:n:d:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			b.mnt = optarg;
			break;
		case 's':
			if (parse_size(optarg, &b.size) < 0) {
				fprintf(stderr, "gpubench: bad --size '%s'\n", optarg);
				return 2;
			}
			break;
		case 'n':
			b.iters = (unsigned)atoi(optarg);
			if (b.iters == 0) {
				fprintf(stderr, "gpubench: bad --iters '%s'\n", optarg);
				return 2;
			}
			break;
		case 'd':
			b.nvme_dir = optarg;
			break;
		case 'h':
			usage(argv[0]);
			return 0;
		default:
			usage(argv[0]);
			return 2;
		}
	}
	if (!b.mnt || optind != argc) {
		usage(argv[0]);
		return 2;
	}
	setup(&b);
	if (b.nvme_dir)
		raw_setup(&b);
	/* One untimed round: the file exists and is in DRAM, the arena is mapped and registered. */
	for (int w = 0; w < N_WAYS; w++)
		for (int d = N_DIRS - 1; d >= 0; d--)
			run_one(&b, (enum way)w, (enum dir)d);
	for (int w = 0; w < N_WAYS; w++)
		for (int d = 0; d < N_DIRS; d++)
			b.best[w][d] = 1e30;
	for (unsigned i = 0; i < b.iters; i++)
		for (int w = 0; w < N_WAYS; w++)
			for (int d = N_DIRS - 1; d >= 0; d--) {
				double t = run_one(&b, (enum way)w, (enum dir)d);

				b.sum[w][d] += t;
				if (t < b.best[w][d])
					b.best[w][d] = t;
			}
	for (unsigned i = 0; b.nvme_dir && i < b.iters; i++) {
		double t = raw_read(&b);

		if (t < b.raw_best)
			b.raw_best = t;
	}
	report(&b);
	close(b.fd);
	close(b.dfd);
	if (b.nvme_dir) {
		char path[4096];

		close(b.raw_fd);
		snprintf(path, sizeof(path), "%s/%s", b.nvme_dir, RAW_NAME);
		unlink(path);
	}
	cudaFreeHost(b.host);
	cudaFree(b.dev);
	cudaStreamDestroy(b.stream);
	tfs_gpu_shutdown();
	return 0;
}
