/*
 * aio_handle.h - a copy of DeepSpeed's aio handle (deepspeed_io_handle_t):
 * P worker threads, each with its own libaio context, that split every
 * scheduled read or write of a whole file between them.
 *
 * ah_pread()/ah_pwrite() stat and open the file and schedule it, as
 * async_pread()/async_pwrite() do; ah_wait() waits for everything scheduled,
 * closes the files, and reports every failed or short transfer.
 */
#ifndef SWAPBENCH_AIO_HANDLE_H
#define SWAPBENCH_AIO_HANDLE_H

#include <stdbool.h>
#include <stdint.h>

struct ah_config {
	int threads;	 /* intra_op_parallelism */
	int queue_depth; /* iocbs in flight per thread */
	uint64_t block_size;
	bool single_submit;  /* one io_submit per request */
	bool overlap_events; /* sliding window instead of submit-all/wait-all */
};

/* What one ah_wait() saw. */
struct ah_result {
	int ops;	 /* files transferred */
	uint64_t bytes;	 /* bytes asked for */
	double busy_s;	 /* first schedule to last completion */
	uint64_t errors; /* failed or short transfers */
};

struct ah_handle;

/* Start the threads and their contexts; @name names the threads. */
int ah_create(struct ah_handle **out, const struct ah_config *cfg, const char *name);

/* Wait for anything still scheduled, then stop the threads. */
void ah_destroy(struct ah_handle *h);

/*
 * Schedule a read of the whole file @path into @buf.  The file must be
 * @nbytes long; @nbytes must divide by the thread count.  @path must stay
 * valid until ah_wait().  Returns 0 or -errno (the file is then not
 * scheduled, and the error is printed).
 */
int ah_pread(struct ah_handle *h, const char *path, void *buf, uint64_t nbytes);

/* Schedule a write of @nbytes from @buf to the start of @path. */
int ah_pwrite(struct ah_handle *h, const char *path, const void *buf, uint64_t nbytes);

/* Number of files scheduled and not yet waited for. */
int ah_pending(const struct ah_handle *h);

/*
 * Wait until every scheduled file is done, close them, and fill @res.
 * Returns 0, or -EIO if any transfer failed or came up short (each one is
 * printed with its path and offset).
 */
int ah_wait(struct ah_handle *h, struct ah_result *res);

#endif
