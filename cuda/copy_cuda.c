/*
 * copy_cuda.c - the copy engine of libtensorfs-cuda: the CUDA runtime.
 *
 * Copies are cudaMemcpyAsync with cudaMemcpyDefault, so the "device"
 * pointer may be device, managed or CUDA host memory (unified addressing);
 * holes are cudaMemsetAsync. The arena is registered portable, so that
 * every device and context of the process may DMA from it. A CUDA error
 * becomes an errno with CUDA's own message.
 */
#include "client.h"
#include "copy.h"

#include <cuda_runtime.h>
#include <errno.h>

const char tfsc_copy_engine[] = "cuda";

static int cuda_fail(cudaError_t e, const char *what)
{
	int err;

	switch (e) {
	case cudaErrorMemoryAllocation:
		err = -ENOMEM;
		break;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidResourceHandle:
		err = -EINVAL;
		break;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
		err = -ENODEV;
		break;
	default:
		err = -EIO;
		break;
	}
	/* Clear the error unless it is sticky, so that the caller's next CUDA call is clean. */
	cudaGetLastError();
	return tfsc_fail(err, "%s: %s", what, cudaGetErrorString(e));
}

int tfsc_copy_check(const void *p, size_t len)
{
	struct cudaPointerAttributes a;
	cudaError_t e;

	(void)len;
	e = cudaPointerGetAttributes(&a, p);
	if (e != cudaSuccess)
		return cuda_fail(e, "not a pointer CUDA can copy to or from");
	/*
	 * cudaMemcpyDefault would take any other address for pageable host
	 * memory and write to it from a driver thread: refuse it here.
	 */
	if (a.type == cudaMemoryTypeUnregistered)
		return tfsc_fail(-EFAULT, "%p is not device, managed or CUDA host memory", p);
	return 0;
}

int tfsc_copy_register(void *host, size_t len, bool *done)
{
	cudaError_t e = cudaHostRegister(host, len, cudaHostRegisterPortable);

	*done = e == cudaSuccess;
	return *done ? 0 : cuda_fail(e, "cudaHostRegister of the arena");
}

void tfsc_copy_unregister(void *host)
{
	cudaHostUnregister(host);
}

int tfsc_copy_h2d(void *dev, const void *host, size_t n, void *stream)
{
	cudaError_t e = cudaMemcpyAsync(dev, host, n, cudaMemcpyDefault, (cudaStream_t)stream);

	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpyAsync to the device");
}

int tfsc_copy_d2h(void *host, const void *dev, size_t n, void *stream)
{
	cudaError_t e = cudaMemcpyAsync(host, dev, n, cudaMemcpyDefault, (cudaStream_t)stream);

	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpyAsync from the device");
}

int tfsc_copy_zero(void *dev, size_t n, void *stream)
{
	cudaError_t e = cudaMemsetAsync(dev, 0, n, (cudaStream_t)stream);

	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemsetAsync");
}

int tfsc_copy_sync(void *stream)
{
	cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);

	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaStreamSynchronize");
}

int tfsc_copy_event_new(void **ev)
{
	cudaEvent_t e;
	cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);

	if (r != cudaSuccess)
		return cuda_fail(r, "cudaEventCreate");
	*ev = e;
	return 0;
}

void tfsc_copy_event_free(void *ev)
{
	if (ev)
		cudaEventDestroy((cudaEvent_t)ev);
}

int tfsc_copy_event_record(void *ev, void *stream)
{
	cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);

	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaEventRecord");
}

int tfsc_copy_event_wait(void *ev)
{
	cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);

	return e == cudaSuccess ? 0 : cuda_fail(e, "cudaEventSynchronize");
}

void *tfsc_copy_host_alloc(size_t n)
{
	void *p = NULL;
	cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocPortable);

	if (e != cudaSuccess) {
		cuda_fail(e, "cudaHostAlloc of a bounce buffer");
		return NULL;
	}
	return p;
}

void tfsc_copy_host_free(void *p)
{
	cudaFreeHost(p);
}
