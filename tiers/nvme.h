/*
 * nvme.h - the nvme backend: one slab file on one folder, one I/O thread.
 *
 * A device owns a slab file of block-size slots (opened O_DIRECT), the
 * allocator of those slots, and a queue of requests in three classes
 * served in order: demand reads, prefetch reads, write-back. The I/O
 * thread drives io_uring with the arena registered as fixed buffers, or
 * libaio where io_uring cannot be set up. A device sees nothing but its own
 * queue: callers pass a request and get a completion callback on the
 * device's thread.
 */
#ifndef TENSORFS_NVME_H
#define TENSORFS_NVME_H

#include <libaio.h>
#include <stddef.h>
#include <stdint.h>

#include "dram.h"
#include "tb.h"

enum nvme_op { NVME_READ, NVME_WRITE };
enum nvme_class { NVME_CLS_DEMAND, NVME_CLS_PREFETCH, NVME_CLS_WB, NVME_NCLASS };

struct nvme_req {
	struct nvme_req *next;
	enum nvme_op op;
	enum nvme_class cls;
	uint64_t slot;
	void *buf;
	size_t len;
	size_t done_bytes; /* progress across short transfers */
	void (*done)(struct nvme_req *r, int err);
	struct iocb iocb; /* libaio engine only */
};

struct nvme_dev;

int nvme_open(struct nvme_dev **out, unsigned index, const char *dir, const char *store_id,
	      size_t block_size, enum tb_engine engine, unsigned queue_depth,
	      const struct dram_arena *arena, char *err, size_t errlen);
int nvme_start(struct nvme_dev *d);
/* Finish every queued request, then stop the thread. */
void nvme_stop(struct nvme_dev *d);
void nvme_close(struct nvme_dev *d);

void nvme_submit(struct nvme_dev *d, struct nvme_req *r);
/* Flush the device's write cache for the slab (fdatasync). */
int nvme_sync(struct nvme_dev *d);

int nvme_alloc(struct nvme_dev *d, uint64_t *slot);
void nvme_free(struct nvme_dev *d, uint64_t slot);
int nvme_mark(struct nvme_dev *d, uint64_t slot);
/* Take a failing device out of placement: it takes no new blocks. */
void nvme_set_full(struct nvme_dev *d);
uint64_t nvme_free_slots(struct nvme_dev *d);
void nvme_get_stats(struct nvme_dev *d, struct tb_dev_stats *st);

#endif
