/*
 * cpu_cuda.h - the few CUDA runtime calls gpubench makes, on the CPU copy
 * engine of libtensorfs-cuda's protocol tests (cuda/copy_cpu.c), for
 * gpubench-cpu: a build of gpubench that runs where there is no GPU.
 *
 * "Device" memory is host memory, and every copy, the library's and the
 * benchmark's own (FUSE + copy, the ceiling), goes through the same
 * engine: queued, done at the stream's synchronization, and held to
 * TENSORFS_CPU_COPY_GBPS when that is set (one engine each way, as a GPU
 * has). What it measures is how the library overlaps the devices with
 * its copies, not a GPU's DMA.
 */
#ifndef TENSORFS_GPUBENCH_CPU_CUDA_H
#define TENSORFS_GPUBENCH_CPU_CUDA_H

#include "copy.h"
#include "tensorfs_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;

enum { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost };
#define cudaHostAllocDefault 0
#define cudaStreamNonBlocking 0

struct cudaDeviceProp {
	char name[256];
};

static inline const char *cudaGetErrorString(cudaError_t e)
{
	return tfs_gpu_error()[0] ? tfs_gpu_error() : strerror(-e);
}

static inline cudaError_t cudaGetDeviceCount(int *n)
{
	*n = 1;
	return cudaSuccess;
}

static inline cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
	const char *rate = getenv("TENSORFS_CPU_COPY_GBPS");

	(void)dev;
	snprintf(p->name, sizeof(p->name), "none: the CPU copy engine, %s%s",
		 rate && *rate ? "TENSORFS_CPU_COPY_GBPS=" : "memcpy at full speed",
		 rate && *rate ? rate : "");
	return cudaSuccess;
}

static inline cudaError_t cudaMalloc(void **p, size_t n)
{
	*p = tfsc_copy_host_alloc(n);
	return *p ? cudaSuccess : -ENOMEM;
}

static inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
	(void)flags;
	return cudaMalloc(p, n);
}

static inline cudaError_t cudaFree(void *p)
{
	tfsc_copy_host_free(p);
	return cudaSuccess;
}

static inline cudaError_t cudaFreeHost(void *p)
{
	return cudaFree(p);
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	(void)flags;
	*s = NULL;
	return cudaSuccess;
}

static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	(void)s;
	return cudaSuccess;
}

static inline cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	return tfsc_copy_sync(s);
}

static inline cudaError_t cudaMemset(void *p, int v, size_t n)
{
	memset(p, v, n);
	return cudaSuccess;
}

static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
					  enum cudaMemcpyKind k, cudaStream_t s)
{
	return k == cudaMemcpyHostToDevice ? tfsc_copy_h2d(dst, src, n, s)
					   : tfsc_copy_d2h(dst, src, n, s);
}

/* height rows of width bytes, queued as that many copies. */
static inline cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
					    size_t spitch, size_t width, size_t height,
					    enum cudaMemcpyKind k, cudaStream_t s)
{
	for (size_t r = 0; r < height; r++) {
		cudaError_t e = cudaMemcpyAsync((char *)dst + r * dpitch,
						(const char *)src + r * spitch, width, k, s);

		if (e)
			return e;
	}
	return cudaSuccess;
}

static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, n, k, NULL);

	return e ? e : tfsc_copy_sync(NULL);
}

#endif
