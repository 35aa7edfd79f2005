/*
 * s3.c - the s3 backend (being written): until it lands, a remote=s3://
 * tier is refused at mount with a clear message.
 */
#include "dev.h"

#include <errno.h>
#include <stdio.h>

int dev_open_s3(struct tb_dev **out, unsigned index, const struct tb_s3_config *cfg,
		const char *store_id, size_t block_size, unsigned queue_depth, uint64_t bw_cap,
		uint64_t cap_bytes, const struct dram_arena *arena, char *err, size_t errlen)
{
	(void)out;
	(void)index;
	(void)store_id;
	(void)block_size;
	(void)queue_depth;
	(void)bw_cap;
	(void)cap_bytes;
	(void)arena;
	snprintf(err, errlen, "remote=s3://%s: the s3 tier is not available in this build",
		 cfg && cfg->bucket ? cfg->bucket : "");
	return -EOPNOTSUPP;
}
