/*
 * scrub.c - the check of every stored block against its hash (the ctl
 * command scrub, tfsctl scrub), and its report, /.tensorfs/scrub.
 *
 * The block records are taken SCRUB_STEP at a time, each step in a read
 * transaction of its own (one long one would keep LMDB from reusing its
 * pages), and their blocks are read from their devices and checked
 * (tb_check_stored), below demand reads; a block shared by several files
 * is read once. A block that fails is looked up again: one freed while it
 * was read, its location since reused, is not damaged. Then one walk of
 * the block maps finds the files that map the damaged blocks, and paths.c
 * names them. One scrub runs at a time; the report of the last one stays
 * until the next (scrub_lock guards it).
 */
#include "fs.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SCRUB_STEP 64	     /* block records a step takes, in a transaction of its own */
#define SCRUB_LIST_MAX 10000 /* damaged blocks the report lists; it counts them all */

/* A damaged block, and then a file block that maps it. */
struct scrub_bad {
	uint64_t id, loc;
	int err;   /* -EBADMSG: its bytes do not match its hash; else the read's error */
	bool used; /* some file maps it */
};

struct scrub_use {
	uint64_t ino, idx;
	size_t bad; /* index in the damaged blocks */
};

struct scrub {
	struct fs *fs;
	uint64_t blocks, unhashed, bytes;
	struct scrub_bad *bad;
	size_t nbad, cap_bad;
	struct scrub_use *use;
	size_t nuse, cap_use;
	bool interrupted;
};

void fs_scrub_init(struct fs *fs)
{
	pthread_mutex_init(&fs->scrub_lock, NULL);
}

void fs_scrub_fini(struct fs *fs)
{
	json_decref(fs->scrub_report);
	fs->scrub_report = NULL;
	pthread_mutex_destroy(&fs->scrub_lock);
}

static int grow(void **v, size_t *cap, size_t n, size_t sz)
{
	void *p;

	if (n < *cap)
		return 0;
	p = realloc(*v, (*cap ? *cap * 2 : 64) * sz);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = *cap ? *cap * 2 : 64;
	return 0;
}

/* Whether block id is still at loc: if not, it was freed while it was read. */
static bool still_stored(struct scrub *sc, uint64_t id, uint64_t loc)
{
	struct meta_block b;
	MDB_txn *txn;
	int ret = meta_begin(sc->fs->meta, false, &txn);

	if (ret)
		return true; /* cannot tell: report it */
	ret = meta_block_get(sc->fs->meta, txn, id, &b);
	meta_abort(txn);
	return ret != -ENOENT && (ret != 0 || b.loc == loc);
}

/* Check n records: every block read, those with a hash compared with it. */
static int scrub_step(struct scrub *sc, const uint64_t *ids, const struct meta_block *b, unsigned n)
{
	struct tb_check v[SCRUB_STEP];
	size_t bs = sc->fs->bs;
	int ret;

	for (unsigned i = 0; i < n; i++) {
		v[i] = (struct tb_check){.loc = b[i].loc, .len = b[i].len ? b[i].len : bs};
		v[i].hashed = b[i].flags & META_BLOCK_HASHED;
		memcpy(v[i].hash, b[i].hash, TB_HASH_LEN);
		sc->unhashed += !v[i].hashed;
		sc->bytes += v[i].len;
	}
	ret = tb_check_stored(sc->fs->tb, v, n);
	if (ret)
		return ret;
	sc->blocks += n;
	for (unsigned i = 0; i < n; i++) {
		if (v[i].result == 0 || !still_stored(sc, ids[i], b[i].loc))
			continue;
		ret = grow((void **)&sc->bad, &sc->cap_bad, sc->nbad, sizeof(*sc->bad));
		if (ret)
			return ret;
		sc->bad[sc->nbad++] = (struct scrub_bad){ids[i], b[i].loc, v[i].result, false};
	}
	return 0;
}

/* Every block record, in steps; stops early when the caller gives up (req interrupted). */
static int scrub_blocks(struct scrub *sc, fuse_req_t req)
{
	uint64_t ids[SCRUB_STEP], from = 0;
	struct meta_block b[SCRUB_STEP];
	unsigned n = SCRUB_STEP;
	int ret = 0;

	while (!ret && n == SCRUB_STEP) {
		MDB_txn *txn;

		if (req && fuse_req_interrupted(req)) {
			sc->interrupted = true;
			break;
		}
		ret = meta_begin(sc->fs->meta, false, &txn);
		if (ret)
			break;
		ret = meta_blocks_list(sc->fs->meta, txn, from, ids, b, SCRUB_STEP, &n);
		meta_abort(txn);
		if (!ret && n)
			ret = scrub_step(sc, ids, b, n);
		if (n)
			from = ids[n - 1] + 1;
	}
	return ret;
}

static int cmp_bad(const void *a, const void *b)
{
	uint64_t x = ((const struct scrub_bad *)a)->id, y = ((const struct scrub_bad *)b)->id;

	return x < y ? -1 : x > y;
}

static int cmp_use(const void *a, const void *b)
{
	const struct scrub_use *x = a, *y = b;

	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* A block map entry: the file block maps a damaged block when its id is one. */
static int find_use(void *arg, const struct meta_rec *r)
{
	struct scrub *sc = arg;
	struct scrub_bad key = {.id = r->id}, *hit;
	int ret;

	if (r->malformed)
		return 0;
	hit = bsearch(&key, sc->bad, sc->nbad, sizeof(*sc->bad), cmp_bad);
	if (!hit)
		return 0;
	ret = grow((void **)&sc->use, &sc->cap_use, sc->nuse, sizeof(*sc->use));
	if (ret)
		return ret;
	sc->use[sc->nuse++] = (struct scrub_use){r->ino, r->idx, (size_t)(hit - sc->bad)};
	hit->used = true;
	return 0;
}

/* The files that map the damaged blocks, and a path of each: sorted by file, then block. */
static int scrub_name(struct scrub *sc, struct fs_path **paths, size_t *npaths)
{
	struct fs_path *p = NULL;
	size_t n = 0;
	MDB_txn *txn;
	int ret;

	*paths = NULL;
	*npaths = 0;
	if (!sc->nbad)
		return 0;
	qsort(sc->bad, sc->nbad, sizeof(*sc->bad), cmp_bad);
	ret = meta_begin(sc->fs->meta, false, &txn);
	if (ret)
		return ret;
	ret = meta_walk(sc->fs->meta, txn, META_TAB_BMAP, find_use, sc);
	if (!ret && sc->nuse) {
		qsort(sc->use, sc->nuse, sizeof(*sc->use), cmp_use);
		p = calloc(sc->nuse, sizeof(*p));
		ret = p ? 0 : -ENOMEM;
	}
	for (size_t i = 0; !ret && i < sc->nuse; i++)
		if (!n || p[n - 1].ino != sc->use[i].ino)
			p[n++].ino = sc->use[i].ino;
	if (!ret)
		ret = fs_paths_find(sc->fs, txn, p, n);
	meta_abort(txn);
	*paths = p;
	*npaths = n;
	return ret;
}

static const char *bad_why(int err, char *buf, size_t len)
{
	if (err == -EBADMSG)
		return "checksum mismatch";
	snprintf(buf, len, "read failed: %s", strerror(-err));
	return buf;
}

/* One entry of the report: block id's damage, and the file block that maps it (u, or none). */
static json_t *bad_json(const struct scrub_bad *bad, const struct scrub_use *u,
			const struct fs_path *p, const struct tb_stats *st)
{
	unsigned dev = tb_loc_dev(bad->loc);
	char buf[128];
	const char *why = bad_why(bad->err, buf, sizeof(buf));
	json_t *j = json_pack("{sIsssIss}", "block_id", (json_int_t)bad->id, "tier",
			      dev < st->n_devs ? st->dev[dev].name : "?", "slot",
			      (json_int_t)tb_loc_slot(bad->loc), "error", why);

	if (!j)
		return NULL;
	json_object_set_new(j, "ino", u ? json_integer((json_int_t)u->ino) : json_null());
	json_object_set_new(j, "path", p && p->path ? json_string(p->path) : json_null());
	json_object_set_new(j, "index", u ? json_integer((json_int_t)u->idx) : json_null());
	if (u)
		log_err("scrub: %s (inode %llu) block %llu, stored at %s slot %llu: %s",
			p && p->path ? p->path : "(no name)", (unsigned long long)u->ino,
			(unsigned long long)u->idx, json_string_value(json_object_get(j, "tier")),
			(unsigned long long)tb_loc_slot(bad->loc), why);
	else
		log_err("scrub: block %llu, stored at %s slot %llu and mapped by no file: %s",
			(unsigned long long)bad->id, json_string_value(json_object_get(j, "tier")),
			(unsigned long long)tb_loc_slot(bad->loc), why);
	return j;
}

static json_t *scrub_json(struct scrub *sc, const char *state, time_t started, double secs,
			  const struct fs_path *paths, size_t npaths)
{
	struct tb_stats *st = calloc(1, sizeof(*st));
	json_t *list = json_array(), *j;
	size_t listed = 0, entries = sc->nuse, k = 0;

	if (!st || !list) {
		free(st);
		json_decref(list);
		return NULL;
	}
	tb_get_stats(sc->fs->tb, st);
	/* Each file block that maps a damaged block, by file; then blocks no file maps. */
	for (size_t i = 0; i < sc->nuse && listed < SCRUB_LIST_MAX; i++, listed++) {
		while (k < npaths && paths[k].ino != sc->use[i].ino)
			k++;
		json_array_append_new(list, bad_json(&sc->bad[sc->use[i].bad], &sc->use[i],
						     k < npaths ? &paths[k] : NULL, st));
	}
	for (size_t i = 0; i < sc->nbad; i++) {
		if (sc->bad[i].used)
			continue;
		entries++;
		if (listed < SCRUB_LIST_MAX) {
			json_array_append_new(list, bad_json(&sc->bad[i], NULL, NULL, st));
			listed++;
		}
	}
	free(st);
	j = json_pack("{sssIsfsIsIsIsIsosb}", "state", state, "started", (json_int_t)started,
		      "seconds", secs, "blocks", (json_int_t)sc->blocks, "bytes",
		      (json_int_t)sc->bytes, "unverified", (json_int_t)sc->unhashed, "bad_blocks",
		      (json_int_t)sc->nbad, "bad", list, "listed_all", listed == entries);
	return j;
}

static double since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Keep report as the last scrub's, and let the next one run. */
static void scrub_done(struct fs *fs, json_t *report)
{
	pthread_mutex_lock(&fs->scrub_lock);
	if (report) {
		json_decref(fs->scrub_report);
		fs->scrub_report = report;
	}
	fs->scrub_running = false;
	pthread_mutex_unlock(&fs->scrub_lock);
}

int fs_scrub(struct fs *fs, fuse_req_t req)
{
	struct scrub sc = {.fs = fs};
	struct fs_path *paths = NULL;
	size_t npaths = 0;
	struct timespec t0;
	time_t started = time(NULL);
	json_t *report;
	int ret;

	pthread_mutex_lock(&fs->scrub_lock);
	ret = fs->scrub_running ? -EBUSY : 0;
	fs->scrub_running = true;
	pthread_mutex_unlock(&fs->scrub_lock);
	if (ret)
		return ret;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	log_info("scrub: started");
	ret = scrub_blocks(&sc, req);
	if (!ret)
		ret = scrub_name(&sc, &paths, &npaths);
	report = scrub_json(&sc,
			    ret		     ? "failed"
			    : sc.interrupted ? "interrupted"
					     : "done",
			    started, since(&t0), paths, npaths);
	if (ret)
		log_err("scrub: stopped after %llu blocks: %s", (unsigned long long)sc.blocks,
			strerror(-ret));
	else
		log_info(
		    "scrub: %s: %llu blocks checked in %.1f s, %llu without a hash, %zu damaged",
		    sc.interrupted ? "interrupted" : "done", (unsigned long long)sc.blocks,
		    since(&t0), (unsigned long long)sc.unhashed, sc.nbad);
	for (size_t i = 0; i < npaths; i++)
		free(paths[i].path);
	free(paths);
	free(sc.bad);
	free(sc.use);
	scrub_done(fs, report);
	if (!ret && !report)
		ret = -ENOMEM;
	return ret ? ret : sc.interrupted ? -EINTR : 0;
}

json_t *fs_scrub_json(struct fs *fs)
{
	json_t *j;

	pthread_mutex_lock(&fs->scrub_lock);
	if (fs->scrub_report)
		j = json_deep_copy(fs->scrub_report);
	else
		j = json_pack("{ss}", "state", fs->scrub_running ? "running" : "never");
	if (j && fs->scrub_running)
		json_object_set_new(j, "running", json_true());
	pthread_mutex_unlock(&fs->scrub_lock);
	return j;
}
