/*
 * fuzz_meta.c - libFuzzer target: metadata records as stored in LMDB.
 *
 * The first byte picks the kind of value (inode, dirent, block id, block);
 * the rest is the value, in a buffer of exactly its size, handed to the
 * decoder the daemon reads it with (meta_decode_*). Any size must be
 * decoded or refused with -EIO, never read past; a decoded block keeps
 * every byte it was given and zeros the rest.
 */
#include "meta.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A record decoded with success (ret 0) is the first len bytes of the input. */
static void same_bytes(int ret, const void *rec, const void *v, size_t len)
{
	if (ret == 0 && memcmp(rec, v, len))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct meta_inode ino;
	struct meta_block b;
	uint64_t x, y;
	unsigned char *v;
	size_t n;
	int ret = 0;

	if (size < 1)
		return 0;
	n = size - 1;
	v = malloc(n ? n : 1);
	if (!v)
		return 0;
	memcpy(v, data + 1, n);
	switch (data[0] % 4) {
	case 0:
		ret = meta_decode_inode(v, n, &ino);
		same_bytes(ret, &ino, v, sizeof(ino));
		break;
	case 1:
		ret = meta_decode_dirent(v, n, &x, &y);
		break;
	case 2:
		ret = meta_decode_id(v, n, &x);
		same_bytes(ret, &x, v, sizeof(x));
		break;
	case 3:
		ret = meta_decode_block(v, n, &b);
		if (ret == 0) {
			unsigned char *p = (unsigned char *)&b;

			if (memcmp(p, v, n))
				abort();
			for (size_t i = n; i < sizeof(b); i++)
				if (p[i])
					abort();
		}
		break;
	}
	if (ret != 0 && ret != -EIO)
		abort();
	free(v);
	return 0;
}
