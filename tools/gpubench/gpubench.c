/*
 * gpubench - how fast tensors move between a GPU and a tensorfs mount.
 *
 * H2D (file to GPU) and D2H (GPU to file) bandwidth of one file of --size
 * bytes, three ways:
 *
 *   library   tfs_gpu_read / tfs_gpu_write: with -o cuda=on, DMA between
 *             the GPU and the daemon's DRAM arena
 *   fuse      pread / pwrite of the whole file through FUSE (O_DIRECT, so
 *             every byte passes the daemon, not the page cache) into a
 *             cudaHostAlloc'd buffer, plus cudaMemcpy
 *   ceiling   cudaMemcpy from / to the same cudaHostAlloc'd buffer
 *
 * The tensor holds bytes that differ in every 4 KiB, so that no block is
 * a hole or a duplicate of another: with one byte everywhere, write-back
 * stored one block and referenced it, and every read of the file read
 * that one block of the drive. Each D2H also writes bytes the file never
 * held (stamp), so that write-back never finds them stored already.
 *
 * Every D2H re-dirties the whole file: above the mount's dirty mark
 * (-o dirty=) writers wait for write-back, and D2H then measures the nvme
 * tier, on both tensorfs ways alike.
 *
 * Each is run --iters times after one untimed round (which maps and
 * registers the arena), the ways taking turns within each round; the best
 * and the median are shown, then the ratios the GPU path aims at: library
 * / ceiling >= 0.8, library / fuse >= 3 on the zero-copy path with the
 * file in DRAM; on the fallback path (a mount without cuda=on) library /
 * fuse >= 1.
 *
 * With --nvme-dir DIR (the mount's nvme folder, or any folder on the same
 * drive), a fourth way takes its turn in each round: a file of --size in
 * DIR read and written with O_DIRECT, in RAW_IO requests, the drive's
 * rate. With --size some times the DRAM tier, the library then reads
 * blocks from nvme and writes them back, and library / nvme aims at >=
 * 0.9 both ways. Each D2H then ends with fsync, of the raw file too, so
 * that a write counts once its bytes are on the drive, not in DRAM.
 *
 * gpubench-cpu is this program on the CPU copy engine of the protocol
 * tests (cpu_cuda.h), for machines without a GPU: the same ways, with
 * memcpy, or a copy engine held to TENSORFS_CPU_COPY_GBPS.
 */
#include "tensorfs_cuda.h"

#ifdef GPUBENCH_CPU
#include "cpu_cuda.h"
#else
#include <cuda_runtime.h>
#endif

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEF_SIZE (1UL << 30)
#define DEF_ITERS 5
#define MAX_ITERS 1000
#define FILE_NAME "gpubench.dat"
#define RAW_NAME "gpubench-raw.dat"
#define RAW_IO (64UL << 20) /* one O_DIRECT request on the nvme folder */

enum way { W_LIB, W_FUSE, W_CEIL, W_RAW, N_WAYS };
enum dir { H2D, D2H, N_DIRS };

static const char *const way_names[N_WAYS] = {"libtensorfs-cuda", "FUSE + cudaMemcpy",
					      "cudaMemcpy, cudaHostAlloc (ceiling)",
					      "O_DIRECT on --nvme-dir (the drive)"};

struct bench {
	const char *mnt;
	size_t size;
	unsigned iters;
	int fd, dfd; /* the file; opened O_DIRECT for the FUSE way */
	void *dev, *host;
	cudaStream_t stream;
	double *secs[N_WAYS][N_DIRS]; /* each timed round's seconds */
	const char *nvme_dir;	      /* --nvme-dir */
	int raw_fd;
	uint64_t salt; /* the last D2H's stamp */
	bool zerocopy;
};

static void usage(const char *prog)
{
	printf("usage: %s -m MOUNT [--size SIZE] [--iters N] [--nvme-dir DIR]\n\n"
	       "H2D and D2H GB/s between a GPU and a file on MOUNT: through libtensorfs-cuda,\n"
	       "through a FUSE read or write plus cudaMemcpy, and of cudaMemcpy from\n"
	       "cudaHostAlloc'd memory (the ceiling), taking turns in each round.\n\n"
	       "  -m, --mount MOUNT  a tensorfs mount; -o cuda=on for the zero-copy path\n"
	       "  -s, --size SIZE    bytes per transfer, with K, M or G (default 1G); to\n"
	       "                     measure the DRAM path it must fit the mount's DRAM tier\n"
	       "                     and, for D2H to measure DMA rather than write-back, stay\n"
	       "                     below its dirty mark (-o dirty=)\n"
	       "  -n, --iters N      timed rounds (default %d, at most %d)\n"
	       "  -d, --nvme-dir DIR also read and write a file of SIZE in DIR with O_DIRECT\n"
	       "                     (the drive's rate) in each round; give a SIZE some times\n"
	       "                     the DRAM tier to measure the library from and to nvme\n"
	       "                     (each D2H then ends with fsync)\n"
	       "  -h, --help         this text\n",
	       prog, DEF_ITERS, MAX_ITERS);
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

static void full_io(bool write, int fd, const char *name, void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)done)
				  : pread(fd, (char *)buf + done, len - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "gpubench: %s of %s at %zu: %s\n",
				write ? "pwrite" : "pread", name, done,
				n < 0 ? strerror(errno) : "end of file");
			exit(1);
		}
		done += (size_t)n;
	}
}

static void sync_file(int fd, const char *name)
{
	if (fsync(fd) < 0) {
		fprintf(stderr, "gpubench: fsync of %s: %s\n", name, strerror(errno));
		exit(1);
	}
}

/* The O_DIRECT way: the whole raw file, in RAW_IO requests, from or to host memory. */
static void raw_io(struct bench *b, bool write)
{
	for (size_t off = 0; off < b->size; off += RAW_IO) {
		size_t n = b->size - off < RAW_IO ? b->size - off : RAW_IO;
		ssize_t r = write ? pwrite(b->raw_fd, (char *)b->host + off, n, (off_t)off)
				  : pread(b->raw_fd, (char *)b->host + off, n, (off_t)off);

		if (r != (ssize_t)n) {
			fprintf(stderr, "gpubench: %s of %s/%s at %zu: %s\n",
				write ? "pwrite" : "pread", b->nvme_dir, RAW_NAME, off,
				r < 0 ? strerror(errno) : "short");
			exit(1);
		}
	}
	if (write)
		sync_file(b->raw_fd, RAW_NAME);
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
		if (d == D2H && b->nvme_dir)
			sync_file(b->fd, FILE_NAME);
		break;
	case W_FUSE:
		if (d == H2D) {
			full_io(false, b->dfd, FILE_NAME, b->host, b->size);
			CU(cudaMemcpyAsync(b->dev, b->host, b->size, cudaMemcpyHostToDevice,
					   b->stream));
			CU(cudaStreamSynchronize(b->stream));
		} else {
			CU(cudaMemcpyAsync(b->host, b->dev, b->size, cudaMemcpyDeviceToHost,
					   b->stream));
			CU(cudaStreamSynchronize(b->stream));
			full_io(true, b->dfd, FILE_NAME, b->host, b->size);
			if (b->nvme_dir)
				sync_file(b->dfd, FILE_NAME);
		}
		break;
	case W_CEIL:
		CU(cudaMemcpyAsync(
		    d == H2D ? b->dev : b->host, d == H2D ? b->host : b->dev, b->size,
		    d == H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, b->stream));
		CU(cudaStreamSynchronize(b->stream));
		break;
	default:
		raw_io(b, d == D2H);
		break;
	}
	return now() - t;
}

#define MAGIC 0x5A5A5A5A00000000ULL
#define PAGE_WORDS (4096 / sizeof(uint64_t))

/*
 * The tensor's bytes: each 8-byte word is its offset, salted, so that
 * every 4 KiB (and every block) differs from every other; the first word
 * of each 4 KiB also holds the number of the D2H that wrote it (stamp).
 */
static uint64_t word(size_t i, uint64_t salt)
{
	return (uint64_t)i * 8 ^ MAGIC ^ (i % PAGE_WORDS ? 0 : salt << 40);
}

static void fill(uint64_t *p, size_t size)
{
	for (size_t i = 0; i < size / sizeof(*p); i++)
		p[i] = word(i, 0);
}

/*
 * Before each D2H of the file: a new salt in the first word of every 4
 * KiB of the tensor, so that no D2H writes bytes the file held before.
 * With the same bytes each round, write-back found every block stored
 * already (dedup), read it back to compare, and D2H measured that.
 */
static void stamp(struct bench *b)
{
	uint64_t *h = b->host;
	size_t pages = b->size / 4096;

	b->salt++;
	for (size_t k = 0; k < pages; k++)
		h[k] = word(k * PAGE_WORDS, b->salt);
	CU(cudaMemcpy2DAsync(b->dev, 4096, b->host, sizeof(uint64_t), sizeof(uint64_t), pages,
			     cudaMemcpyHostToDevice, b->stream));
	CU(cudaStreamSynchronize(b->stream));
}

#ifdef GPUBENCH_CPU
/* "Device" memory is host memory here: what the library read must be the tensor. */
static void check_dev(const struct bench *b)
{
	const uint64_t *p = b->dev;

	for (size_t i = 0; i < b->size / sizeof(*p); i++)
		if (p[i] != word(i, b->salt)) {
			fprintf(stderr,
				"gpubench: H2D through the library read wrong bytes at %zu\n",
				i * 8);
			exit(1);
		}
}
#endif

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
	fill(b->host, b->size);
	CU(cudaMemcpy(b->dev, b->host, b->size, cudaMemcpyHostToDevice));
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
	if (b->nvme_dir) {
		snprintf(path, sizeof(path), "%s/%s", b->nvme_dir, RAW_NAME);
		b->raw_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
		if (b->raw_fd < 0) {
			fprintf(stderr, "gpubench: %s with O_DIRECT: %s\n", path, strerror(errno));
			exit(1);
		}
	}
	for (int w = 0; w < N_WAYS; w++)
		for (int d = 0; d < N_DIRS; d++) {
			b->secs[w][d] = calloc(b->iters, sizeof(double));
			if (!b->secs[w][d]) {
				fprintf(stderr, "gpubench: out of memory\n");
				exit(1);
			}
		}
	path_kind = tfs_gpu_path(b->fd);
	b->zerocopy = path_kind == TFS_GPU_PATH_ZEROCOPY;
	printf("gpubench: %zu MiB, %u rounds; GPU 0: %s; %s: %s\n", b->size >> 20, b->iters, name,
	       b->mnt,
	       path_kind == TFS_GPU_PATH_ZEROCOPY ? "zero-copy path"
						  : "fallback path (mounted without cuda=on?)");
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* GB/s of the best and of the median round of one way and direction. */
static void rates(const struct bench *b, enum way w, enum dir d, double *best, double *median)
{
	double gb = (double)b->size / 1e9, *t = b->secs[w][d];
	unsigned n = b->iters;

	qsort(t, n, sizeof(*t), cmp_double);
	*best = gb / t[0];
	*median = gb / (n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2);
}

static void report(const struct bench *b)
{
	double best[N_WAYS][N_DIRS], med[N_WAYS][N_DIRS];
	int nways = b->nvme_dir ? N_WAYS : W_RAW;

	printf("\n%-38s %10s %10s %10s %10s\n", "", "H2D GB/s", "(median)", "D2H GB/s", "(median)");
	for (int w = 0; w < nways; w++) {
		for (int d = 0; d < N_DIRS; d++)
			rates(b, (enum way)w, (enum dir)d, &best[w][d], &med[w][d]);
		printf("%-38s %10.2f %10.2f %10.2f %10.2f\n", way_names[w], best[w][H2D],
		       med[w][H2D], best[w][D2H], med[w][D2H]);
	}
	printf("\n%-38s %10.2f %21.2f   (aim: %s)\n", "library / ceiling",
	       best[W_LIB][H2D] / best[W_CEIL][H2D], best[W_LIB][D2H] / best[W_CEIL][D2H],
	       b->nvme_dir   ? "none: from and to nvme"
	       : b->zerocopy ? ">= 0.80"
			     : "none: fallback path");
	printf("%-38s %10.2f %21.2f   (aim: %s)\n", "library / FUSE",
	       best[W_LIB][H2D] / best[W_FUSE][H2D], best[W_LIB][D2H] / best[W_FUSE][D2H],
	       b->nvme_dir   ? ">= 1"
	       : b->zerocopy ? ">= 3"
			     : ">= 1, fallback path");
	if (b->nvme_dir) {
		printf("%-38s %10.2f %21.2f   (aim: >= 0.90 with SIZE > DRAM)\n", "library / nvme",
		       best[W_LIB][H2D] / best[W_RAW][H2D], best[W_LIB][D2H] / best[W_RAW][D2H]);
		printf("%-38s %10.2f %21.2f\n", "library / nvme, medians",
		       med[W_LIB][H2D] / med[W_RAW][H2D], med[W_LIB][D2H] / med[W_RAW][D2H]);
		printf("%-38s %10.2f %21.2f\n", "FUSE / nvme", best[W_FUSE][H2D] / best[W_RAW][H2D],
		       best[W_FUSE][D2H] / best[W_RAW][D2H]);
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"mount", required_argument, NULL, 'm'}, {"size", required_argument, NULL, 's'},
	    {"iters", required_argument, NULL, 'n'}, {"nvme-dir", required_argument, NULL, 'd'},
	    {"help", no_argument, NULL, 'h'},	     {NULL, 0, NULL, 0}};
	struct bench b = {.size = DEF_SIZE, .iters = DEF_ITERS, .raw_fd = -1};
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, "m:s:n:d:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			b.mnt = optarg;
			break;
		case 's':
			if (parse_size(optarg, &b.size) < 0 || b.size % 4096) {
				fprintf(stderr, "gpubench: bad --size '%s' (a multiple of 4K)\n",
					optarg);
				return 2;
			}
			break;
		case 'n':
			errno = 0;
			b.iters = (unsigned)strtoul(optarg, &end, 10);
			if (errno || *end || b.iters == 0 || b.iters > MAX_ITERS) {
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
	/*
	 * One untimed round, then the timed ones, the ways taking turns in
	 * each: D2H first (it writes the file), then H2D. The untimed round
	 * writes the files, and maps and registers the arena.
	 */
	for (int i = -1; i < (int)b.iters; i++)
		for (int w = 0; w < (b.nvme_dir ? N_WAYS : W_RAW); w++)
			for (int d = N_DIRS - 1; d >= 0; d--) {
				double t;

				if (d == D2H && (w == W_LIB || w == W_FUSE))
					stamp(&b);
				t = run_one(&b, (enum way)w, (enum dir)d);

				if (i >= 0)
					b.secs[w][d][i] = t;
#ifdef GPUBENCH_CPU
				if (w == W_LIB && d == H2D)
					check_dev(&b);
#endif
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
	for (int w = 0; w < N_WAYS; w++)
		for (int d = 0; d < N_DIRS; d++)
			free(b.secs[w][d]);
	cudaFreeHost(b.host);
	cudaFree(b.dev);
	cudaStreamDestroy(b.stream);
	tfs_gpu_shutdown();
	return 0;
}
