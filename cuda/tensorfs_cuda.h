/*
 * tensorfs_cuda.h - libtensorfs-cuda: copy between GPU memory and the
 * files of a tensorfs mount, straight from and into its DRAM tier.
 *
 * On a mount started with -o cuda=on, a call maps the daemon's DRAM arena
 * (once per process and mount; it is registered with CUDA then), asks the
 * daemon to pin the blocks of the range, copies with cudaMemcpyAsync
 * between the slots and device memory on the given stream, waits for the
 * copies, and releases the pin. A write is then visible to every reader
 * of the file, with size and mtime set as pwrite(2) sets them.
 *
 * Anywhere else (a mount without cuda=on, another filesystem, a process
 * the daemon does not serve) the same calls use pread/pwrite and
 * cudaMemcpy through a pinned bounce buffer: the caller's code does not
 * change. tfs_gpu_path says which path a file takes.
 *
 * Every call is synchronous: it returns once the bytes have arrived, so
 * that the device memory (read) or the file (write) may be used at once.
 * The stream orders the copies after the caller's earlier work on it;
 * NULL is the default stream. Calls are thread-safe.
 *
 * Errors are a negative errno; tfs_gpu_error gives the message of this
 * thread's last failed call. A failed call holds no pin. After a failed
 * tfs_gpu_write, each byte of its range holds the new data, the old data
 * or zero (the range is written in batches; a batch whose copy failed is
 * zeroed, so that no stale memory can show); the file may have grown
 * within the range; no byte outside the range has changed.
 */
#ifndef TENSORFS_CUDA_H
#define TENSORFS_CUDA_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What tfs_gpu_path answers. */
#define TFS_GPU_PATH_FALLBACK 0 /* pread/pwrite through a bounce buffer */
#define TFS_GPU_PATH_ZEROCOPY 1 /* DMA from and into the daemon's DRAM arena */

/*
 * Read up to len bytes of fd at offset into device_ptr, as pread(2) does:
 * returns the bytes read, fewer only at end of file, or -errno. Holes
 * read as zeros. fd must be open for reading.
 */
ssize_t tfs_gpu_read(int fd, off_t offset, size_t len, void *device_ptr, void *stream);

/*
 * Write len bytes of device_ptr to fd at offset, as pwrite(2) does (the
 * file grows as needed): returns len, or -errno. fd must be open for
 * writing; O_APPEND is not honoured, the offset is.
 */
ssize_t tfs_gpu_write(int fd, off_t offset, size_t len, const void *device_ptr, void *stream);

/* The path calls on fd take now: TFS_GPU_PATH_ZEROCOPY or _FALLBACK, or -errno. */
int tfs_gpu_path(int fd);

/* The message of this thread's last failed call; "" if none failed. */
const char *tfs_gpu_error(void);

/*
 * Close the connections, unregister and unmap every arena. Optional, for
 * a process that is done with tensorfs; later calls start over.
 */
void tfs_gpu_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif
