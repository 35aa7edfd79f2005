/*
 * stamp.h - the data swapbench writes, and the check of what it reads back.
 *
 * A file's bytes are stamped in units of STAMP_UNIT bytes at unit-aligned
 * file offsets.  Each unit opens with a header (magic, file id, iteration,
 * generation, offset) and holds pattern words seeded from those fields (one
 * per KiB and the last, or every word in full mode), so that a block that is
 * stale, misplaced, from another file, torn or zeroed shows up, and says
 * which write it came from.
 */
#ifndef SWAPBENCH_STAMP_H
#define SWAPBENCH_STAMP_H

#include <stdbool.h>
#include <stdint.h>

#include "swapbench.h"

#define STAMP_UNIT 4096u

/* Who wrote a file: the write the reader expects to find. */
struct stamp_key {
	uint32_t file_id;
	uint32_t iter; /* iteration of the write; 0 for the init phase */
	uint32_t gen;  /* micro-batch for activations; 0 otherwise */
};

/* Stamp and check every word (true), or a few words per unit (false). */
void stamp_set_full(bool full);

/*
 * Fill @len bytes at @buf, the file's bytes from offset 0, for @key.  Files
 * are a multiple of 1 KiB long, as DeepSpeed pads them.
 */
void stamp_fill(void *buf, uint64_t len, const struct stamp_key *key);

/*
 * Check @len bytes at @buf, read from the start of @path, against @key.
 * Prints each bad unit (up to SB_MAX_REPORTED_ERRORS per rank) with the file
 * offset of its first wrong word and counts it in @v.  Returns 0 or -EIO.
 */
int stamp_check(const void *buf, uint64_t len, const struct stamp_key *key, const char *path,
		struct sb_verify *v);

#endif
