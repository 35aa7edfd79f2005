/*
 * test_dev_promote.c - a queued prefetch that a reader waits on moves to
 * the demand class (dev_promote), and the device's queues stay whole.
 *
 * A demand read that finds its block's prefetch still queued in tensorfs
 * (behind a full device queue) used to wait for every prefetch and the
 * write-backs' share queued before it. Checked: a promoted read is taken
 * with the demand reads, behind those queued before it and ahead of the
 * other prefetches; one in flight, or already promoted, or never queued on
 * this device is left alone; promoting a class's head, middle or tail
 * leaves that class's list and tail right, so requests queued afterwards
 * are taken in order and none is lost. No engine runs: the requests are
 * queued with dev_submit and taken with dev_take, as an engine would.
 */
#include "dev.h"
#include "test.h"

#include <stdlib.h>

static void no_kick(struct tb_dev *d)
{
	(void)d;
}

static const struct dev_engine idle_engine = {.name = "test", .kick = no_kick};

static struct tb_dev *new_dev(unsigned qd)
{
	struct tb_dev *d = calloc(1, sizeof(*d));

	CHECK(d);
	pthread_mutex_init(&d->lock, NULL);
	d->qd = qd;
	d->eng = &idle_engine;
	return d;
}

static unsigned finished;

static void done(struct tb_io *r, int err)
{
	(void)r;
	CHECK_EQ(err, 0);
	finished++;
}

static void queue(struct tb_dev *d, struct tb_io *r, enum io_op op, enum io_class cls)
{
	r->op = op;
	r->cls = cls;
	r->len = 4096;
	r->done = done;
	dev_submit(d, r);
}

/* Take everything, one at a time, into out; returns how many. */
static unsigned take_all(struct tb_dev *d, struct tb_io **out, unsigned max)
{
	unsigned n = 0;

	while (n < max && dev_take(d, out + n, 1) == 1)
		n++;
	return n;
}

static void order(void)
{
	struct tb_dev *d = new_dev(64);
	struct tb_io p[4] = {0}, dm = {0}, w = {0}, *out[8];

	queue(d, &w, IO_WRITE, IO_WB);
	for (int i = 0; i < 3; i++)
		queue(d, &p[i], IO_READ, IO_PREFETCH);
	queue(d, &dm, IO_READ, IO_DEMAND);

	CHECK(dev_promote(d, &p[1]));	/* the middle of the prefetch class */
	CHECK(p[1].cls == IO_DEMAND);
	CHECK(!dev_promote(d, &p[1])); /* now a demand read */
	CHECK(!dev_promote(d, &p[3])); /* never queued */
	CHECK(d->queued_reads == 4);

	CHECK(dev_promote(d, &p[2])); /* the tail */
	queue(d, &p[3], IO_READ, IO_PREFETCH); /* must follow p[0], not the promoted tail */

	CHECK_EQ(take_all(d, out, 8), 6);
	CHECK(out[0] == &dm);
	CHECK(out[1] == &p[1]);
	CHECK(out[2] == &p[2]);
	CHECK(out[3] == &p[0]);
	CHECK(out[4] == &p[3]);
	CHECK(out[5] == &w);
	CHECK(d->inflight[IO_DEMAND] == 3 && d->inflight[IO_PREFETCH] == 2 &&
	      d->inflight[IO_WB] == 1);
	CHECK(d->queued_reads == 0);
	CHECK(!dev_promote(d, &p[0])); /* in flight */

	/* Finished, each counts down the class it was taken in. */
	finished = 0;
	for (int i = 0; i < 6; i++)
		dev_finish(d, out[i], 4096);
	CHECK_EQ(finished, 6);
	CHECK(d->inflight[IO_DEMAND] == 0 && d->inflight[IO_PREFETCH] == 0 &&
	      d->inflight[IO_WB] == 0);
	free(d);
}

/* The head of the prefetch class, and the only one in it. */
static void head_and_only(void)
{
	struct tb_dev *d = new_dev(64);
	struct tb_io a = {0}, b = {0}, c = {0}, *out[4];

	queue(d, &a, IO_READ, IO_PREFETCH);
	queue(d, &b, IO_READ, IO_PREFETCH);
	CHECK(dev_promote(d, &a));
	CHECK(d->head[IO_PREFETCH] == &b && d->tail[IO_PREFETCH] == &b);
	CHECK(dev_promote(d, &b));
	CHECK(!d->head[IO_PREFETCH] && !d->tail[IO_PREFETCH]);
	CHECK(d->head[IO_DEMAND] == &a && d->tail[IO_DEMAND] == &b);
	queue(d, &c, IO_READ, IO_PREFETCH);
	CHECK(d->head[IO_PREFETCH] == &c && d->tail[IO_PREFETCH] == &c);
	CHECK_EQ(take_all(d, out, 4), 3);
	CHECK(out[0] == &a && out[1] == &b && out[2] == &c);
	free(d);
}

/* A full device: the promoted read goes first once a request finishes. */
static void full_queue(void)
{
	struct tb_dev *d = new_dev(2);
	struct tb_io busy[2] = {0}, p[3] = {0}, *out[4];

	for (int i = 0; i < 2; i++)
		queue(d, &busy[i], IO_READ, IO_PREFETCH);
	CHECK_EQ(take_all(d, out, 4), 2);
	for (int i = 0; i < 3; i++)
		queue(d, &p[i], IO_READ, IO_PREFETCH);
	CHECK_EQ(take_all(d, out, 4), 0); /* depth 2, both in flight */
	CHECK(dev_promote(d, &p[2]));
	dev_finish(d, &busy[0], 4096);
	CHECK_EQ(take_all(d, out, 4), 1);
	CHECK(out[0] == &p[2]);
	free(d);
}

int main(void)
{
	order();
	head_and_only();
	full_queue();
	return 0;
}
