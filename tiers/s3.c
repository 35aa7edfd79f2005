/*
 * s3.c - the s3 device: blocks packed into objects in an S3 bucket, moved
 * by libcurl. This file is the device dev.c opens: the checks at open, the
 * identity of the key folder, slot management by object, the listing at
 * start, and the engine table; the engine thread is s3io.c's, one request
 * s3http.c's.
 *
 * The bookkeeping of packed objects is s3obj.c's: slot n lives in object
 * n / pack at index n % pack, under the key
 * <prefix>/<store id>/pk/<object>-<generation>-<layout>. The store id keeps
 * the stores of many nodes apart in one bucket, and
 * <prefix>/<store id>/tensorfs.dev binds the keys to the store, the device
 * position and the pack (blocks per object, fixed when the tier is made). A
 * tier made before packing has no pack in tensorfs.dev and keeps its layout:
 * one object per slot, blk/<slot>, overwritten when the slot is reused. At
 * start the bucket is listed, to keep what the metadata uses and delete the
 * rest.
 */
#include "s3_int.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S3_DEFAULT_CAPACITY (16ULL << 40) /* slots for 16 TiB without remote_cap= */
#define S3_CHECK_OBJ "tensorfs.write-check"
#define S3_ID_MAX 200 /* the one line of tensorfs.dev */
/*
 * Taken from the device's queue at most 32 objects' worth: the engine holds
 * writes until their object is whole and reads until a handle is free, and
 * schedules them itself (reads first, PUTs a quarter of the handles). A
 * depth of a few objects let held writes fill it, and reads then came one
 * block at a time as slots freed: one GET per block.
 */
#define S3_QD_PACKS 32
#define S3_CONNECTIONS_MAX 64
#define S3_LIST_KEYS "1000"
#define S3_LIST_BODY_MAX (4L << 20) /* one page of a listing: 1000 keys and their details */
#define S3_TOKEN_MAX 1024

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void curl_init_once(void)
{
	curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- checks at open ---- */

/* The mount-time error for an answer that was not what we asked for. */
static int s3_open_error(struct s3_priv *p, struct s3_xfer *x, const char *what, char *err,
			 size_t errlen)
{
	char code[64], why[CURL_ERROR_SIZE + 64];
	const char *hint = "";

	if (x->code != CURLE_OK) {
		s3_describe(x, why, sizeof(why));
		snprintf(err, errlen, "s3 endpoint %s is unreachable (%s)", p->endpoint, why);
		return -EHOSTUNREACH;
	}
	s3_error_code(x, code, sizeof(code));
	if (x->status == 403 &&
	    (!strcmp(code, "InvalidAccessKeyId") || !strcmp(code, "SignatureDoesNotMatch"))) {
		snprintf(err, errlen,
			 "s3 bucket %s at %s: wrong credentials (%s): check the access key id and "
			 "the secret access key",
			 p->bucket, p->endpoint, code);
		return -EACCES;
	}
	if (x->status == 404 && !strcmp(code, "NoSuchBucket")) {
		snprintf(err, errlen, "s3 bucket %s does not exist at %s (NoSuchBucket)", p->bucket,
			 p->endpoint);
		return -ENOENT;
	}
	if (x->status == 403) {
		snprintf(err, errlen, "s3 bucket %s at %s: access denied to %s (%s)", p->bucket,
			 p->endpoint, what, code[0] ? code : "HTTP 403");
		return -EACCES;
	}
	s3_describe(x, why, sizeof(why));
	if (!code[0])
		hint = " (no S3 error code: is endpoint= an S3 server?)";
	else if (x->status == 301 || !strcmp(code, "AuthorizationHeaderMalformed"))
		hint = " (is region= the bucket's region?)";
	snprintf(err, errlen, "s3 bucket %s at %s: %s failed: %s%s", p->bucket, p->endpoint, what,
		 why, hint);
	return -EIO;
}

/*
 * Check that the key folder is bound to this store and this device
 * position: block locations name devices by position. One without an
 * identity is opened without one (d->id_missing: tb_check_devices
 * decides, and s3_bind writes it). A new tier records its pack (blocks
 * per object), an old one keeps its own.
 */
static int s3_check_identity(struct s3_priv *p, const char *store_id, unsigned pack, char *err,
			     size_t errlen)
{
	struct s3_xfer *x = &p->probe;
	char body[S3_ID_MAX], id[64] = "", kind[16] = "", code[64];
	unsigned idx = 0, have_pack = 0;
	int ret, e, got;

	ret = s3_xfer_set(x, S3_GET, S3_ID_OBJ, NULL, body, sizeof(body) - 1);
	if (ret)
		return ret;
	x->exact = false; /* one line, shorter than the range asked for */
	if (s3_perform(x, &e) == S3_DONE) {
		body[x->pos] = 0;
		got = sscanf(body, "tensorfs-dev store=%63s index=%u kind=%15s pack=%u", id, &idx,
			     kind, &have_pack);
		if (got < 3 || (got == 4 && (have_pack < 1 || have_pack > S3OBJ_PACK_MAX)) ||
		    !dev_parse_bind(body, p->d->bind)) {
			snprintf(err, errlen, "s3 bucket %s: %s%s is malformed", p->bucket,
				 p->keydir, S3_ID_OBJ);
			return -EINVAL;
		}
		if (strcmp(id, store_id) != 0 || strcmp(kind, "s3") != 0) {
			snprintf(err, errlen,
				 "s3 bucket %s: %s belongs to another tensorfs store (%s, %s)",
				 p->bucket, p->keydir, id, kind);
			return -EINVAL;
		}
		if (idx != p->d->index) {
			snprintf(err, errlen,
				 "s3 bucket %s: %s was device %u of this store but is now %u; keep "
				 "the nvme= folders in their original order",
				 p->bucket, p->keydir, idx, p->d->index);
			return -EINVAL;
		}
		p->pack = got == 4 ? have_pack : 0;
		if (!p->pack)
			log_info(
			    "%s: one object per block (a tier made before objects were packed; "
			    "s3_object= applies to new tiers)",
			    p->d->name);
		return 0;
	}
	s3_error_code(x, code, sizeof(code));
	if (x->code != CURLE_OK || x->status != 404 || strcmp(code, "NoSuchKey") != 0)
		return s3_open_error(p, x, "reading " S3_ID_OBJ, err, errlen);
	p->pack = pack;
	p->d->id_missing = true;
	return 0;
}

/* A PUT or DELETE of the checks at open; what names it in the error. */
static int s3_open_request(struct s3_priv *p, enum s3_method m, const char *key, const void *body,
			   size_t len, const char *what, char *err, size_t errlen)
{
	struct s3_xfer *x = &p->probe;
	int ret, e;

	ret = s3_xfer_set(x, m, key, body, NULL, len);
	if (ret)
		return ret;
	if (s3_perform(x, &e) != S3_DONE)
		return s3_open_error(p, x, what, err, errlen);
	return 0;
}

/* The identity of a key folder that had none: its pack and binding. */
static int s3_bind(struct tb_dev *d, const char *store_id, char *err, size_t errlen)
{
	struct s3_priv *p = d->priv;
	char body[S3_ID_MAX];
	int ret;

	snprintf(body, sizeof(body), "tensorfs-dev store=%s index=%u kind=s3 pack=%u bind=%s\n",
		 store_id, d->index, p->pack, d->bind);
	ret = s3_open_request(p, S3_PUT, S3_ID_OBJ, body, strlen(body), "writing " S3_ID_OBJ, err,
			      errlen);
	if (ret)
		return ret;
	log_info("%s: new store key folder %s in s3 bucket %s", d->name, p->keydir, p->bucket);
	return 0;
}

/* Credentials that may read but not write or delete are caught at mount. */
static int s3_check_write(struct s3_priv *p, char *err, size_t errlen)
{
	static const char probe[] = "tensorfs write check\n";
	int ret;

	ret = s3_open_request(p, S3_PUT, S3_CHECK_OBJ, probe, sizeof(probe) - 1,
			      "writing an object", err, errlen);
	if (ret)
		return ret;
	return s3_open_request(p, S3_DELETE, S3_CHECK_OBJ, NULL, 0, "deleting an object", err,
			       errlen);
}

/* The device's counters after a change of slots (s3_counters); ret passes through. */
static int s3_counted(struct s3_priv *p, int ret)
{
	s3_counters(p);
	return ret;
}

/* Slot management of a packed tier (dev.h); d->lock held. */
static int s3_alloc(struct tb_dev *d, uint64_t *slot)
{
	struct s3_priv *p = d->priv;

	return s3_counted(p, s3obj_alloc(&p->objs, slot));
}

static void s3_free(struct tb_dev *d, uint64_t slot)
{
	struct s3_priv *p = d->priv;

	s3_todo(p, slot / p->pack, s3obj_free(&p->objs, slot));
	s3_counters(p);
}

static int s3_mark(struct tb_dev *d, uint64_t slot)
{
	struct s3_priv *p = d->priv;

	return s3_counted(p, s3obj_mark(&p->objs, slot));
}

/*
 * Blocks from slot to the end of its object's stored version: a sequential
 * reader's window ends there, so that one GET reads the rest of the object.
 * An object not stored yet (being filled) is taken as whole.
 */
static unsigned s3_run_left(struct tb_dev *d, uint64_t slot)
{
	struct s3_priv *p = d->priv;
	int64_t off = s3obj_offset(&p->objs, slot, d->block_size);
	struct s3obj *o = s3obj_get(&p->objs, slot / p->pack);

	if (off < 0 || !o)
		return p->pack - (unsigned)(slot % p->pack);
	return (unsigned)__builtin_popcountll(o->layout) - (unsigned)(off / (int64_t)d->block_size);
}

/* ---- listing at start ---- */

/* The text of the first <tag>...</tag> at or after from, XML entities undone. */
static const char *xml_text(const char *from, const char *tag, char *out, size_t outlen)
{
	static const struct {
		const char *ent;
		char c;
	} ents[] = {
	    {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
	char open[48], close[48];
	const char *a, *b;
	size_t o = 0;

	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	a = strstr(from, open);
	if (!a)
		return NULL;
	a += strlen(open);
	b = strstr(a, close);
	if (!b)
		return NULL;
	while (a < b && o + 1 < outlen) {
		size_t i, n = sizeof(ents) / sizeof(ents[0]);

		for (i = 0; i < n; i++)
			if (!strncmp(a, ents[i].ent, strlen(ents[i].ent)))
				break;
		out[o++] = i < n ? ents[i].c : *a;
		a += i < n ? strlen(ents[i].ent) : 1;
	}
	out[o] = 0;
	return b + strlen(close);
}

/*
 * Add the packed object keys of one listing page to *v, each marked torn
 * when its size is not that of the blocks its layout names.
 */
static int s3_parse_page(const char *body, size_t bs, struct s3obj_version **v, size_t *n,
			 size_t *cap)
{
	char key[S3_KEY_MAX], size[32];
	const char *at = body;

	while ((at = strstr(at, "<Contents>"))) {
		const char *end_of = strstr(at, "</Contents>"), *name;
		unsigned long long objno, bytes = 0;
		unsigned long long layout;
		unsigned gen;
		int end = 0;

		if (!end_of)
			break;
		if (!xml_text(at, "Key", key, sizeof(key)) ||
		    xml_text(at, "Size", size, sizeof(size)) > end_of + strlen("</Contents>"))
			key[0] = 0;
		else
			bytes = strtoull(size, NULL, 10);
		at = end_of;
		name = strrchr(key, '/');
		if (!name || name - key < 2 || strncmp(name - 2, "pk", 2) != 0)
			continue;
		if (sscanf(name + 1, "%llx-%x-%llx%n", &objno, &gen, &layout, &end) != 3 ||
		    name[1 + end] || !layout)
			continue;
		if (*n == *cap) {
			size_t c = *cap ? *cap * 2 : 1024;
			struct s3obj_version *nv = realloc(*v, c * sizeof(*nv));

			if (!nv)
				return -ENOMEM;
			*v = nv;
			*cap = c;
		}
		(*v)[(*n)++] = (struct s3obj_version){
		    objno, gen, (uint64_t)layout, false,
		    bytes != (unsigned long long)__builtin_popcountll(layout) * bs};
	}
	return 0;
}

/* Every packed object of this tier in the bucket (ListObjectsV2, page by page). */
static int s3_list(struct s3_priv *p, struct s3obj_version **v, size_t *n)
{
	struct s3_xfer *x = &p->probe;
	char prefix[3 * S3_KEY_MAX], token[S3_TOKEN_MAX], etoken[3 * S3_TOKEN_MAX];
	char query[S3_URL_MAX], raw[S3_KEY_MAX + sizeof(S3_PK_DIR)];
	char *body = malloc(S3_LIST_BODY_MAX + 1);
	size_t cap = 0;
	int ret = 0, e;

	*v = NULL;
	*n = 0;
	token[0] = 0;
	snprintf(raw, sizeof(raw), "%s" S3_PK_DIR, p->keydir_raw);
	if (!body || s3_uri_encode(prefix, sizeof(prefix), raw, false) < 0) {
		free(body);
		return body ? -ENAMETOOLONG : -ENOMEM;
	}
	do {
		/* Sorted by name, as SigV4 wants and libcurl 7.88 does not do. */
		etoken[0] = 0;
		if (token[0] && s3_uri_encode(etoken, sizeof(etoken), token, false) < 0) {
			ret = -ENAMETOOLONG;
			break;
		}
		if (snprintf(query, sizeof(query),
			     "?%s%s%slist-type=2&max-keys=" S3_LIST_KEYS "&prefix=%s",
			     etoken[0] ? "continuation-token=" : "", etoken, etoken[0] ? "&" : "",
			     prefix) >= (int)sizeof(query)) {
			ret = -ENAMETOOLONG;
			break;
		}
		ret = s3_xfer_set(x, S3_GET, query, NULL, body, S3_LIST_BODY_MAX);
		if (ret)
			break;
		x->exact = false;
		if (s3_perform(x, &e) != S3_DONE) {
			char why[CURL_ERROR_SIZE + 64];

			s3_describe(x, why, sizeof(why));
			log_err("%s: listing the tier's objects failed: %s", p->d->name, why);
			ret = -EIO;
			break;
		}
		body[x->pos] = 0;
		ret = s3_parse_page(body, p->d->block_size, v, n, &cap);
		if (ret)
			break;
		token[0] = 0;
		if (strstr(body, "<IsTruncated>true</IsTruncated>") &&
		    !xml_text(body, "NextContinuationToken", token, sizeof(token))) {
			log_err("%s: a listing page says there is more, but not where", p->d->name);
			ret = -EIO;
		}
	} while (!ret && token[0]);
	s3_xfer_reset(x);
	free(body);
	if (ret) {
		free(*v);
		*v = NULL;
	}
	return ret;
}

/*
 * Before the engine runs, after the metadata marked every slot in use: keep
 * each object's newest version that holds its slots in use, and queue the
 * deletion of everything else (what a crash or a failed write left).
 */
static int s3_sweep(struct s3_priv *p)
{
	struct tb_dev *d = p->d;
	struct s3obj_version *v, *del = NULL;
	size_t n, ndel = 0;
	uint64_t missing = 0;
	int ret = s3_list(p, &v, &n);

	if (ret)
		return ret;
	pthread_mutex_lock(&d->lock);
	ret = s3obj_sweep(&p->objs, v, n, &del, &ndel, &missing);
	for (size_t i = 0; !ret && i < ndel; i++)
		s3_del_queue(p, &del[i]);
	s3_counters(p);
	pthread_mutex_unlock(&d->lock);
	free(v);
	free(del);
	if (ret)
		return ret;
	log_info("%s: %zu objects of this tier in the bucket, %zu of them to delete", d->name, n,
		 ndel);
	if (missing)
		log_err("%s: %llu objects that blocks in use live in are missing or incomplete in "
			"the bucket; reading those blocks fails",
			d->name, (unsigned long long)missing);
	return 0;
}

/* A packed tier, before the engine's thread starts (s3_thread): the sweep, compaction's buffer. */
static int s3_packed_start(struct tb_dev *d)
{
	struct s3_priv *p = d->priv;
	int ret = s3_sweep(p);

	if (ret)
		return ret;
	/* Compaction's buffer, made now: memory does not grow in a long run. */
	p->compact_buf = malloc(p->pack * d->block_size);
	if (!p->compact_buf)
		return -ENOMEM;
	memset(p->compact_buf, 0, p->pack * d->block_size);
	return 0;
}

static void s3_fini(struct tb_dev *d)
{
	struct s3_priv *p = d->priv;

	if (!p)
		return;
	for (unsigned i = 0; p->xfers && i < p->nx; i++)
		s3_xfer_fini(p, &p->xfers[i]);
	s3_xfer_fini(p, &p->probe);
	if (p->multi)
		curl_multi_cleanup(p->multi);
	if (p->token_hdr) {
		explicit_bzero(p->token_hdr, strlen(p->token_hdr));
		free(p->token_hdr);
	}
	while (p->dels) {
		struct s3_del *dl = p->dels;

		p->dels = dl->next;
		free(dl);
	}
	while (p->fills) {
		struct s3_fill *f = p->fills;

		p->fills = f->next;
		free(f);
	}
	s3obj_fini(&p->objs);
	free(p->compact_buf);
	free(p->xfers);
	free(p);
}

static const struct dev_engine s3_engine = {
    .name = "libcurl",
    .thread = s3_thread,
    .fini = s3_fini,
    .bind = s3_bind,
};

/* A tier that packs slots into objects manages its slots by object. */
static const struct dev_engine s3_packed_engine = {
    .name = "libcurl",
    .start = s3_packed_start,
    .thread = s3_thread,
    .fini = s3_fini,
    .alloc = s3_alloc,
    .free = s3_free,
    .mark = s3_mark,
    .bind = s3_bind,
    .run_left = s3_run_left,
};

/* Everything but the network and the pool: names, the multi handle, the probe. */
static int s3_setup(struct tb_dev *d, const struct tb_s3_config *cfg, const char *store_id,
		    char *err, size_t errlen)
{
	struct s3_priv *p = calloc(1, sizeof(*p));
	int ret;

	if (!p)
		return -ENOMEM;
	d->priv = p;
	d->eng = &s3_engine;
	p->d = d;
	p->rng = dev_now_ns() | 1;
	p->timeout_ns = (uint64_t)cfg->timeout_ms * NS_PER_MS;
	p->path_style = cfg->path_style;
	snprintf(p->bucket, sizeof(p->bucket), "%s", cfg->bucket);
	snprintf(p->sigv4, sizeof(p->sigv4), "aws:amz:%s:s3", cfg->region);
	s3_sha256_hex("", 0, p->empty_sha);
	ret = s3_base_url(p, cfg, err, errlen);
	if (ret)
		return ret;
	if (s3_keydir(p, cfg->prefix, store_id) < 0) {
		snprintf(err, errlen, "s3 prefix '%s' is too long", cfg->prefix);
		return -ENAMETOOLONG;
	}
	/* For stats and logs: a very long one is cut short. */
	if (snprintf(d->where, sizeof(d->where), "s3://%s/%s at %s", p->bucket, p->keydir,
		     p->endpoint) >= (int)sizeof(d->where))
		log_debug("%s: location %s... cut short", d->name, d->where);
	if (cfg->session_token && *cfg->session_token &&
	    asprintf(&p->token_hdr, "x-amz-security-token: %s", cfg->session_token) < 0) {
		p->token_hdr = NULL;
		return -ENOMEM;
	}
	p->multi = curl_multi_init();
	if (!p->multi)
		return -ENOMEM;
	ret = s3_xfer_init(p, &p->probe, cfg);
	if (ret)
		snprintf(err, errlen, "s3: this libcurl cannot sign requests (SigV4): %s",
			 strerror(-ret));
	return ret;
}

/*
 * The pool of handles: enough GETs of whole objects for two readers' deepest
 * windows, and never fewer than connections=.
 */
static int s3_pool(struct s3_priv *p, const struct tb_s3_config *cfg)
{
	uint64_t per = (uint64_t)(p->pack ? p->pack : 1) * p->d->block_size;
	uint64_t nx = 2 * cfg->readahead_max / per;
	int ret = 0;

	if (nx < cfg->connections)
		nx = cfg->connections;
	if (nx > S3_CONNECTIONS_MAX)
		nx = S3_CONNECTIONS_MAX;
	p->nx = nx ? (unsigned)nx : 1;
	p->xfers = calloc(p->nx, sizeof(*p->xfers));
	if (!p->xfers)
		return -ENOMEM;
	curl_multi_setopt(p->multi, CURLMOPT_MAXCONNECTS, (long)p->nx + 1);
	for (unsigned i = 0; i < p->nx && !ret; i++) {
		ret = s3_xfer_init(p, &p->xfers[i], cfg);
		p->xfers[i].next = p->idle;
		p->idle = &p->xfers[i];
	}
	return ret;
}

int dev_open_s3(struct tb_dev **out, unsigned index, const struct tb_s3_config *cfg,
		const char *store_id, size_t block_size, unsigned queue_depth, uint64_t bw_cap,
		uint64_t cap_bytes, const struct dram_arena *arena, char *err, size_t errlen)
{
	struct tb_dev *d;
	struct s3_priv *p;
	uint64_t nslots, pack;
	int ret;

	if (!cfg || !cfg->bucket || !*cfg->bucket || !cfg->region || !*cfg->region) {
		snprintf(err, errlen, "s3 tier: a bucket and a region are needed");
		return -EINVAL;
	}
	if (!cfg->access_key || !cfg->secret_key) {
		snprintf(err, errlen, "s3 bucket %s: no credentials given", cfg->bucket);
		return -EINVAL;
	}
	pthread_once(&curl_once, curl_init_once);
	if (curl_init_result != CURLE_OK) {
		snprintf(err, errlen, "s3: libcurl initialisation failed: %s",
			 curl_easy_strerror(curl_init_result));
		return -EIO;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	ret = dev_init_common(d, "s3", index, block_size, queue_depth, bw_cap, arena);
	if (ret) {
		snprintf(err, errlen, "s3: %s", strerror(-ret));
		goto fail;
	}
	ret = s3_setup(d, cfg, store_id, err, errlen);
	if (ret) {
		if (!*err)
			snprintf(err, errlen, "s3 bucket %s: %s", cfg->bucket, strerror(-ret));
		goto fail;
	}
	p = d->priv;
	pack = cfg->object_bytes / block_size;
	if (pack < 1)
		pack = 1;
	if (pack > S3OBJ_PACK_MAX)
		pack = S3OBJ_PACK_MAX;
	ret = s3_check_identity(p, store_id, (unsigned)pack, err, errlen);
	if (ret)
		goto fail;
	ret = s3_check_write(p, err, errlen);
	if (ret)
		goto fail;
	nslots = (cap_bytes ? cap_bytes : S3_DEFAULT_CAPACITY) / block_size;
	if (p->pack)
		nslots -= nslots % p->pack;
	if (nslots == 0) {
		snprintf(err, errlen, "s3 bucket %s: remote_cap is below one %s", cfg->bucket,
			 p->pack > 1 ? "object" : "block");
		ret = -EINVAL;
		goto fail;
	}
	ret = slot_alloc_init(&d->alloc, nslots);
	if (!ret && p->pack)
		ret = s3obj_init(&p->objs, p->pack, nslots, &d->alloc);
	if (ret) {
		snprintf(err, errlen, "s3 bucket %s: no memory for %llu slots", cfg->bucket,
			 (unsigned long long)nslots);
		goto fail;
	}
	if (p->pack) {
		d->eng = &s3_packed_engine;
		d->run = p->pack;
		if (d->qd < S3_QD_PACKS * p->pack)
			d->qd = S3_QD_PACKS * p->pack;
	}
	ret = s3_pool(p, cfg);
	if (ret) {
		snprintf(err, errlen, "s3 bucket %s: cannot make its connections: %s", cfg->bucket,
			 strerror(-ret));
		goto fail;
	}
	log_info("%s: %s, %u blocks per object, %u connections, timeout %u ms", d->name, d->where,
		 p->pack ? p->pack : 1, p->nx, cfg->timeout_ms);
	*out = d;
	return 0;
fail:
	dev_close(d);
	return ret;
}
