/*
 * store.c - a store's life: opening it over its arena and devices (sizes,
 * marks and bounds), checking and binding the devices, starting its
 * threads (flusher, verifiers, give-back), closing it, and its statistics.
 *
 * The top of the block cache next to cache.c: it may call every other file
 * of it, and none calls it.
 */
#include "cache_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFETCH_SHARE 8 /* prefetches in flight hold at most 1/8 of the slots */
#define PREFETCH_DEPTH_SHARE 64 /* blocks ahead of their readers: 1/64 of the slots */
#define PREFETCH_DEPTH_MIN 4
#define PREFETCH_DEEP_SHARE 4 /* readers of remote blocks: at most 1/4 of the slots ahead */
#define PF_FLOOR_SHARE 16 /* the readers' floor of the window: 1/16 of the slots at most */
#define PF_GROW_SHARE 2	      /* the window grows to half the slots at most */
#define CLEAN_LOW_SHARE 64 /* the flusher keeps 1/64 to 1/32 of the slots clean */
#define CLEAN_LOW_MIN 2
#define WB_RUNS 4 /* objects of a packing device (s3) the write-back keeps in flight */

/* ---- statistics ---- */

void tb_get_stats(struct tb_store *s, struct tb_stats *st)
{
	uint64_t avail;

	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&s->lock);
	st->n = s->n;
	st->block_size = s->bs;
	st->dram_capacity = (uint64_t)s->nslots * s->bs;
	st->dram_used = (uint64_t)(s->nslots - s->free_list.n) * s->bs;
	st->dirty_bytes = s->ndirty * s->bs;
	st->dirty_limit_bytes = s->dirty_max * s->bs;
	st->dirty_background_bytes = (s->dirty_max - s->dirty_bg) * s->bs;
	st->kept_bytes = marks_cycle_period(s) && s->keep_den ? s->keep_num * s->bs : 0;
	st->kept_evicted_bytes = s->kept_evicted * s->bs;
	st->recent_wb_errors = err_recent_count(&s->wb_recent, now_ms() * 1000000);
	st->health_window_s = HEALTH_WINDOW_S;
	st->stall_err = s->stall_err;
	st->stall_ms = s->stall_err ? now_ms() - s->stall_ms : 0;
	st->stall_commit = s->stall_commit;
	st->prefetch_depth = s->pf_win.depth;
	st->unsynced_blocks = s->commits_since_sync + s->npending;
	st->unsynced_commits = __atomic_load_n(&s->meta_commits, __ATOMIC_RELAXED);
	st->expired_bytes = s->expired * s->bs;
	st->rewritten_bytes = s->wb_rewritten * s->bs;
	st->checksum_verified = __atomic_load_n(&s->sum_verified, __ATOMIC_RELAXED);
	st->checksum_unverified = __atomic_load_n(&s->sum_unverified, __ATOMIC_RELAXED);
	st->checksum_errors = __atomic_load_n(&s->sum_errors, __ATOMIC_RELAXED);
	st->pinned_bytes = s->n_pinned_res * s->bs;
	st->pin_limit_bytes = s->pin_limit * s->bs;
	st->hot_bytes = (uint64_t)s->n_hot * s->bs;
	st->huge_pages = s->arena.huge;
	st->thp_bytes = s->arena.thp_bytes;
	st->locked = s->arena.locked;
	avail = place_avail(s);
	pthread_mutex_unlock(&s->lock);
	st->n_devs = s->n_devs;
	for (unsigned i = 0; i < s->n_devs; i++) {
		dev_get_stats(s->dev[i], &st->dev[i]);
		/* What room they have is promised to dirty blocks: no new block fits. */
		if (!avail) {
			st->dev[i].avail = 0;
			st->dev[i].full = true;
		}
		st->dev[i].checksum_errors =
		    __atomic_load_n(&s->sum_dev_errors[i], __ATOMIC_RELAXED);
	}
}

/* ---- life cycle ---- */

static uint64_t pow2_at_least(uint64_t n)
{
	uint64_t p = 1;

	while (p < n)
		p <<= 1;
	return p;
}

/*
 * The reserve of free or clean slots that the flusher keeps ahead of
 * evictions. Dirty data may fill the rest (write-back is lazy), less the
 * readers' worst case; dirty= lowers that mark. A device that packs
 * several blocks per object (s3) is fed by the flusher's batches, so the
 * reserve holds at least two of its objects: with dram=256M the reserve was
 * 4 to 8 blocks, objects went out with 5 of their 8 blocks on average, and
 * a 512 MiB dd made 190 requests per GB at half the speed (129 now).
 */
static void set_reserve(struct tb_store *s, const struct tb_config *cfg)
{
	uint64_t low = s->nslots / CLEAN_LOW_SHARE;

	if (low < CLEAN_LOW_MIN)
		low = CLEAN_LOW_MIN;
	for (unsigned i = 0; i < s->n_devs; i++)
		if (s->dev[i]->run > 1 && low < 2 * (uint64_t)s->dev[i]->run)
			low = 2 * (uint64_t)s->dev[i]->run;
	if (low > s->nslots / 4 && s->nslots / 4 >= CLEAN_LOW_MIN)
		low = s->nslots / 4;
	s->clean_low = low;
	s->clean_high = 2 * low;
	s->dirty_max = s->nslots > s->clean_high ? s->nslots - s->clean_high : 1;
	if (cfg->dirty_bytes && cfg->dirty_bytes / s->bs < s->dirty_max)
		s->dirty_max = cfg->dirty_bytes / s->bs;
	if (s->dirty_max < 1)
		s->dirty_max = 1;
	/* queue_depth per device, at most half the dirty mark, and never below 0 */
	s->dirty_bg = s->wb_max > s->clean_low ? s->wb_max : s->clean_low;
	if (s->dirty_bg > s->dirty_max / 2)
		s->dirty_bg = s->dirty_max / 2 > s->clean_low ? s->dirty_max / 2 : s->clean_low;
	if (s->dirty_bg > s->dirty_max)
		s->dirty_bg = s->dirty_max;
}

/*
 * Write-back blocks in flight at most: queue_depth per device, and for a
 * device that packs blocks into objects (s3) WB_RUNS of its objects, within
 * a quarter of the slots. Its engine holds an object's blocks until it has
 * them all: with 32 blocks in flight and 32-block objects, one PUT ran at a
 * time, and each waited for the region's first byte alone.
 */
static uint64_t wb_depth(const struct tb_store *s, const struct tb_config *cfg)
{
	uint64_t base = (uint64_t)s->n_devs * cfg->queue_depth, deep = 0;

	for (unsigned i = 0; i < s->n_devs; i++) {
		uint64_t runs = (uint64_t)WB_RUNS * s->dev[i]->run;

		deep += runs > cfg->queue_depth ? runs : cfg->queue_depth;
	}
	if (deep > s->nslots / 4)
		deep = s->nslots / 4;
	return deep > base ? deep : base;
}

int tb_open(const struct tb_config *cfg, const struct tb_owner *owner, struct tb_store **out,
	    char *err, size_t errlen)
{
	struct tb_store *s = calloc(1, sizeof(*s));
	uint64_t nslots, min_slots;
	int ret;

	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->owner = *owner;
	s->bs = cfg->block_size;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->sync_lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->state_cv, &ca);
	pthread_cond_init(&s->space_cv, &ca);
	pthread_cond_init(&s->flush_cv, &ca);
	pthread_cond_init(&s->give_back_cv, &ca);
	pthread_condattr_destroy(&ca);

	nslots = cfg->dram_bytes / s->bs;
	min_slots = (uint64_t)cfg->max_pinned + 16;
	if (nslots < min_slots) {
		snprintf(err, errlen,
			 "dram=%zuM is too small: with block=%zuK and these threads it needs at "
			 "least %lluM",
			 cfg->dram_bytes >> 20, s->bs >> 10,
			 (unsigned long long)((min_slots * s->bs + (1 << 20) - 1) >> 20));
		ret = -EINVAL;
		goto fail;
	}
	if (nslots > UINT32_MAX - cfg->spare_slots)
		nslots = UINT32_MAX - cfg->spare_slots;
	s->nslots = (uint32_t)nslots;
	/* The spare slots follow the cache's, outside dram_bytes. */
	ret = dram_arena_init(&s->arena, s->bs, s->nslots + cfg->spare_slots, cfg->share_arena);
	if (ret < 0) {
		snprintf(err, errlen, "cannot map a DRAM arena of %zuM: %s", cfg->dram_bytes >> 20,
			 strerror(-ret));
		goto fail;
	}
	s->zero = calloc(1, s->bs);
	s->spares = calloc(cfg->spare_slots + 1, sizeof(*s->spares));
	for (uint32_t i = 0; s->spares && i < cfg->spare_slots; i++)
		s->spares[s->nspares++] = s->nslots + cfg->spare_slots - 1 - i;
	s->entries = calloc(s->nslots, sizeof(*s->entries));
	s->hash_mask = pow2_at_least(2ULL * s->nslots) - 1;
	s->hash = calloc(s->hash_mask + 1, sizeof(*s->hash));
	s->lochash = calloc(s->hash_mask + 1, sizeof(*s->lochash));
	s->ohash_mask = pow2_at_least(s->nslots) - 1;
	s->ohash = calloc(s->ohash_mask + 1, sizeof(*s->ohash));
	s->nghost = s->nslots * 2 > 16 ? s->nslots * 2 : 16;
	s->ghost_mask = (uint32_t)pow2_at_least(s->nghost) - 1;
	s->ghost = calloc(s->nghost, sizeof(*s->ghost));
	s->ghost_next = calloc(s->nghost, sizeof(*s->ghost_next));
	s->ghost_head = calloc((size_t)s->ghost_mask + 1, sizeof(*s->ghost_head));
	s->scratch = calloc(s->nslots, sizeof(*s->scratch));
	/*
	 * Pins may hold what readers' pins do not need, less a quarter of
	 * the slots that writers always have to cycle through: dirty blocks
	 * become evictable once written back, pinned ones never do.
	 */
	s->pin_limit = s->nslots > cfg->max_pinned + 16 + s->nslots / 4
			       ? s->nslots - cfg->max_pinned - 16 - s->nslots / 4
			       : 0;
	if (!s->zero || !s->spares || !s->entries || !s->hash || !s->lochash || !s->ohash || !s->ghost || !s->ghost_next ||
	    !s->ghost_head || !s->scratch) {
		snprintf(err, errlen, "out of memory for %u cache entries", s->nslots);
		ret = -ENOMEM;
		goto fail;
	}
	s->nsectors = (uint32_t)(s->bs / SECTOR);
	s->sector_words = (s->nsectors + 63) / 64;
	s->sector_bits = calloc((size_t)s->nslots * s->sector_words, sizeof(uint64_t));
	if (!s->sector_bits) {
		snprintf(err, errlen, "out of memory for %u cache entries", s->nslots);
		ret = -ENOMEM;
		goto fail;
	}
	TAILQ_INIT(&s->free_list.q);
	TAILQ_INIT(&s->dirty_list.q);
	for (uint32_t i = 0; i < s->nslots; i++) {
		struct tb_entry *e = &s->entries[i];

		e->written = s->sector_bits + (size_t)i * s->sector_words;
		e->slot = i;
		e->s = s;
		e->loc = TB_LOC_NONE;
		elist_append(&s->free_list, e);
	}

	if (cfg->n_devs == 0 || cfg->n_devs > TB_MAX_DEVS) {
		snprintf(err, errlen, "between 1 and %d persistent devices are needed", TB_MAX_DEVS);
		ret = -EINVAL;
		goto fail;
	}
	for (unsigned i = 0; i < cfg->n_devs; i++) {
		const struct tb_dev_spec *sp = &cfg->devs[i];

		if (sp->kind == TB_KIND_S3)
			ret = dev_open_s3(&s->dev[i], i, cfg->s3, cfg->store_id, s->bs,
					  cfg->queue_depth, sp->bw, sp->cap, &s->arena, err, errlen);
		else
			ret = dev_open_slab(&s->dev[i], sp->kind == TB_KIND_PFS ? "pfs" : "nvme", i,
					    sp->path, cfg->store_id, s->bs, cfg->engine,
					    cfg->queue_depth, sp->bw, sp->cap, &s->arena, err, errlen);
		if (ret < 0)
			goto fail;
		dev_set_readahead(s->dev[i], cfg->remote_readahead);
		for (unsigned j = 0; j < i; j++)
			if (strcmp(s->dev[j]->name, s->dev[i]->name) == 0) /* a second pfs */
				snprintf(s->dev[i]->name, sizeof(s->dev[i]->name), "%s%u",
					 s->dev[i]->kind, i);
		s->n_devs++;
	}
	s->wb_max = wb_depth(s, cfg);
	for (unsigned i = 0; i < s->n_devs; i++)
		if (s->dev[i]->run > s->wb_batch && s->dev[i]->run <= s->wb_max)
			s->wb_batch = s->dev[i]->run;
	set_reserve(s, cfg);
	/*
	 * Blocks loaded ahead of their reader take slots from what the cycle
	 * keeps resident: enough to hide the devices' latency, no more.
	 */
	s->pf_win.depth = s->nslots / PREFETCH_DEPTH_SHARE > PREFETCH_DEPTH_MIN
				  ? s->nslots / PREFETCH_DEPTH_SHARE
				  : PREFETCH_DEPTH_MIN;
	s->pf_win.min = s->pf_win.depth;
	s->pf_win.max = s->nslots / PF_GROW_SHARE > s->pf_win.depth ? s->nslots / PF_GROW_SHARE
								     : s->pf_win.depth;
	s->pf_deep_max = s->nslots / PREFETCH_DEEP_SHARE;
	s->prefetch_max = s->nslots / PREFETCH_SHARE;
	if (s->prefetch_max > (uint64_t)s->n_devs * cfg->queue_depth)
		s->prefetch_max = (uint64_t)s->n_devs * cfg->queue_depth;
	/*
	 * The readers' floor (tb_pf_window_readers): no more than may be in
	 * flight, nor than PF_FLOOR_SHARE of the slots, which the cycle no
	 * longer keeps: at 1/8, a swap at twice a 256 MiB tier moved 0.58 of
	 * the raw folder's bytes, two ranks 0.65 (0.51 and 0.50 without it);
	 * at 1/16, 0.55-0.58.
	 */
	s->pf_win.floor_max =
	    s->prefetch_max < s->nslots / PF_FLOOR_SHARE ? s->prefetch_max : s->nslots / PF_FLOOR_SHARE;
	*out = s;
	return 0;
fail:
	tb_forget_identity(s);
	tb_close(s);
	return ret;
}

void tb_forget_identity(struct tb_store *s)
{
	for (unsigned i = 0; i < s->n_devs; i++)
		dev_forget_identity(s->dev[i]);
}

unsigned tb_n_devs(const struct tb_store *s)
{
	return s->n_devs;
}

/* Device i against the store's blocks on it and its recorded binding (see tb.h). */
static int check_device(struct tb_dev *d, uint64_t blocks, const char *recorded, char *err,
			size_t errlen)
{
	char what[600];

	dev_describe(d, what, sizeof(what));
	if (d->id_missing && blocks && strcmp(d->kind, "s3") == 0) {
		snprintf(err, errlen,
			 "%s has no tensorfs.dev, but this store holds %llu blocks on it (device "
			 "%u): give the remote= bucket and prefix, and the endpoint=, that hold "
			 "them",
			 what, (unsigned long long)blocks, d->index);
		return -ENODEV;
	}
	if (d->id_missing && blocks) {
		snprintf(err, errlen,
			 "%s has no tensorfs.dev, but this store holds %llu blocks on it (device "
			 "%u): is its drive mounted? Mount it there, or give the folder that holds "
			 "them in this place of the list; an empty folder is taken as a new device "
			 "only where the store holds no blocks",
			 what, (unsigned long long)blocks, d->index);
		return -ENODEV;
	}
	if (!d->id_missing && recorded[0] && strcmp(d->bind, recorded) != 0) {
		snprintf(err, errlen,
			 "%s holds an earlier binding of device %u of this store (%s), not the one "
			 "its blocks there were written to since (%s): is the right drive mounted "
			 "there? %s",
			 what, d->index, d->bind[0] ? d->bind : "from before bindings", recorded,
			 blocks ? "Mount it, or give the folder that holds them"
				: "The store holds no blocks there: remove its tensorfs.dev and "
				  "tensorfs.slab to take it afresh");
		return -EINVAL;
	}
	if (d->slab_made && blocks) {
		snprintf(err, errlen,
			 "%s holds this store's tensorfs.dev but no tensorfs.slab, and the store "
			 "holds %llu blocks in it (device %u): put back its tensorfs.slab",
			 what, (unsigned long long)blocks, d->index);
		return -ENODEV;
	}
	return 0;
}

int tb_check_devices(struct tb_store *s, const uint64_t *blocks, char (*bind)[TB_BIND_LEN],
		     unsigned n_bind, bool *changed, char *err, size_t errlen)
{
	*changed = n_bind < s->n_devs;
	for (unsigned i = 0; i < s->n_devs; i++) {
		struct tb_dev *d = s->dev[i];
		const char *recorded = i < n_bind ? bind[i] : "";
		int ret = check_device(d, blocks[i], recorded, err, errlen);

		if (ret)
			return ret;
		if (d->id_missing) {
			dev_new_bind(bind[i]);
			*changed = true;
		} else if (strcmp(bind[i], d->bind) != 0) {
			/* Recorded "" (none known): what the identity says. */
			snprintf(bind[i], TB_BIND_LEN, "%s", d->bind);
			*changed = true;
		}
	}
	return 0;
}

int tb_bind_devices(struct tb_store *s, char (*bind)[TB_BIND_LEN], const char *store_id, char *err,
		    size_t errlen)
{
	for (unsigned i = 0; i < s->n_devs; i++) {
		int ret = dev_bind(s->dev[i], store_id, bind[i], err, errlen);

		if (ret)
			return ret;
	}
	return 0;
}

int tb_mark_used(struct tb_store *s, uint64_t loc)
{
	if (tb_loc_dev(loc) >= s->n_devs)
		return -ENODEV;
	return dev_mark(s->dev[tb_loc_dev(loc)], tb_loc_slot(loc));
}

int tb_start(struct tb_store *s)
{
	int ret;

	ret = verify_start(s);
	if (ret < 0)
		return ret;
	for (unsigned i = 0; i < s->n_devs; i++) {
		ret = dev_start(s->dev[i]);
		if (ret < 0)
			return ret;
	}
	ret = pthread_create(&s->flusher, NULL, flush_main, s);
	if (ret)
		return -ret;
	s->started = true;
	if (s->cfg.punch_after_ms) {
		pthread_mutex_lock(&s->lock);
		giveback_arm(s); /* the slab may hold free space since the last mount */
		pthread_mutex_unlock(&s->lock);
		ret = pthread_create(&s->giveback, NULL, giveback_main, s);
		if (ret)
			return -ret;
		s->giveback_started = true;
	}
	return 0;
}

int tb_close(struct tb_store *s)
{
	int ret = 0;

	if (!s)
		return 0;
	if (s->started) {
		ret = tb_sync(s);
		pthread_mutex_lock(&s->lock);
		s->stopping = true;
		s->stop_ms = now_ms();
		for (struct tb_entry *e = TAILQ_FIRST(&s->dirty_list.q); e; e = TAILQ_NEXT(e, link))
			if (e->retries && e->dirty_ms > s->stop_ms + STOP_RETRY_GAP_MS)
				e->dirty_ms = s->stop_ms + STOP_RETRY_GAP_MS;
		s->flush_kicks++;
		__atomic_store_n(&s->give_back_stop, true, __ATOMIC_RELAXED);
		pthread_cond_broadcast(&s->flush_cv);
		pthread_cond_broadcast(&s->space_cv);
		pthread_cond_broadcast(&s->give_back_cv);
		pthread_mutex_unlock(&s->lock);
		if (s->giveback_started)
			pthread_join(s->giveback, NULL);
		pthread_join(s->flusher, NULL);
		int r = flush_do_sync(s);
		/*
		 * What counts is what is durable now: a block whose write-backs
		 * failed in the flush may have gone at the stop's last try.
		 */
		if (s->ndirty) {
			log_err("%llu dirty blocks were not written back",
				(unsigned long long)s->ndirty);
			ret = ret ? ret : -EIO;
		} else {
			ret = r;
		}
	}
	for (unsigned i = 0; i < s->n_devs; i++)
		dev_close(s->dev[i]);
	verify_stop(s); /* after the devices: no load completes any more */
	dram_arena_fini(&s->arena);
	if (s->ohash)
		for (uint64_t i = 0; i <= s->ohash_mask; i++)
			while (s->ohash[i]) {
				struct tb_obj *o = s->ohash[i];

				s->ohash[i] = o->hnext;
				free(o);
			}
	free(s->ohash);
	free(s->ghost);
	free(s->ghost_next);
	free(s->ghost_head);
	free(s->rank);
	free(s->scratch);
	free(s->hash);
	free(s->lochash);
	free(s->entries);
	free(s->sector_bits);
	free(s->zero);
	free(s->spares);
	free(s->pending);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->sync_lock);
	pthread_cond_destroy(&s->state_cv);
	pthread_cond_destroy(&s->space_cv);
	pthread_cond_destroy(&s->flush_cv);
	pthread_cond_destroy(&s->give_back_cv);
	free(s);
	return ret;
}

/* ---- the arena, shared with local clients (fs/gpu.c) ---- */

void tb_arena(const struct tb_store *s, struct tb_arena_info *a)
{
	a->base = s->arena.base;
	a->bytes = s->arena.bytes;
	a->fd = s->arena.sealed ? s->arena.fd : -1;
	a->huge = s->arena.huge;
	a->locked = s->arena.locked;
}

void tb_client_pins(const struct tb_store *s, uint64_t *pins, uint64_t *write_pins)
{
	uint64_t reserved = (uint64_t)s->cfg.max_pinned + 16;
	uint64_t spare = s->nslots > reserved ? s->nslots - reserved : 0;

	/* Half of what readers leave, so that loads and prefetch still find slots. */
	*pins = spare / 2 ? spare / 2 : 1;
	/* Below the dirty mark: a client's own write pins must never hold it up. */
	*write_pins = s->dirty_max / 2 ? s->dirty_max / 2 : 1;
	if (*write_pins > *pins)
		*write_pins = *pins;
}
