/*
 * gpu_roundtrip.c - libtensorfs-cuda on a real GPU: tensors of random odd
 * sizes, written at random odd offsets from device memory and read back
 * into device memory, must come back exact; so must what FUSE reads of
 * them. Holes read as zeros; a bad device pointer fails the call with a
 * message and leaves no pin.
 *
 *   gpu_roundtrip --probe           exit 77 (with why) when there is no GPU
 *   gpu_roundtrip MNT zerocopy|fallback [ITERS]
 *
 * Exit status: 0 pass, 1 fail, 77 skip (no GPU).
 */
#include "gputest.h"
#include "tensorfs_cuda.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_TENSOR (48UL << 20)

#define CU(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                 \
	} while (0)

static int probe(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n == 0) {
		printf("SKIP: no GPU (%s)\n",
		       e != cudaSuccess ? cudaGetErrorString(e) : "no device");
		return 77;
	}
	return 0;
}

static long long pinned_blocks(const char *mnt)
{
	char path[4096], buf[8192];
	const char *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/.tensorfs/gpu", mnt);
	fd = open(path, O_RDONLY);
	CHECK(fd >= 0, "%s: %s", path, strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	CHECK(n > 0, "read %s", path);
	buf[n] = 0;
	p = strstr(buf, "\"pinned_blocks\":");
	return p ? atoll(p + strlen("\"pinned_blocks\":")) : -1;
}

int main(int argc, char **argv)
{
	uint64_t s = gt_seed();
	unsigned iters;
	uint8_t *host, *back, *dev_a, *dev_b;
	cudaStream_t stream;
	char path[4096];
	int fd, want, ret;
	bool zc;

	if (argc >= 2 && strcmp(argv[1], "--probe") == 0)
		return probe();
	if (argc < 3) {
		fprintf(stderr, "usage: %s --probe | MNT zerocopy|fallback [ITERS]\n", argv[0]);
		return 2;
	}
	if (probe())
		return 77;
	iters = argc > 3 ? (unsigned)atoi(argv[3]) : 40;
	zc = strcmp(argv[2], "zerocopy") == 0;
	printf("gpu_roundtrip: %s, seed %llu, %u tensors\n", argv[2], (unsigned long long)s, iters);
	host = malloc(MAX_TENSOR);
	back = malloc(MAX_TENSOR);
	CHECK(host && back, "out of memory");
	CU(cudaMalloc((void **)&dev_a, MAX_TENSOR));
	CU(cudaMalloc((void **)&dev_b, MAX_TENSOR));
	CU(cudaStreamCreate(&stream));
	snprintf(path, sizeof(path), "%s/tensors", argv[1]);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
	want = zc ? TFS_GPU_PATH_ZEROCOPY : TFS_GPU_PATH_FALLBACK;
	CHECK(tfs_gpu_path(fd) == want, "tfs_gpu_path is %d, want %d: %s", tfs_gpu_path(fd), want,
	      tfs_gpu_error());

	for (unsigned i = 0; i < iters; i++) {
		size_t len = 1 + gt_rnd(&s) % MAX_TENSOR;
		off_t off = (off_t)(gt_rnd(&s) % (64UL << 20));
		void *st = i % 2 ? stream : NULL;
		ssize_t n;

		gt_fill(host, len, &s);
		CU(cudaMemcpy(dev_a, host, len, cudaMemcpyHostToDevice));
		n = tfs_gpu_write(fd, off, len, dev_a, st);
		CHECK(n == (ssize_t)len, "tfs_gpu_write(%lld, %zu) = %zd: %s", (long long)off, len,
		      n, tfs_gpu_error());
		CHECK(pread(fd, back, len, off) == (ssize_t)len && memcmp(back, host, len) == 0,
		      "FUSE reads other bytes than tfs_gpu_write(%lld, %zu) wrote", (long long)off,
		      len);
		CU(cudaMemset(dev_b, 0xA5, len));
		n = tfs_gpu_read(fd, off, len, dev_b, st);
		CHECK(n == (ssize_t)len, "tfs_gpu_read(%lld, %zu) = %zd: %s", (long long)off, len,
		      n, tfs_gpu_error());
		CU(cudaMemcpy(back, dev_b, len, cudaMemcpyDeviceToHost));
		CHECK(memcmp(back, host, len) == 0, "tensor %u (%zu bytes at %lld) came back wrong",
		      i, len, (long long)off);
	}

	/* A hole reads as zeros on the device. */
	CHECK(ftruncate(fd, 0) == 0 && ftruncate(fd, 8L << 20) == 0, "ftruncate");
	CU(cudaMemset(dev_b, 0xA5, 8L << 20));
	CHECK(tfs_gpu_read(fd, 0, 8L << 20, dev_b, stream) == 8L << 20, "read of a hole: %s",
	      tfs_gpu_error());
	CU(cudaMemcpy(back, dev_b, 8L << 20, cudaMemcpyDeviceToHost));
	for (size_t k = 0; k < (8UL << 20); k++)
		CHECK(back[k] == 0, "a hole read %02x at %zu", back[k], k);

	/* A bad device pointer: an error with a message, and no pin left. */
	ret = (int)tfs_gpu_read(fd, 0, 1 << 20, (void *)(uintptr_t)0x1000, stream);
	CHECK(ret < 0 && tfs_gpu_error()[0], "a read into a bad pointer returned %d", ret);
	printf("bad pointer: %d (%s)\n", ret, tfs_gpu_error());
	if (zc)
		CHECK(pinned_blocks(argv[1]) == 0, "a failed call left blocks pinned");

	close(fd);
	CU(cudaStreamDestroy(stream));
	cudaFree(dev_a);
	cudaFree(dev_b);
	tfs_gpu_shutdown();
	printf("gpu_roundtrip: ok\n");
	return 0;
}
