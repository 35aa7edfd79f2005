/*
 * s3obj.h - the objects of an s3 device that packs several blocks into one
 * object: which slots each object number holds, and what must happen to it.
 *
 * Slot s lives in object s / pack, at index s % pack. An object is written
 * whole, once, by one PUT of the blocks the write-back gave it in a row;
 * its key names its number, a generation and its layout (the indexes it
 * holds, as a bitmap), so a block's byte offset in it is the number of
 * layout bits below its index. Compaction writes a new version with only
 * the blocks still in use, under a higher generation, and deletes the old
 * one: locations never change, so the metadata store never hears of it.
 * At mount the bucket is listed; for each object the newest version that
 * holds every slot in use is kept, and everything else is deleted (crashed
 * writes, versions left by a crash during compaction, dead objects). A
 * version whose size is not its layout's is never kept: S3 stores a PUT
 * whole or not at all, but s3rver keeps what it got of a PUT whose client
 * died, and a compaction cut short by a crash left a newer, torn version.
 *
 * Pure bookkeeping, no I/O: the engine (s3io.c) and the device's slot
 * calls (s3.c) call it under the device lock and do what it says.
 * tests/unit/test_s3obj.c drives it alone.
 */
#ifndef TENSORFS_S3OBJ_H
#define TENSORFS_S3OBJ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"

#define S3OBJ_PACK_MAX 64 /* a layout is 64 bits */
#define S3OBJ_NONE UINT64_MAX

enum s3obj_state {
	S3OBJ_FREE,	/* no version in the bucket: the allocator may open it */
	S3OBJ_FILLING,	/* slots handed out, its PUT not done */
	S3OBJ_STORED,	/* a version holds its blocks */
	S3OBJ_DELETING, /* no slot in use: its versions are being deleted */
};

struct s3obj {
	uint32_t gen;	 /* generation of the stored version */
	uint64_t used;	 /* slots handed out and not freed */
	uint64_t layout; /* slots the stored version holds */
	uint8_t state;
	uint8_t gets;	    /* GETs in flight that read the stored version */
	uint8_t held;	    /* write requests the engine holds for it (FILLING) */
	uint8_t dels;	    /* deletes of its versions not yet done (DELETING) */
	bool compacting;    /* a compaction is rewriting it */
	bool compact_queue; /* on the compaction queue */
};

/* A version found in the bucket, or one to delete. */
struct s3obj_version {
	uint64_t objno;
	uint32_t gen;
	uint64_t layout;
	bool whole; /* to delete: one of a DELETING object's (s3obj_deleted when done) */
	bool torn;  /* found: its size is not its layout's (a PUT cut short), never kept */
};

struct s3objs {
	unsigned pack;
	struct slot_alloc *alloc; /* the device's slot bitmap, kept in step */
	struct s3obj *o;
	uint64_t n;	     /* entries in o: object numbers ever seen or opened */
	uint64_t cap;	     /* entries allocated */
	uint64_t max;	     /* object numbers there may be: the device's slots / pack */
	uint64_t *free_objs; /* a stack of free object numbers below n */
	size_t nfree, cap_free;
	uint64_t open;	    /* the object the allocator fills, or S3OBJ_NONE */
	unsigned open_next; /* its next index */
	uint32_t next_gen;
	uint64_t *compact_q; /* objects worth compacting, oldest first */
	size_t ncompact, cap_compact, compact_head;
	/* counters */
	uint64_t held_slots; /* slots of objects not FREE that are not in use */
	uint64_t dead_slots; /* slots in stored versions that are not in use */
	uint64_t stored;     /* objects with a version in the bucket */
};

/* What the engine must do after s3obj_free. */
enum s3obj_todo { S3OBJ_TODO_NONE, S3OBJ_TODO_DELETE, S3OBJ_TODO_COMPACT, S3OBJ_TODO_FILL };

int s3obj_init(struct s3objs *t, unsigned pack, uint64_t nslots, struct slot_alloc *alloc);
void s3obj_fini(struct s3objs *t);

/*
 * Hand out a slot: the next index of the open object, or a fresh object.
 * The slot is marked in the bitmap. -ENOSPC when no object is free.
 */
int s3obj_alloc(struct s3objs *t, uint64_t *slot);
/* A slot named by the metadata store, at mount: in use in a STORED object. */
int s3obj_mark(struct s3objs *t, uint64_t slot);
/*
 * A slot is no longer in use. Returns what to do: delete the object (it
 * holds nothing in use any more; it is DELETING now), look at its fill (it
 * is FILLING), compact it (queued), or nothing.
 */
enum s3obj_todo s3obj_free(struct s3objs *t, uint64_t slot);

/* The allocator stops filling objno: its PUT may go with what it has. */
void s3obj_close(struct s3objs *t, uint64_t objno);
/* objno's PUT of layout under gen succeeded: it is STORED. */
void s3obj_stored(struct s3objs *t, uint64_t objno, uint32_t gen, uint64_t layout);
/* objno's PUT failed: its requests fail, and their slots come back free. */
void s3obj_put_failed(struct s3objs *t, uint64_t objno);
/* One delete of a DELETING object's versions is done; FREE after the last. */
void s3obj_deleted(struct s3objs *t, uint64_t objno);
/*
 * A compaction of objno wrote the version (gen, layout): it replaces the
 * stored one, which *old receives (to be deleted once no GET reads it).
 * Returns what to do next, as s3obj_free does.
 */
enum s3obj_todo s3obj_compacted(struct s3objs *t, uint64_t objno, uint32_t gen, uint64_t layout,
				struct s3obj_version *old);
/* Next object worth compacting (marked compacting), or S3OBJ_NONE. */
uint64_t s3obj_compact_next(struct s3objs *t);
/* A compaction of objno ended without a new version: what to do, as s3obj_free. */
enum s3obj_todo s3obj_compact_abort(struct s3objs *t, uint64_t objno);

/*
 * At mount, after every slot in use was marked: the versions the bucket
 * holds decide each object's state. Versions to delete go to *del (n at
 * most; the caller frees the array); *missing counts objects in use that
 * no version holds whole. Free object numbers are known afterwards.
 */
int s3obj_sweep(struct s3objs *t, struct s3obj_version *v, size_t n, struct s3obj_version **del,
		size_t *ndel, uint64_t *missing);

/* Byte offset of slot's block in its object's stored version, or -ENOENT. */
int64_t s3obj_offset(const struct s3objs *t, uint64_t slot, size_t block_size);

static inline struct s3obj *s3obj_get(const struct s3objs *t, uint64_t objno)
{
	return objno < t->n ? &t->o[objno] : NULL;
}

#endif
