/*
 * gputest.c - failing with a message, and reproducible random data, for
 * the GPU tests (gputest.h).
 */
#include "gputest.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

void gt_die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

uint64_t gt_rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

void gt_fill(uint8_t *p, size_t n, uint64_t *s)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(gt_rnd(s) >> 56);
}

uint64_t gt_seed(void)
{
	return (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
}
