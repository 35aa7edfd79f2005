/*
 * ghost.c - 2q's sets: whether an entry is in A1in or in the re-referenced
 * set Am, and the ghost list A1out, the keys of blocks evicted from A1in.
 *
 * Shared state at the bottom of the cache: an entry joins a set when it
 * enters the cache (entry.c, cache_entry_insert) and leaves it when freed
 * or taken (cache_entry_free, cache_entry_take); the policy (evict.c,
 * victim_2q) reads e->hot and s->n_hot. It calls nothing but the inline
 * helpers of cache_int.h.
 */
#include "cache_int.h"

/* ---- 2q's ghost list A1out: keys of blocks evicted from A1in ---- */

static uint64_t ghost_key(uint64_t obj, uint64_t idx)
{
	return mix(obj, idx) | 1; /* never 0, which marks a free ring position */
}

static void ghost_unlink(struct tb_store *s, uint32_t pos)
{
	uint32_t *p = &s->ghost_head[s->ghost[pos] & s->ghost_mask];

	while (*p != pos + 1)
		p = &s->ghost_next[*p - 1];
	*p = s->ghost_next[pos];
	s->ghost[pos] = 0;
}

/* Remember key, forgetting the oldest one when the ring is full. */
static void ghost_add(struct tb_store *s, uint64_t key)
{
	uint32_t pos = s->ghost_pos;
	uint32_t *head = &s->ghost_head[key & s->ghost_mask];

	if (!s->nghost)
		return;
	s->ghost_pos = (pos + 1) % s->nghost;
	if (s->ghost[pos])
		ghost_unlink(s, pos);
	s->ghost[pos] = key;
	s->ghost_next[pos] = *head;
	*head = pos + 1;
}

/* Whether key is remembered; it is forgotten if so. */
static bool ghost_take(struct tb_store *s, uint64_t key)
{
	if (!s->nghost)
		return false;
	for (uint32_t i = s->ghost_head[key & s->ghost_mask]; i; i = s->ghost_next[i - 1])
		if (s->ghost[i - 1] == key) {
			ghost_unlink(s, i - 1);
			return true;
		}
	return false;
}

/* ---- the sets ---- */

/*
 * A block enters the cache. Under 2q it goes to the re-referenced set Am
 * when it was evicted from A1in recently (a second, uncorrelated use),
 * else to A1in, which a one-time scan passes through without touching Am.
 */
void ghost_admit(struct tb_store *s, struct tb_entry *e)
{
	e->admit = ++s->ticks;
	e->hot = ghost_take(s, ghost_key(e->obj, e->idx));
	if (e->hot) {
		s->n_hot++;
		s->n.ghost_hits++;
	}
}

/* A block leaves the cache; evicted says whether 2q should remember it. */
void ghost_leave(struct tb_store *s, struct tb_entry *e, bool evicted)
{
	if (e->hot) {
		e->hot = false;
		s->n_hot--;
	} else if (evicted) {
		ghost_add(s, ghost_key(e->obj, e->idx));
	}
}
