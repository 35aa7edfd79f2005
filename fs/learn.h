/*
 * learn.h - the access-trace learner (see learn.c).
 */
#ifndef TENSORFS_LEARN_H
#define TENSORFS_LEARN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define FS_LEARN_UNKNOWN UINT64_MAX

#define FS_LEARN_STREAMS 64 /* folders learned apart; a new one then takes the idlest */

struct learn_file;
struct learn_stream;

struct fs_learner {
	pthread_mutex_t lock;	     /* guards all but last_ino and last_st */
	uint64_t last_ino;	     /* atomic: the file touched last */
	struct learn_stream *last_st; /* atomic: its stream */
	struct learn_stream *streams[FS_LEARN_STREAMS]; /* one per folder (learn.c) */
	unsigned nstreams;
	uint64_t n;	      /* records so far, in all streams */
	uint64_t touches;
	uint64_t period;      /* atomic: the streams' files in their cycles; 0 while none is known */
	uint64_t bytes;	      /* bytes of the files of one cycle of each stream */
	uint64_t block;	      /* the block size, set by the owner (0: blocks not counted) */
	uint64_t blocks;      /* blocks of those files, each file rounded up */
	uint64_t tails;	      /* of them, files' last blocks that the file fills only in part */
	uint64_t written;     /* of them, blocks of the files that the cycle writes */
	struct learn_file **files;
	uint64_t nfiles;      /* files known (fs_learn_forget drops a deleted one) */
	uint64_t generation; /* bumps at every record, for the prefetcher */
	unsigned next_turn;  /* the stream first among equals at the next fs_learn_next */
};

struct fs_learn_stats {
	uint64_t period, bytes, blocks, tails, written, position, records, streams, files;
	double confidence;
};

int fs_learn_init(struct fs_learner *l);
void fs_learn_fini(struct fs_learner *l);
/*
 * A read or write of len bytes at off reached file ino (of this size), in
 * folder stream: a file's uses are learned in the stream of its first.
 */
void fs_learn_touch(struct fs_learner *l, uint64_t ino, uint64_t stream, uint64_t size,
		    uint64_t off, uint64_t len, bool write);
/*
 * ino is gone (deleted, and closed by all): its record goes. Its uses
 * stay in the rings, where they count as a file no longer known.
 */
void fs_learn_forget(struct fs_learner *l, uint64_t ino);
/*
 * Records until ino is used again, or FS_LEARN_UNKNOWN without a cycle: its
 * stream's, scaled to all the streams' (learn.c).
 */
uint64_t fs_learn_distance(struct fs_learner *l, uint64_t ino);

/* What the cycle says of a file's next use. */
struct fs_learn_use {
	uint64_t dist; /* records until then, FS_LEARN_UNKNOWN without a cycle */
	bool write;    /* that use begins with a write (the file is rewritten) */
	bool now;      /* the file is in use: recorded within the last IN_USE records */
	uint64_t size; /* its size when last used; 0 if unknown */
};
void fs_learn_next_use(struct fs_learner *l, uint64_t ino, struct fs_learn_use *u);
void fs_learn_stats(struct fs_learner *l, struct fs_learn_stats *st);
/*
 * The files that come next in the cycle, soonest first, up to max files and
 * about budget bytes: what the prefetcher loads. Returns how many. Files
 * of several streams as soon as each other go in turns: each call starts
 * the turn at the next stream.
 */
unsigned fs_learn_next(struct fs_learner *l, uint64_t *inos, unsigned max, uint64_t budget,
		       uint64_t *generation);

#endif
