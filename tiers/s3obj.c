/*
 * s3obj.c - which slots each packed object of an s3 device holds, and what
 * must happen to it (see s3obj.h): the allocator that fills one object at a
 * time, the decisions to delete an object no slot uses or to compact one
 * that is half dead, and the mount-time sweep that keeps, of the versions
 * the bucket holds, the newest that holds every slot in use.
 *
 * Counters: held_slots are slots that neither the allocator may hand out
 * nor anyone uses (the dead and never-filled slots of objects that exist,
 * and the unfilled rest of the open object); dead_slots are slots in stored
 * versions that nothing uses, the bytes compaction wins back.
 */
#include "s3obj.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static unsigned bits(uint64_t v)
{
	return (unsigned)__builtin_popcountll(v);
}

int s3obj_init(struct s3objs *t, unsigned pack, uint64_t nslots, struct slot_alloc *alloc)
{
	memset(t, 0, sizeof(*t));
	if (pack < 1 || pack > S3OBJ_PACK_MAX)
		return -EINVAL;
	t->pack = pack;
	t->alloc = alloc;
	t->max = nslots / pack;
	t->open = S3OBJ_NONE;
	t->next_gen = 1;
	return 0;
}

void s3obj_fini(struct s3objs *t)
{
	free(t->o);
	free(t->free_objs);
	free(t->compact_q);
	memset(t, 0, sizeof(*t));
}

/* Entries for object numbers below n, new ones FREE. */
static int grow(struct s3objs *t, uint64_t n)
{
	uint64_t cap = t->cap ? t->cap : 64;
	struct s3obj *o;

	if (n <= t->n)
		return 0;
	if (n > t->cap) {
		while (cap < n)
			cap *= 2;
		o = realloc(t->o, cap * sizeof(*o));
		if (!o)
			return -ENOMEM;
		t->o = o;
		t->cap = cap;
	}
	memset(t->o + t->n, 0, (n - t->n) * sizeof(*t->o));
	t->n = n;
	return 0;
}

static int push_u64(uint64_t **v, size_t *n, size_t *cap, uint64_t x)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 64;
		uint64_t *p = realloc(*v, c * sizeof(*p));

		if (!p)
			return -ENOMEM;
		*v = p;
		*cap = c;
	}
	(*v)[(*n)++] = x;
	return 0;
}

/* objno holds nothing any more and no version of it is left: reuse it. */
static void to_free(struct s3objs *t, uint64_t objno)
{
	struct s3obj *o = &t->o[objno];

	t->held_slots -= t->pack - bits(o->used);
	memset(o, 0, sizeof(*o));
	/* Without room on the stack the number is lost until the next mount. */
	(void)push_u64(&t->free_objs, &t->nfree, &t->cap_free, objno);
}

/* No slot of a stored objno is in use: delete its version. */
static void to_deleting(struct s3objs *t, uint64_t objno)
{
	struct s3obj *o = &t->o[objno];

	o->state = S3OBJ_DELETING;
	o->dels = 1;
	o->compact_queue = false;
}

static bool worth_compacting(const struct s3obj *o)
{
	return o->state == S3OBJ_STORED && o->used && o->layout &&
	       bits(o->layout & ~o->used) * 2 >= bits(o->layout);
}

/*
 * Drop from the compaction queue what was taken and what is no longer
 * queued (deleted, reused): while the device is never idle, nothing is
 * taken, and the queue holds at most one entry per object.
 */
static void squeeze_queue(struct s3objs *t)
{
	size_t n = 0;

	for (size_t i = t->compact_head; i < t->ncompact; i++) {
		uint64_t k = t->compact_q[i];

		if (k < t->n && t->o[k].compact_queue)
			t->compact_q[n++] = k;
	}
	t->compact_head = 0;
	t->ncompact = n;
}

static enum s3obj_todo queue_compaction(struct s3objs *t, uint64_t objno)
{
	struct s3obj *o = &t->o[objno];

	if (o->compacting || o->compact_queue || !worth_compacting(o))
		return S3OBJ_TODO_NONE;
	if (t->ncompact == t->cap_compact)
		squeeze_queue(t);
	if (push_u64(&t->compact_q, &t->ncompact, &t->cap_compact, objno) < 0)
		return S3OBJ_TODO_NONE; /* stays as it is: only space is lost */
	o->compact_queue = true;
	return S3OBJ_TODO_COMPACT;
}

int s3obj_alloc(struct s3objs *t, uint64_t *slot)
{
	struct s3obj *o;
	unsigned i;

	if (t->open == S3OBJ_NONE) {
		uint64_t k;

		if (t->nfree) {
			k = t->free_objs[--t->nfree];
		} else if (t->n < t->max) {
			if (grow(t, t->n + 1) < 0)
				return -ENOMEM;
			k = t->n - 1;
		} else {
			return -ENOSPC;
		}
		o = &t->o[k];
		memset(o, 0, sizeof(*o));
		o->state = S3OBJ_FILLING;
		t->held_slots += t->pack;
		t->open = k;
		t->open_next = 0;
	}
	o = &t->o[t->open];
	i = t->open_next++;
	*slot = t->open * t->pack + i;
	if (slot_alloc_mark(t->alloc, *slot) < 0)
		return -EIO; /* the bitmap disagrees with the objects: cannot be */
	o->used |= 1ULL << i;
	t->held_slots--;
	if (t->open_next == t->pack)
		t->open = S3OBJ_NONE;
	return 0;
}

int s3obj_mark(struct s3objs *t, uint64_t slot)
{
	uint64_t k = slot / t->pack;
	uint64_t bit = 1ULL << (slot % t->pack);
	int ret;

	if (k >= t->max)
		return -ERANGE;
	ret = grow(t, k + 1);
	if (ret)
		return ret;
	ret = slot_alloc_mark(t->alloc, slot);
	if (ret)
		return ret;
	t->o[k].state = S3OBJ_STORED; /* which version: s3obj_sweep */
	t->o[k].used |= bit;
	return 0;
}

enum s3obj_todo s3obj_free(struct s3objs *t, uint64_t slot)
{
	uint64_t k = slot / t->pack;
	uint64_t bit = 1ULL << (slot % t->pack);
	struct s3obj *o = s3obj_get(t, k);

	if (!o || !(o->used & bit) || slot_alloc_put(t->alloc, slot) < 0)
		return S3OBJ_TODO_NONE;
	o->used &= ~bit;
	t->held_slots++;
	if (o->state == S3OBJ_FILLING) {
		if (!o->used && !o->held && t->open != k) {
			to_free(t, k);
			return S3OBJ_TODO_NONE;
		}
		return S3OBJ_TODO_FILL;
	}
	if (o->state != S3OBJ_STORED)
		return S3OBJ_TODO_NONE;
	if (o->layout & bit)
		t->dead_slots++;
	if (!o->used && !o->compacting) {
		to_deleting(t, k);
		return S3OBJ_TODO_DELETE;
	}
	return queue_compaction(t, k);
}

void s3obj_close(struct s3objs *t, uint64_t objno)
{
	if (t->open == objno)
		t->open = S3OBJ_NONE;
}

void s3obj_stored(struct s3objs *t, uint64_t objno, uint32_t gen, uint64_t layout)
{
	struct s3obj *o = &t->o[objno];

	o->state = S3OBJ_STORED;
	o->gen = gen;
	o->layout = layout;
	o->held = 0;
	t->stored++;
	t->dead_slots += bits(layout & ~o->used);
}

void s3obj_put_failed(struct s3objs *t, uint64_t objno)
{
	struct s3obj *o = &t->o[objno];

	o->held = 0;
	if (!o->used && t->open != objno)
		to_free(t, objno);
}

void s3obj_deleted(struct s3objs *t, uint64_t objno)
{
	struct s3obj *o = &t->o[objno];

	if (o->state != S3OBJ_DELETING || !o->dels || --o->dels)
		return;
	t->stored--;
	t->dead_slots -= bits(o->layout);
	to_free(t, objno);
}

enum s3obj_todo s3obj_compacted(struct s3objs *t, uint64_t objno, uint32_t gen, uint64_t layout,
				struct s3obj_version *old)
{
	struct s3obj *o = &t->o[objno];

	old->objno = objno;
	old->gen = o->gen;
	old->layout = o->layout;
	old->whole = false;
	t->dead_slots -= bits(o->layout & ~o->used);
	t->dead_slots += bits(layout & ~o->used);
	o->gen = gen;
	o->layout = layout;
	o->compacting = false;
	if (!o->used) {
		to_deleting(t, objno);
		return S3OBJ_TODO_DELETE;
	}
	return queue_compaction(t, objno);
}

uint64_t s3obj_compact_next(struct s3objs *t)
{
	while (t->compact_head < t->ncompact) {
		uint64_t k = t->compact_q[t->compact_head++];
		struct s3obj *o = s3obj_get(t, k);

		if (!o || !o->compact_queue)
			continue;
		o->compact_queue = false;
		if (o->compacting || !worth_compacting(o))
			continue;
		o->compacting = true;
		return k;
	}
	t->compact_head = t->ncompact = 0;
	return S3OBJ_NONE;
}

enum s3obj_todo s3obj_compact_abort(struct s3objs *t, uint64_t objno)
{
	struct s3obj *o = &t->o[objno];

	o->compacting = false;
	if (o->state == S3OBJ_STORED && !o->used) {
		to_deleting(t, objno);
		return S3OBJ_TODO_DELETE;
	}
	return S3OBJ_TODO_NONE;
}

static int version_cmp(const void *a, const void *b)
{
	const struct s3obj_version *x = a, *y = b;

	if (x->objno != y->objno)
		return x->objno < y->objno ? -1 : 1;
	return x->gen > y->gen ? -1 : x->gen < y->gen; /* newest first */
}

int s3obj_sweep(struct s3objs *t, struct s3obj_version *v, size_t n, struct s3obj_version **del,
		size_t *ndel, uint64_t *missing)
{
	struct s3obj_version *d = malloc((n ? n : 1) * sizeof(*d));
	size_t nd = 0;

	*missing = 0;
	if (!d)
		return -ENOMEM;
	if (n) /* v may be NULL when the bucket holds none */
		qsort(v, n, sizeof(*v), version_cmp);
	for (size_t i = 0; i < n;) {
		uint64_t k = v[i].objno;
		size_t j = i, keep = n;
		struct s3obj *o;

		while (j < n && v[j].objno == k)
			j++;
		for (size_t x = i; x < j; x++)
			if (v[x].gen >= t->next_gen)
				t->next_gen = v[x].gen + 1;
		if (k >= t->max || grow(t, k + 1) < 0) {
			for (; i < j; i++)
				d[nd++] = (struct s3obj_version){k, v[i].gen, v[i].layout, false, false};
			continue;
		}
		o = &t->o[k];
		if (o->used) {
			for (size_t x = i; x < j && keep == n; x++)
				if (!v[x].torn && (v[x].layout & o->used) == o->used)
					keep = x;
			for (size_t x = i; x < j && keep == n; x++)
				if (!v[x].torn)
					keep = x; /* the newest whole; the slots it lacks read as errors */
			if (keep == n || (v[keep].layout & o->used) != o->used)
				(*missing)++;
			if (keep != n) {
				o->gen = v[keep].gen;
				o->layout = v[keep].layout;
			}
			o->gets = 1; /* no GET runs at mount: marks "looked at" */
		} else {
			o->state = S3OBJ_DELETING;
			o->dels = (uint8_t)(j - i < 255 ? j - i : 255);
		}
		for (size_t x = i; x < j; x++) {
			if (x == keep)
				continue;
			d[nd++] = (struct s3obj_version){k, v[x].gen, v[x].layout, !o->used, false};
			if (!o->used)
				o->layout |= v[x].layout;
		}
		i = j;
	}
	t->held_slots = t->dead_slots = t->stored = 0;
	t->nfree = 0;
	for (uint64_t k = t->n; k-- > 0;) {
		struct s3obj *o = &t->o[k];

		if (o->state == S3OBJ_STORED && !o->gets) {
			(*missing)++; /* in use, and no version at all */
			o->layout = 0;
		}
		o->gets = 0;
		if (o->state == S3OBJ_FREE) {
			if (push_u64(&t->free_objs, &t->nfree, &t->cap_free, k) < 0) {
				free(d);
				return -ENOMEM;
			}
			continue;
		}
		t->held_slots += t->pack - bits(o->used);
		if (o->layout)
			t->stored++;
		t->dead_slots += bits(o->layout & ~o->used);
	}
	for (uint64_t k = 0; k < t->n; k++)
		queue_compaction(t, k);
	*del = d;
	*ndel = nd;
	return 0;
}

int64_t s3obj_offset(const struct s3objs *t, uint64_t slot, size_t block_size)
{
	const struct s3obj *o = s3obj_get(t, slot / t->pack);
	uint64_t bit = 1ULL << (slot % t->pack);

	if (!o || o->state != S3OBJ_STORED || !(o->layout & bit))
		return -ENOENT;
	return (int64_t)bits(o->layout & (bit - 1)) * (int64_t)block_size;
}
