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
 *
 * The placement weight is the capability: what the device moved in windows
 * in which it was driven hard (requests waiting, or half its depth in
 * flight). Regression: weighed by its recent rate, a device sent less
 * moved less and was sent less again, and the s3 tier's share of new
 * blocks fell from 12% to 3% over a 30-minute soak. Checked: a device
 * given less work keeps its weight; one that shows more when not driven
 * hard gains it; one driven hard that moves less loses it; a window with
 * retries (an outage) changes nothing. A device never driven hard keeps the
 * weight of an unmeasured one however little a light load sent it: with
 * placement giving an s3 tier eight blocks in a row, weighing it by that
 * little sent it nothing at all (fsx on nvme + s3 read nothing from s3).
 *
 * Health: three failed requests in a row put a device down; three ENOSPC
 * in a row do not, since a full device is not a broken one. Regression:
 * they did, and the only device's writers saw EIO instead of ENOSPC.
 */
#include "dev.h"
#include "test.h"

#include <errno.h>
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

static double weight_mibs(struct tb_dev *d)
{
	return dev_weight(d) / (double)MiB;
}

/* A device as placement sees it: up, with room, depth 32. */
static struct tb_dev *new_dev(void)
{
	struct tb_dev *d = calloc(1, sizeof(*d));

	CHECK(d);
	pthread_mutex_init(&d->lock, NULL);
	d->qd = 32;
	d->alloc.nslots = 1000;
	return d;
}

/* n transfers of 1 MiB taking len ns each, back to back from *t. */
static void busy(struct tb_dev *d, uint64_t *t, int n, uint64_t len)
{
	for (int i = 0; i < n; i++) {
		dev_measure(d, MiB, *t, *t + len);
		*t += len;
	}
}

static void capability(void)
{
	struct tb_dev *d = new_dev();
	uint64_t t = 1000 * MS;

	/* Never driven hard: a light load (20 MiB/s) leaves it at the start weight. */
	d->inflight[IO_WB] = 1;
	run(d, &t, 200, 50 * MS);
	CHECK(mibs(d) > 19 && mibs(d) < 21);
	CHECK(dev_weight(d) == 1e9);
	t += 15000 * MS;

	/* Driven hard (its whole depth in flight): 100 MiB/s is what it can do. */
	d->inflight[IO_WB] = 32;
	busy(d, &t, 100, 10 * MS);
	CHECK(weight_mibs(d) > 99 && weight_mibs(d) < 101);

	/* Sent less (one request at a time, 20 MiB/s): the weight stays. */
	d->inflight[IO_WB] = 1;
	run(d, &t, 200, 50 * MS);
	CHECK(mibs(d) > 19 && mibs(d) < 21); /* the rate it was given */
	CHECK(weight_mibs(d) > 99 && weight_mibs(d) < 101);

	/* Not driven hard, yet it moved more: 200 MiB/s raises the weight. */
	run(d, &t, 200, 5 * MS);
	CHECK(weight_mibs(d) > 195 && weight_mibs(d) < 205);

	/* Driven hard and slower now (50 MiB/s): the weight follows it down. */
	d->inflight[IO_WB] = 32;
	busy(d, &t, 200, 20 * MS);
	CHECK(weight_mibs(d) > 49 && weight_mibs(d) < 52);

	/* Driven hard through retries (requests waiting on a dead server): nothing learnt. */
	for (int i = 0; i < 50; i++) {
		d->retries++;
		busy(d, &t, 1, 200 * MS);
	}
	CHECK(weight_mibs(d) > 49 && weight_mibs(d) < 52);

	/* A request waiting in the queue also means driven hard, at any depth. */
	struct tb_io queued = {0};
	d->inflight[IO_WB] = 1;
	d->head[IO_WB] = d->tail[IO_WB] = &queued;
	busy(d, &t, 200, 40 * MS);
	CHECK(weight_mibs(d) > 24 && weight_mibs(d) < 27);

	/* A cap wins over the measure. */
	d->bw_cap = 300 * MiB;
	CHECK(weight_mibs(d) > 299 && weight_mibs(d) < 301);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

static void request_done(struct tb_io *r, int err)
{
	(void)r;
	(void)err;
}

/* n write-backs that end with res, one after the other. */
static void finish(struct tb_dev *d, int n, long res)
{
	for (int i = 0; i < n; i++) {
		struct tb_io r = {.op = IO_WRITE, .cls = IO_WB, .len = MiB, .done = request_done};

		d->inflight[IO_WB]++;
		CHECK(!dev_finish(d, &r, res));
	}
}

static void health(void)
{
	struct tb_dev *d = new_dev();

	finish(d, 5, -ENOSPC);
	CHECK_EQ(d->health, DEV_UP);
	CHECK(!dev_out(d));
	CHECK_EQ(d->errors, 5);
	finish(d, 2, -EIO);
	CHECK_EQ(d->health, DEV_UP);
	finish(d, 1, (long)MiB); /* a success: the count starts again */
	finish(d, 2, -EIO);
	CHECK_EQ(d->health, DEV_UP);
	finish(d, 1, -EIO);
	CHECK_EQ(d->health, DEV_DOWN);
	CHECK(dev_out(d));
	finish(d, 1, (long)MiB);
	CHECK_EQ(d->health, DEV_UP);
	free(d);
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

	capability();
	health();
	return 0;
}
