/*
 * gputest.h - what the GPU tests (gpuproto.c, gpu_roundtrip.c) share:
 * failing with a message, and reproducible random data.
 */
#ifndef TENSORFS_GPUTEST_H
#define TENSORFS_GPUTEST_H

#include <stddef.h>
#include <stdint.h>

/* Print "FAIL: " and the message, and exit 1. */
void gt_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond))                                                                       \
			gt_die(__VA_ARGS__);                                                       \
	} while (0)

/* xorshift64*: reproducible from the seed a test prints at start. */
uint64_t gt_rnd(uint64_t *s);
/* n random bytes from the generator s. */
void gt_fill(uint8_t *p, size_t n, uint64_t *s);
/* A seed that differs between runs: the time and the pid. */
uint64_t gt_seed(void);

#endif
