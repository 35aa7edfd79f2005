/*
 * u64vec.h - appending to a growable array of uint64_t.
 *
 * The daemon's lists of numbers (fs_ino_list's inode numbers in inode.c,
 * locvec's block locations in meta.c) are a pointer, a count and a
 * capacity; u64vec_push appends to one, doubling its room when full.
 */
#ifndef TFS_FS_U64VEC_H
#define TFS_FS_U64VEC_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* Append x to *v (*n used of *cap); the first allocation holds first. 0 or -ENOMEM. */
static inline int u64vec_push(uint64_t **v, size_t *n, size_t *cap, size_t first, uint64_t x)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : first;
		uint64_t *p = realloc(*v, c * sizeof(*p));

		if (!p)
			return -ENOMEM;
		*v = p;
		*cap = c;
	}
	(*v)[(*n)++] = x;
	return 0;
}

#endif
