/*
 * test_s3obj.c - the packed objects of an s3 tier (tiers/s3obj.c), with
 * no bucket: the allocator fills one object at a time; a block's offset in
 * its object follows the layout; an object half dead is queued for
 * compaction, and its new version leaves the old one to delete; an object
 * nothing uses is deleted and its number reused; a failed PUT gives its
 * slots back; at mount, the sweep keeps the newest version that holds every
 * slot in use and deletes every other one, never keeps a torn version (a
 * PUT cut short, which s3rver keeps), counts what is missing, and the next
 * generation is above all it saw.
 */
#include "s3obj.h"
#include "test.h"

#include <errno.h>
#include <stdlib.h>

#define PACK 8
#define NOBJ 64
#define BS 4096

static void alloc_n(struct s3objs *t, unsigned n, uint64_t first)
{
	for (unsigned i = 0; i < n; i++) {
		uint64_t slot;

		CHECK_EQ(s3obj_alloc(t, &slot), 0);
		CHECK_EQ(slot, first + i);
	}
}

static void lifecycle(void)
{
	struct slot_alloc a;
	struct s3objs t;
	struct s3obj_version old;

	CHECK_EQ(slot_alloc_init(&a, PACK * NOBJ), 0);
	CHECK_EQ(s3obj_init(&t, PACK, PACK * NOBJ, &a), 0);

	/* One object filled whole, the next one partly: slots in a row. */
	alloc_n(&t, PACK, 0);
	CHECK_EQ(t.open, S3OBJ_NONE);
	alloc_n(&t, 3, PACK);
	CHECK_EQ(t.open, 1);
	CHECK_EQ(t.held_slots, PACK - 3);
	CHECK_EQ(a.used, PACK + 3);
	s3obj_close(&t, 1);
	s3obj_stored(&t, 0, 1, 0xff);
	s3obj_stored(&t, 1, 2, 0x07);
	CHECK_EQ(t.stored, 2);
	CHECK_EQ(t.o[1].state, S3OBJ_STORED);
	/* The next slot comes from a fresh object: object 1 is closed. */
	alloc_n(&t, 1, 2 * PACK);

	CHECK_EQ(s3obj_offset(&t, PACK + 1, BS), BS);
	CHECK_EQ(s3obj_offset(&t, PACK + 3, BS), -ENOENT);
	CHECK_EQ(s3obj_offset(&t, 5, BS), 5 * BS);

	/* Half of object 0 dies: queued for compaction at the fourth. */
	for (uint64_t s = 0; s < 3; s++)
		CHECK_EQ(s3obj_free(&t, s), S3OBJ_TODO_NONE);
	CHECK_EQ(s3obj_free(&t, 3), S3OBJ_TODO_COMPACT);
	CHECK_EQ(t.dead_slots, 4);
	CHECK_EQ(s3obj_compact_next(&t), 0);
	CHECK_EQ(s3obj_compact_next(&t), S3OBJ_NONE);
	CHECK(t.o[0].compacting);
	/* A slot freed while compacting is dead in the new version: no delete yet. */
	CHECK_EQ(s3obj_free(&t, 4), S3OBJ_TODO_NONE);
	CHECK_EQ(s3obj_compacted(&t, 0, 3, 0xf0, &old), S3OBJ_TODO_NONE);
	CHECK_EQ(old.gen, 1);
	CHECK_EQ(old.layout, 0xff);
	CHECK(!old.whole);
	CHECK_EQ(t.dead_slots, 1); /* slot 4, in the new version */
	CHECK_EQ(s3obj_offset(&t, 5, BS), BS);
	CHECK_EQ(s3obj_offset(&t, 2, BS), -ENOENT);

	/* Half of the new version dead: queued again, once. */
	CHECK_EQ(s3obj_free(&t, 5), S3OBJ_TODO_COMPACT);
	CHECK_EQ(s3obj_free(&t, 6), S3OBJ_TODO_NONE);
	/* The rest dies: delete it, then its number is the next one handed out. */
	CHECK_EQ(s3obj_free(&t, 7), S3OBJ_TODO_DELETE);
	CHECK_EQ(t.o[0].state, S3OBJ_DELETING);
	CHECK_EQ(t.o[0].dels, 1);
	CHECK_EQ(t.stored, 2); /* until the delete is done */
	s3obj_deleted(&t, 0);
	CHECK_EQ(t.o[0].state, S3OBJ_FREE);
	CHECK_EQ(t.stored, 1);
	CHECK_EQ(t.dead_slots, 0);
	s3obj_close(&t, 2);
	alloc_n(&t, 1, 0);

	/* A failed PUT: its slots come back free, then the object. */
	s3obj_close(&t, 0);
	t.o[0].held = 1;
	s3obj_put_failed(&t, 0);
	CHECK_EQ(s3obj_free(&t, 0), S3OBJ_TODO_NONE);
	CHECK_EQ(t.o[0].state, S3OBJ_FREE);

	/* Everything freed: nothing held but what exists. */
	for (uint64_t s = PACK; s < PACK + 3; s++)
		s3obj_free(&t, s);
	s3obj_deleted(&t, 1);
	s3obj_free(&t, 2 * PACK);
	CHECK_EQ(a.used, 0);
	CHECK_EQ(t.held_slots, 0);
	CHECK_EQ(t.stored, 0);
	s3obj_fini(&t);
	slot_alloc_free_all(&a);
}

static void sweep(void)
{
	struct slot_alloc a;
	struct s3objs t;
	struct s3obj_version v[] = {
	    {2, 5, 0x03, false, false},	  /* holds slots 16 and 17: kept */
	    {2, 7, 0x01, false, false},	  /* newer, but lacks 17: deleted */
	    {2, 3, 0xff, false, false},	  /* older: deleted */
	    {3, 4, 0xff, false, false},	  /* nothing uses object 3: deleted whole */
	    {5, 9, 0x01, false, false},	  /* kept */
	    {5, 12, 0x01, false, true},	  /* newer but torn: deleted */
	    {70, 11, 0x01, false, false}, /* past the tier's end: deleted */
	};
	struct s3obj_version *del;
	size_t ndel;
	uint64_t missing, slot;
	unsigned whole = 0;

	CHECK_EQ(slot_alloc_init(&a, PACK * NOBJ), 0);
	CHECK_EQ(s3obj_init(&t, PACK, PACK * NOBJ, &a), 0);
	CHECK_EQ(s3obj_mark(&t, 16), 0);
	CHECK_EQ(s3obj_mark(&t, 17), 0);
	CHECK_EQ(s3obj_mark(&t, 40), 0);
	CHECK_EQ(s3obj_mark(&t, 40), -EEXIST);
	CHECK_EQ(s3obj_mark(&t, 48), 0); /* object 6: no version anywhere */
	CHECK_EQ(s3obj_sweep(&t, v, 7, &del, &ndel, &missing), 0);
	CHECK_EQ(missing, 1);
	CHECK_EQ(ndel, 5);
	for (size_t i = 0; i < ndel; i++) {
		CHECK(del[i].objno != 5 || del[i].gen == 12);
		CHECK(!(del[i].objno == 2 && del[i].gen == 5));
		whole += del[i].whole;
	}
	CHECK_EQ(whole, 1);
	free(del);
	CHECK_EQ(t.o[2].gen, 5);
	CHECK_EQ(t.o[2].layout, 0x03);
	CHECK_EQ(t.o[5].gen, 9);
	CHECK_EQ(t.o[3].state, S3OBJ_DELETING);
	CHECK_EQ(t.next_gen, 13);
	CHECK_EQ(s3obj_offset(&t, 17, BS), BS);
	CHECK_EQ(s3obj_offset(&t, 48, BS), -ENOENT);
	CHECK_EQ(t.stored, 3); /* 2, 5, and 3 until deleted */
	/* Free numbers below the highest seen come first, lowest first. */
	CHECK_EQ(s3obj_alloc(&t, &slot), 0);
	CHECK_EQ(slot, 0);
	s3obj_close(&t, 0);
	CHECK_EQ(s3obj_alloc(&t, &slot), 0);
	CHECK_EQ(slot, PACK);
	s3obj_fini(&t);
	slot_alloc_free_all(&a);
}

/* 64 blocks an object: layouts of 64 bits, the highest index included. */
static void wide(void)
{
	struct slot_alloc a;
	struct s3objs t;
	struct s3obj_version old;
	const unsigned pack = S3OBJ_PACK_MAX;

	CHECK_EQ(pack, 64);
	CHECK_EQ(slot_alloc_init(&a, 4 * pack), 0);
	CHECK_EQ(s3obj_init(&t, pack, 4 * pack, &a), 0);
	CHECK_EQ(s3obj_init(&t, pack + 1, 4 * pack, &a), -EINVAL);
	CHECK_EQ(s3obj_init(&t, pack, 4 * pack, &a), 0);
	alloc_n(&t, pack, 0);
	CHECK_EQ(t.open, S3OBJ_NONE);
	CHECK_EQ(t.o[0].used, UINT64_MAX);
	s3obj_stored(&t, 0, 1, UINT64_MAX);
	CHECK_EQ(s3obj_offset(&t, pack - 1, BS), (int64_t)(pack - 1) * BS);
	/* The upper half dies: compacted into the lower half. */
	for (unsigned i = pack / 2; i < pack; i++)
		s3obj_free(&t, i);
	CHECK_EQ(t.dead_slots, pack / 2);
	CHECK_EQ(s3obj_compact_next(&t), 0);
	s3obj_compacted(&t, 0, 2, UINT64_MAX >> (pack / 2), &old);
	CHECK_EQ(old.layout, UINT64_MAX);
	CHECK_EQ(t.dead_slots, 0);
	CHECK_EQ(s3obj_offset(&t, pack / 2 - 1, BS), (int64_t)(pack / 2 - 1) * BS);
	CHECK_EQ(s3obj_offset(&t, pack / 2, BS), -ENOENT);
	s3obj_fini(&t);
	slot_alloc_free_all(&a);
}

int main(void)
{
	lifecycle();
	sweep();
	wide();
	return 0;
}
