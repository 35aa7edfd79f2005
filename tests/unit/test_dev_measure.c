/*
 * test_dev_measure.c - a device's measured bandwidth, from transfers with
 * made-up times (no clock, no sleeping).
 *
 * Back-to-back transfers of 1 MiB taking 10 ms each measure 100 MiB/s. A
 * long gap between two transfers (the device idle, or down: an s3 outage)
 * must not count as time in which the device was slow. Regression: the
 * window that spanned a 15 s outage measured almost nothing, and the
 * moving average dropped by its weight, so placement sent the device less
 * after every outage. Short gaps still count: under a light load the
 * measure is the load, as before.
 */
#include "dev.h"
#include "test.h"

#include <stdlib.h>

#define MiB (1ULL << 20)
#define MS 1000000ULL

/* n transfers of 1 MiB, each taking 10 ms, starting every step ns from *t. */
static void run(struct tb_dev *d, uint64_t *t, int n, uint64_t step)
{
	for (int i = 0; i < n; i++) {
		dev_measure(d, MiB, *t, *t + 10 * MS);
		*t += step;
	}
}

static double mibs(const struct tb_dev *d)
{
	return d->bw_measured / (double)MiB;
}

int main(void)
{
	struct tb_dev *d = calloc(1, sizeof(*d));
	uint64_t t = 1000 * MS;

	CHECK(d);
	run(d, &t, 100, 10 * MS); /* busy: 100 MiB/s */
	CHECK(mibs(d) > 99 && mibs(d) < 101);
	t += 15000 * MS; /* an outage: nothing for 15 s */
	run(d, &t, 30, 10 * MS);
	CHECK(mibs(d) > 99 && mibs(d) < 101);

	/* A light load: a transfer every 50 ms measures the load, 20 MiB/s. */
	free(d);
	d = calloc(1, sizeof(*d));
	CHECK(d);
	t = 1000 * MS;
	run(d, &t, 200, 50 * MS);
	CHECK(mibs(d) > 19 && mibs(d) < 21);
	free(d);
	return 0;
}
