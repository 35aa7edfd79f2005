/*
 * json_count.h - a table of counts set in a JSON object, in the table's
 * order: what the /.tensorfs files list most (ctl.c's stats, gpu.c's gpu
 * file). Header only; it calls nothing of tensorfs.
 */
#ifndef TENSORFS_JSON_COUNT_H
#define TENSORFS_JSON_COUNT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* A count shown under its key. */
struct fs_count {
	const char *key;
	uint64_t v;
};

/* Set each count of c[0..n) in o, in that order. */
static inline void fs_json_counts(json_t *o, const struct fs_count *c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		json_object_set_new(o, c[i].key, json_integer((json_int_t)c[i].v));
}

#endif
