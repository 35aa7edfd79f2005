/*
 * s3.c - the s3 device: blocks packed into objects in an S3 bucket, moved
 * by libcurl.
 *
 * The bookkeeping of packed objects is s3obj.c's: slot n lives in object
 * n / pack at index n % pack, under the key
 * <prefix>/<store id>/pk/<object>-<generation>-<layout>. The store id keeps
 * the stores of many nodes apart in one bucket, and
 * <prefix>/<store id>/tensorfs.dev binds the keys to the store, the device
 * position and the pack (blocks per object, fixed when the tier is made). A
 * tier made before packing has no pack in tensorfs.dev and keeps its layout:
 * one object per slot, blk/<slot>, overwritten when the slot is reused.
 *
 * Fewer, larger requests are the point: s3rver spends about 4 ms of CPU per
 * request, whatever its size, so one object per 1 MiB block capped reads
 * near 150 MB/s on two cores. Writes: the allocator hands out an object's
 * slots in a row, the engine holds their write requests until it has them
 * all (or a while passed without another: S3_PACK_WAIT_MAX_NS, less when
 * someone waits for one of them, tb_io.push), and one PUT stores them.
 * Reads: requests for neighbouring blocks of one object, queued together
 * (readers plug, see tb_plug), go as one ranged GET. An object no slot uses
 * is deleted; one half dead is compacted when the device is otherwise idle
 * (s3obj.h); at start the bucket is listed, to keep what the metadata uses
 * and delete the rest.
 *
 * One thread runs a libcurl multi handle over a pool of easy handles
 * (connections are reused), sized to keep a reader's deepest readahead in
 * flight; libcurl signs with SigV4. A 5xx, 429 or 408 answer, a timeout or
 * a connection error is retried with exponential backoff and jitter until
 * timeout_ms after the request was taken, then fails with EIO. While the
 * device is down, writes get one try (the flusher places them elsewhere) and
 * a HEAD every two seconds tells when it is back. A completed PUT is durable.
 */
#include "dev.h"
#include "fault.h"
#include "log.h"
#include "s3obj.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* 7.87 takes the payload hash from our x-amz-content-sha256 header. */
#if LIBCURL_VERSION_NUM < 0x075700
#error "the s3 tier needs libcurl 7.87 or newer"
#endif

#define S3_DEFAULT_CAPACITY (16ULL << 40) /* slots for 16 TiB without remote_cap= */
#define S3_URL_MAX 2048
#define S3_KEY_MAX 1024
#define S3_ERR_BODY_MAX 1024 /* start of an error answer, kept for its <Code> */
#define S3_ID_OBJ "tensorfs.dev"
#define S3_CHECK_OBJ "tensorfs.write-check"
#define S3_BLK_DIR "blk/" /* one object per slot: tiers made before packing */
#define S3_PK_DIR "pk/"	  /* packed objects */
#define S3_ID_MAX 200	  /* the one line of tensorfs.dev */
#define S3_BACKOFF_MIN_MS 50
#define S3_BACKOFF_MAX_MS 2000
#define S3_CONNECT_TIMEOUT_MS 3000 /* per attempt, so a lost SYN is tried again */
#define S3_PROBE_INTERVAL_NS 2000000000ULL
#define S3_POLL_MAX_MS 1000
#define S3_RECV_BUFFER (512L << 10)
#define S3_SEND_BUFFER (256L << 10)
#define S3_LOG_INTERVAL_S 10
#define S3_DOWN_AFTER_NO_SERVER 3 /* attempts in a row that found no server */
#define S3_TAKE_MAX 256		  /* requests taken from the queue at once */
/*
 * A partly filled object waits for its next block four times as long as
 * write-back requests have been coming apart, within these bounds: a
 * steady writer fills whole objects, and an fsync's last one waits little.
 */
#define S3_PACK_WAIT_MIN_NS 2000000ULL
#define S3_PACK_WAIT_MAX_NS 50000000ULL
#define S3_PACK_WAIT_GAPS 4
/*
 * Taken from the device's queue at most 32 objects' worth: the engine holds
 * writes until their object is whole and reads until a handle is free, and
 * schedules them itself (reads first, PUTs a quarter of the handles). A
 * depth of a few objects let held writes fill it, and reads then came one
 * block at a time as slots freed: one GET per block.
 */
#define S3_QD_PACKS 32
#define S3_CONNECTIONS_MAX 64
#define S3_PUT_SHARE 4 /* PUTs keep a quarter of the handles while reads wait */
#define S3_DELETE_RETRY_NS 2000000000ULL
#define S3_LIST_KEYS "1000"
#define S3_LIST_BODY_MAX (4L << 20) /* one page of a listing: 1000 keys and their details */
#define S3_TOKEN_MAX 1024
#define XORSHIFT64_MULT 2685821657736338717ULL
#define SHA256_HEX_LEN (2 * SHA256_DIGEST_LENGTH)
#define NS_PER_MS 1000000ULL
#define NS_PER_SEC 1000000000ULL

enum s3_method { S3_GET, S3_PUT, S3_HEAD, S3_DELETE };

/* What a transfer is for. */
enum s3_job {
	S3_JOB_CHECK,	    /* the probe, and the checks and listing at open and start */
	S3_JOB_READ,	    /* a ranged GET of neighbouring blocks of one object */
	S3_JOB_WRITE,	    /* the PUT of an object's blocks (or of one slot's, unpacked) */
	S3_JOB_DELETE,	    /* a version no slot needs */
	S3_JOB_COMPACT_GET, /* a half-dead object, read whole */
	S3_JOB_COMPACT_PUT, /* and written again with its live blocks */
};

/* What to do after one attempt. */
enum s3_verdict { S3_DONE, S3_RETRY, S3_FAILED };

struct s3_priv;

/* One easy handle and the request it carries. */
struct s3_xfer {
	struct s3_priv *p;
	CURL *easy;
	struct curl_slist *hdrs;
	enum s3_method method;
	enum s3_job job;
	struct tb_io *rs[S3OBJ_PACK_MAX]; /* read and write jobs: their requests, in body order */
	unsigned nr;
	const char *body; /* otherwise: what to send */
	char *dst;	  /* or where the body goes */
	size_t len;	  /* bytes to send, or the length of the body to receive */
	bool exact;	  /* GET: a body of another length than len is an error */
	size_t pos;	  /* sent or received in this attempt */
	bool overflow;	  /* a GET body longer than len */
	long status;	  /* HTTP status of this attempt */
	CURLcode code;	  /* libcurl's result of this attempt */
	unsigned attempts;
	uint64_t deadline_ns; /* no attempt starts, or runs, past this */
	uint64_t retry_ns;    /* in backoff: when to try again */
	struct s3obj_version v; /* packed: the object version it addresses */
	uint64_t slot;		/* a slot it is about, for logs and fault rules */
	struct s3_xfer *next;	/* on the idle list or the backoff list */
	char url[S3_URL_MAX];
	char err_body[S3_ERR_BODY_MAX];
	size_t err_len;
	char curl_err[CURL_ERROR_SIZE];
};

/* The write requests of one object, held until it can go in one PUT. */
struct s3_fill {
	struct s3_fill *next;
	uint64_t objno;
	uint64_t got; /* indexes whose request is here */
	struct tb_io *r[S3OBJ_PACK_MAX];
	uint64_t last_ns; /* when the latest arrived */
	bool push;	  /* one of them is waited for (tb_io.push) */
};

/* A version to delete. */
struct s3_del {
	struct s3_del *next;
	struct s3obj_version v;
	uint64_t due_ns;
};

struct s3_priv {
	struct tb_dev *d;
	CURLM *multi;
	char sigv4[96];		 /* "aws:amz:<region>:s3" */
	char base[S3_URL_MAX];	 /* URL of the bucket, no trailing slash */
	char keydir[S3_KEY_MAX]; /* "<prefix>/<store id>/", URI-encoded */
	char keydir_raw[S3_KEY_MAX];
	char endpoint[S3_URL_MAX];
	char bucket[256];
	bool https, path_style;
	char empty_sha[SHA256_HEX_LEN + 1];
	char *token_hdr; /* "x-amz-security-token: ..." or NULL */
	uint64_t timeout_ns;
	unsigned pack;			 /* blocks per object; 0: one object per slot (blk/) */
	struct s3objs objs;		 /* packed: with d->lock */
	struct s3_del *dels, *dels_tail; /* with d->lock: versions to delete */
	/* Owned by the engine thread once it runs. */
	unsigned nx;
	struct s3_xfer *xfers; /* the pool */
	struct s3_xfer *idle;
	struct s3_xfer *backoff;
	struct s3_xfer probe; /* health probe, and the checks at open */
	bool probing;
	uint64_t next_probe_ns;
	unsigned no_server; /* attempts in a row that could not connect */
	struct tb_io *reads, *reads_tail;   /* reads taken, waiting for a handle */
	struct tb_io *writes, *writes_tail; /* unpacked writes waiting for a handle */
	struct s3_fill *fills;		    /* packed writes, by object */
	uint64_t last_write_ns;		    /* when the latest write request came */
	double write_gap_ns;		    /* moving average of the time between them */
	unsigned nputs;			    /* PUTs of write-back running */
	unsigned ndeletes;		    /* DELETEs running */
	bool compacting;
	char *compact_buf; /* an object's bytes, while compacting it */
	uint64_t rng;
	long err_log_sec[2]; /* reads and writes, rate-limited apart */
	pthread_t thread;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void curl_init_once(void)
{
	curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- names, URLs and hashes ---- */

/* Percent-encode all but RFC 3986 unreserved characters and '/'. */
static int uri_encode(char *out, size_t outlen, const char *in)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (const unsigned char *c = (const unsigned char *)in; *c; c++) {
		bool plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
			     (*c >= '0' && *c <= '9') || strchr("-._~/", *c);

		if (o + (plain ? 1 : 3) >= outlen)
			return -ENAMETOOLONG;
		if (plain) {
			out[o++] = (char)*c;
		} else {
			out[o++] = '%';
			out[o++] = hex[*c >> 4];
			out[o++] = hex[*c & 0xf];
		}
	}
	out[o] = 0;
	return 0;
}

static void sha256_hex(const void *buf, size_t len, char out[SHA256_HEX_LEN + 1])
{
	unsigned char md[SHA256_DIGEST_LENGTH];

	EVP_Digest(buf, len, md, NULL, EVP_sha256(), NULL);
	for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/*
 * The bucket's URL from the endpoint (default: AWS in the region): path
 * style puts the bucket first in the path, virtual-host style in the host.
 */
static int s3_base_url(struct s3_priv *p, const struct tb_s3_config *cfg, char *err, size_t errlen)
{
	char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, bucket[sizeof(p->bucket)];
	char *user = NULL;
	CURLU *u = curl_url();
	size_t plen;
	int ret = -EINVAL;

	if (!u)
		return -ENOMEM;
	if (cfg->endpoint && *cfg->endpoint)
		snprintf(p->endpoint, sizeof(p->endpoint), "%s", cfg->endpoint);
	else
		snprintf(p->endpoint, sizeof(p->endpoint), "https://s3.%s.amazonaws.com",
			 cfg->region);
	/*
	 * The endpoint is shown in logs, stats and the configuration: a user or
	 * password in it would be too. It is refused, and not printed.
	 */
	if (curl_url_set(u, CURLUPART_URL, p->endpoint, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK) {
		curl_free(user);
		explicit_bzero(p->endpoint, sizeof(p->endpoint));
		snprintf(err, errlen,
			 "s3 endpoint: a user or password in the URL is refused; give "
			 "credentials in AWS_* variables or the [s3] section of the config file");
		goto out;
	}
	if (curl_url_set(u, CURLUPART_URL, p->endpoint, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
		/* Not printed: what cannot be parsed may still hold a secret. */
		snprintf(err, errlen, "s3 endpoint: not a URL like http(s)://host[:port]");
		goto out;
	}
	if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0) {
		snprintf(err, errlen, "s3 endpoint: only http:// and https:// are supported");
		goto out;
	}
	if (curl_url_get(u, CURLUPART_PORT, &port, 0) != CURLUE_OK)
		port = NULL;
	if (curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK)
		path = NULL;
	plen = path ? strlen(path) : 0;
	while (plen && path[plen - 1] == '/')
		plen--;
	p->https = strcmp(scheme, "https") == 0;
	if (uri_encode(bucket, sizeof(bucket), cfg->bucket) < 0 || strchr(cfg->bucket, '/')) {
		snprintf(err, errlen, "s3 bucket name '%s' is not valid", cfg->bucket);
		goto out;
	}
	if (cfg->path_style)
		ret = snprintf(p->base, sizeof(p->base), "%s://%s%s%s%.*s/%s", scheme, host,
			       port ? ":" : "", port ? port : "", (int)plen, path ? path : "",
			       bucket);
	else
		ret = snprintf(p->base, sizeof(p->base), "%s://%s.%s%s%s%.*s", scheme, bucket, host,
			       port ? ":" : "", port ? port : "", (int)plen, path ? path : "");
	ret = ret < (int)sizeof(p->base) ? 0 : -ENAMETOOLONG;
	if (ret)
		snprintf(err, errlen, "s3 endpoint: URL too long (at most %zu characters)",
			 sizeof(p->base));
out:
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_free(path);
	curl_url_cleanup(u);
	return ret;
}

/* "<prefix>/<store id>/", without a leading slash when the prefix is empty. */
static int s3_keydir(struct s3_priv *p, const char *prefix, const char *store_id)
{
	char *raw = p->keydir_raw;
	size_t plen;

	prefix = prefix ? prefix : "";
	while (*prefix == '/')
		prefix++;
	plen = strlen(prefix);
	while (plen && prefix[plen - 1] == '/')
		plen--;
	if (snprintf(raw, sizeof(p->keydir_raw), "%.*s%s%s/", (int)plen, prefix, plen ? "/" : "",
		     store_id) >= (int)sizeof(p->keydir_raw))
		return -ENAMETOOLONG;
	return uri_encode(p->keydir, sizeof(p->keydir), raw);
}

/* The S3 error code of an error answer (its <Code> element), or "". */
static void s3_error_code(const struct s3_xfer *x, char *code, size_t len)
{
	/* The one element we need does not call for an XML parser. */
	const char *a = strstr(x->err_body, "<Code>"), *b;

	code[0] = 0;
	if (!a)
		return;
	a += strlen("<Code>");
	b = strstr(a, "</Code>");
	if (b)
		snprintf(code, len, "%.*s", (int)(b - a), a);
}

/* One line on why an attempt failed, for logs and errors; no secrets in it. */
static void s3_describe(const struct s3_xfer *x, char *buf, size_t len)
{
	char code[64];

	if (x->code != CURLE_OK) {
		snprintf(buf, len, "%s",
			 x->curl_err[0] ? x->curl_err : curl_easy_strerror(x->code));
		return;
	}
	if (x->status / 100 == 2) {
		snprintf(buf, len, "HTTP %ld with %s body (%zu bytes, expected %zu)", x->status,
			 x->overflow ? "a longer" : "a short", x->pos, x->len);
		return;
	}
	s3_error_code(x, code, sizeof(code));
	snprintf(buf, len, "HTTP %ld%s%s", x->status, code[0] ? " " : "", code);
}

/* ---- one transfer ---- */

/*
 * Where byte pos of x's body is, and how many bytes follow it there: in
 * the block of request pos / block size for read and write jobs, else in
 * the one buffer.
 */
static char *xfer_at(const struct s3_xfer *x, size_t pos, size_t *avail)
{
	size_t bs;

	if (!x->nr) {
		*avail = x->len - pos;
		return (x->method == S3_GET ? x->dst : (char *)x->body) + pos;
	}
	bs = x->rs[0]->len;
	*avail = bs - pos % bs;
	return (char *)x->rs[pos / bs]->buf + pos % bs;
}

static size_t s3_recv(char *data, size_t size, size_t n, void *arg)
{
	struct s3_xfer *x = arg;
	size_t bytes = size * n;

	if (!x->status)
		curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
	if (x->method == S3_GET && x->status / 100 == 2) {
		size_t left = bytes;

		while (left && x->pos < x->len) {
			size_t avail, take;
			char *at = xfer_at(x, x->pos, &avail);

			take = left < avail ? left : avail;
			memcpy(at, data, take);
			x->pos += take;
			data += take;
			left -= take;
		}
		if (left)
			x->overflow = true;
		return bytes;
	}
	if (x->err_len + 1 < sizeof(x->err_body)) {
		size_t take = sizeof(x->err_body) - 1 - x->err_len;

		take = bytes < take ? bytes : take;
		memcpy(x->err_body + x->err_len, data, take);
		x->err_len += take;
		x->err_body[x->err_len] = 0;
	}
	return bytes;
}

static size_t s3_send(char *out, size_t size, size_t n, void *arg)
{
	struct s3_xfer *x = arg;
	size_t room = size * n, sent = 0;

	while (room && x->pos < x->len) {
		size_t avail, take;
		const char *at = xfer_at(x, x->pos, &avail);

		take = room < avail ? room : avail;
		memcpy(out + sent, at, take);
		x->pos += take;
		sent += take;
		room -= take;
	}
	return sent;
}

/* libcurl rewinds the body when it must send it again on a new connection. */
static int s3_seek(void *arg, curl_off_t off, int origin)
{
	struct s3_xfer *x = arg;

	if (origin != SEEK_SET || off < 0 || (size_t)off > x->len)
		return CURL_SEEKFUNC_CANTSEEK;
	x->pos = (size_t)off;
	return CURL_SEEKFUNC_OK;
}

static int s3_xfer_init(struct s3_priv *p, struct s3_xfer *x, const struct tb_s3_config *cfg)
{
	CURL *e = curl_easy_init();

	x->p = p;
	x->easy = e;
	if (!e)
		return -ENOMEM;
	if (curl_easy_setopt(e, CURLOPT_AWS_SIGV4, p->sigv4) != CURLE_OK ||
	    curl_easy_setopt(e, CURLOPT_USERNAME, cfg->access_key) != CURLE_OK ||
	    curl_easy_setopt(e, CURLOPT_PASSWORD, cfg->secret_key) != CURLE_OK ||
	    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK)
		return -ENOTSUP;
	curl_easy_setopt(e, CURLOPT_PRIVATE, x);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->curl_err);
	/* Keys are sent as we encoded and signed them, dot segments included. */
	curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, s3_recv);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(e, CURLOPT_READFUNCTION, s3_send);
	curl_easy_setopt(e, CURLOPT_READDATA, x);
	curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, s3_seek);
	curl_easy_setopt(e, CURLOPT_SEEKDATA, x);
	curl_easy_setopt(e, CURLOPT_BUFFERSIZE, S3_RECV_BUFFER);
	curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, S3_SEND_BUFFER);
	return 0;
}

static void s3_xfer_reset(struct s3_xfer *x)
{
	curl_slist_free_all(x->hdrs);
	x->hdrs = NULL;
	x->nr = 0;
	x->body = NULL;
	x->dst = NULL;
	x->len = 0;
}

/* Append a header line; on failure free the list and return NULL. */
static struct curl_slist *slist_add(struct curl_slist *h, const char *line)
{
	struct curl_slist *n = h ? curl_slist_append(h, line) : NULL;

	if (h && !n)
		curl_slist_free_all(h);
	return n;
}

/* SHA-256 of x's body, wherever its bytes are. */
static void sha256_body(const struct s3_xfer *x, char out[SHA256_HEX_LEN + 1])
{
	unsigned char md[SHA256_DIGEST_LENGTH];
	EVP_MD_CTX *c = EVP_MD_CTX_new();

	if (!c || !EVP_DigestInit_ex(c, EVP_sha256(), NULL)) {
		out[0] = 0; /* signed as nothing: the server refuses it, and we retry */
		EVP_MD_CTX_free(c);
		return;
	}
	for (size_t pos = 0, avail = 0; pos < x->len; pos += avail)
		EVP_DigestUpdate(c, xfer_at(x, pos, &avail), avail);
	EVP_DigestFinal_ex(c, md, NULL);
	EVP_MD_CTX_free(c);
	for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/*
 * Aim x at key (below the store's key folder, or at the bucket itself with
 * a query when key starts with '?') with a method; the body is set already
 * (body, dst or rs, and len). A GET asks for bytes [off, off + len). The
 * payload is signed by its SHA-256 over plain http, UNSIGNED-PAYLOAD over
 * TLS. The deadline is the caller's. libcurl 7.88 signs a query verbatim,
 * so one must come sorted and encoded already.
 */
static int s3_xfer_aim(struct s3_xfer *x, enum s3_method m, const char *key, size_t off)
{
	struct s3_priv *p = x->p;
	char hdr[S3_URL_MAX], sha[SHA256_HEX_LEN + 1];
	struct curl_slist *h;
	int n;

	curl_slist_free_all(x->hdrs);
	x->hdrs = NULL;
	x->method = m;
	x->exact = true;
	x->attempts = 0;
	if (key[0] == '?')
		n = snprintf(x->url, sizeof(x->url), "%s%s%s", p->base, p->path_style ? "" : "/",
			     key);
	else
		n = snprintf(x->url, sizeof(x->url), "%s/%s%s", p->base, p->keydir, key);
	if (n >= (int)sizeof(x->url))
		return -ENAMETOOLONG;
	if (p->https)
		snprintf(sha, sizeof(sha), "UNSIGNED-PAYLOAD");
	else if (m == S3_PUT)
		sha256_body(x, sha);
	else
		memcpy(sha, p->empty_sha, sizeof(sha));
	/* No "Expect:" to turn 100-continue off: libcurl 7.88 would sign it empty. */
	snprintf(hdr, sizeof(hdr), "x-amz-content-sha256: %s", sha);
	h = curl_slist_append(NULL, hdr);
	if (m == S3_GET && key[0] != '?') {
		snprintf(hdr, sizeof(hdr), "Range: bytes=%zu-%zu", off, off + x->len - 1);
		h = slist_add(h, hdr);
	}
	if (p->token_hdr)
		h = slist_add(h, p->token_hdr);
	x->hdrs = h;
	return h ? 0 : -ENOMEM;
}

/* Aim x at key with one buffer: body to send, or dst to receive len bytes into. */
static int s3_xfer_set(struct s3_xfer *x, enum s3_method m, const char *key, const void *body,
		       void *dst, size_t len)
{
	s3_xfer_reset(x);
	x->job = S3_JOB_CHECK;
	x->body = body;
	x->dst = dst;
	x->len = len;
	return s3_xfer_aim(x, m, key, 0);
}

/* Options of the next attempt: method, headers, and the time left. */
static void s3_attempt_prepare(struct s3_xfer *x, uint64_t now)
{
	CURL *e = x->easy;
	long left_ms = x->deadline_ns > now ? (long)((x->deadline_ns - now) / NS_PER_MS) : 0;

	if (left_ms < 1)
		left_ms = 1;
	pthread_mutex_lock(&x->p->d->lock);
	x->p->d->requests++;
	pthread_mutex_unlock(&x->p->d->lock);
	x->pos = 0;
	x->overflow = false;
	x->status = 0;
	x->code = CURLE_OK;
	x->err_len = 0;
	x->err_body[0] = 0;
	x->curl_err[0] = 0;
	x->attempts++;
	curl_easy_setopt(e, CURLOPT_HTTPGET, 1L); /* clears upload and nobody */
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, x->method == S3_DELETE ? "DELETE" : NULL);
	if (x->method == S3_HEAD)
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	if (x->method == S3_PUT) {
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)x->len);
	}
	curl_easy_setopt(e, CURLOPT_URL, x->url);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, left_ms);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
			 left_ms < S3_CONNECT_TIMEOUT_MS ? left_ms : S3_CONNECT_TIMEOUT_MS);
}

static bool s3_curl_transient(CURLcode c)
{
	switch (c) {
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_CONNECT:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
		return true;
	default:
		return false;
	}
}

/* Judge the attempt that just ended; *err is the errno when it failed. */
static enum s3_verdict s3_judge(struct s3_xfer *x, int *err)
{
	*err = -EIO;
	if (x->code != CURLE_OK)
		return s3_curl_transient(x->code) ? S3_RETRY : S3_FAILED;
	curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
	if (x->status / 100 == 2) {
		/* A body of another length is never a short read that looks fine. */
		if (x->method == S3_GET && (x->overflow || (x->exact && x->pos != x->len)))
			return S3_FAILED;
		*err = 0;
		return S3_DONE;
	}
	if (x->status >= 500 || x->status == 429 || x->status == 408)
		return S3_RETRY;
	return S3_FAILED;
}

static uint64_t s3_random(struct s3_priv *p)
{
	/* xorshift64*: jitter needs no more than this. */
	p->rng ^= p->rng >> 12;
	p->rng ^= p->rng << 25;
	p->rng ^= p->rng >> 27;
	return p->rng * XORSHIFT64_MULT;
}

/* Exponential backoff with jitter: half the step, plus up to as much again. */
static uint64_t s3_backoff_ns(struct s3_priv *p, unsigned attempts)
{
	unsigned shift = attempts > 1 ? attempts - 1 : 0;
	uint64_t step = S3_BACKOFF_MIN_MS;

	while (shift-- && step < S3_BACKOFF_MAX_MS)
		step *= 2;
	if (step > S3_BACKOFF_MAX_MS)
		step = S3_BACKOFF_MAX_MS;
	step *= NS_PER_MS;
	return step / 2 + s3_random(p) % (step / 2 + 1);
}

/*
 * Run x to its end on the calling thread (at open): transient failures are
 * tried again within the deadline, except that an endpoint that cannot be
 * reached at all fails at once, so a mount with a wrong endpoint fails fast.
 */
static enum s3_verdict s3_perform(struct s3_xfer *x, int *err)
{
	struct s3_priv *p = x->p;
	enum s3_verdict v;

	x->deadline_ns = dev_now_ns() + p->timeout_ns;
	for (;;) {
		uint64_t now = dev_now_ns(), wait;

		s3_attempt_prepare(x, now);
		x->code = curl_easy_perform(x->easy);
		v = s3_judge(x, err);
		if (v != S3_RETRY || x->code == CURLE_COULDNT_CONNECT ||
		    x->code == CURLE_COULDNT_RESOLVE_HOST)
			return v;
		wait = s3_backoff_ns(p, x->attempts);
		now = dev_now_ns();
		if (now + wait >= x->deadline_ns)
			return v;
		struct timespec ts = {(time_t)(wait / NS_PER_SEC), (long)(wait % NS_PER_SEC)};
		nanosleep(&ts, NULL);
	}
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

/* The identity of a key folder that had none: its pack and binding. */
static int s3_bind(struct tb_dev *d, const char *store_id, char *err, size_t errlen)
{
	struct s3_priv *p = d->priv;
	struct s3_xfer *x = &p->probe;
	char body[S3_ID_MAX];
	int ret, e;

	snprintf(body, sizeof(body), "tensorfs-dev store=%s index=%u kind=s3 pack=%u bind=%s\n",
		 store_id, d->index, p->pack, d->bind);
	ret = s3_xfer_set(x, S3_PUT, S3_ID_OBJ, body, NULL, strlen(body));
	if (ret)
		return ret;
	if (s3_perform(x, &e) != S3_DONE)
		return s3_open_error(p, x, "writing " S3_ID_OBJ, err, errlen);
	log_info("%s: new store key folder %s in s3 bucket %s", d->name, p->keydir, p->bucket);
	return 0;
}

/* Credentials that may read but not write or delete are caught at mount. */
static int s3_check_write(struct s3_priv *p, char *err, size_t errlen)
{
	static const char probe[] = "tensorfs write check\n";
	struct s3_xfer *x = &p->probe;
	int ret, e;

	ret = s3_xfer_set(x, S3_PUT, S3_CHECK_OBJ, probe, NULL, sizeof(probe) - 1);
	if (ret)
		return ret;
	if (s3_perform(x, &e) != S3_DONE)
		return s3_open_error(p, x, "writing an object", err, errlen);
	ret = s3_xfer_set(x, S3_DELETE, S3_CHECK_OBJ, NULL, NULL, 0);
	if (ret)
		return ret;
	if (s3_perform(x, &e) != S3_DONE)
		return s3_open_error(p, x, "deleting an object", err, errlen);
	return 0;
}

/* ---- the engine: bookkeeping shared with the allocator ---- */

static void s3_kick(struct tb_dev *d)
{
	uint64_t one = 1;

	if (write(d->wake_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_err("%s: cannot wake the I/O thread: %s", d->name, strerror(errno));
}

/* The device's counters, from the objects'. d->lock held. */
static void s3_counters(struct s3_priv *p)
{
	struct tb_dev *d = p->d;

	d->held_slots = p->objs.held_slots;
	d->dead_bytes = p->objs.dead_slots * d->block_size;
	d->objects = p->objs.stored;
}

static void pk_key(char *key, size_t len, const struct s3obj_version *v)
{
	snprintf(key, len, S3_PK_DIR "%012llx-%08x-%04llx", (unsigned long long)v->objno, v->gen,
		 (unsigned long long)v->layout);
}

/* Delete version v when it is due. d->lock held. */
static void s3_del_queue(struct s3_priv *p, const struct s3obj_version *v)
{
	struct s3_del *dl = calloc(1, sizeof(*dl));

	if (!dl) {
		log_err("%s: no memory to delete object %llx; the next mount will", p->d->name,
			(unsigned long long)v->objno);
		return;
	}
	dl->v = *v;
	if (p->dels_tail)
		p->dels_tail->next = dl;
	else
		p->dels = dl;
	p->dels_tail = dl;
}

/* Do what s3obj said after a change to objno. d->lock held. */
static void s3_todo(struct s3_priv *p, uint64_t objno, enum s3obj_todo todo)
{
	struct s3obj *o = s3obj_get(&p->objs, objno);

	if (todo == S3OBJ_TODO_DELETE && o) {
		struct s3obj_version v = {objno, o->gen, o->layout, true, false};

		s3_del_queue(p, &v);
	}
	if (todo != S3OBJ_TODO_NONE)
		s3_kick(p->d);
}

/* Slot management of a packed tier (dev.h); d->lock held. */
static int s3_alloc(struct tb_dev *d, uint64_t *slot)
{
	struct s3_priv *p = d->priv;
	int ret = s3obj_alloc(&p->objs, slot);

	s3_counters(p);
	return ret;
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
	int ret = s3obj_mark(&p->objs, slot);

	s3_counters(p);
	return ret;
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

/* ---- the engine: transfers ---- */

static const char *const job_name[] = {
    [S3_JOB_CHECK] = "check",
    [S3_JOB_READ] = "GET",
    [S3_JOB_WRITE] = "PUT",
    [S3_JOB_DELETE] = "DELETE",
    [S3_JOB_COMPACT_GET] = "GET (compaction)",
    [S3_JOB_COMPACT_PUT] = "PUT (compaction)",
};

static void s3_log_failure(struct s3_priv *p, struct s3_xfer *x)
{
	char why[CURL_ERROR_SIZE + 64];

	if (!log_ratelimit(&p->err_log_sec[x->method == S3_GET], S3_LOG_INTERVAL_S))
		return;
	s3_describe(x, why, sizeof(why));
	if (p->pack)
		log_err("%s: %s of slot %llu failed after %u attempt%s (object %llx, generation "
			"%x): %s",
			p->d->name, job_name[x->job], (unsigned long long)x->slot, x->attempts,
			x->attempts == 1 ? "" : "s", (unsigned long long)x->v.objno, x->v.gen, why);
	else
		log_err("%s: %s of slot %llu failed after %u attempt%s: %s", p->d->name,
			job_name[x->job], (unsigned long long)x->slot, x->attempts,
			x->attempts == 1 ? "" : "s", why);
}

static void s3_idle(struct s3_priv *p, struct s3_xfer *x)
{
	s3_xfer_reset(x);
	x->next = p->idle;
	p->idle = x;
}

static void s3_finish_reqs(struct s3_priv *p, struct tb_io **rs, unsigned n, long res)
{
	for (unsigned i = 0; i < n; i++)
		if (dev_finish(p->d, rs[i], res < 0 ? res : (long)rs[i]->len))
			dev_requeue(p->d, rs[i]); /* cannot happen: a transfer is whole or failed */
}

static void s3_launch(struct s3_priv *p, struct s3_xfer *x);

/* A DELETE ended: a key that is gone already is deleted too. */
static void s3_delete_done(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_dev *d = p->d;
	struct s3obj_version v = x->v;
	bool gone = res >= 0 || (x->code == CURLE_OK && x->status == 404);

	pthread_mutex_lock(&d->lock);
	if (gone && v.whole)
		s3obj_deleted(&p->objs, v.objno);
	if (!gone && !d->stopping) {
		s3_del_queue(p, &v); /* again later; the object stays DELETING */
		if (p->dels_tail)
			p->dels_tail->due_ns = dev_now_ns() + S3_DELETE_RETRY_NS;
	}
	s3_counters(p);
	pthread_mutex_unlock(&d->lock);
}

/* Compaction read the object whole: write its live blocks as a new version. */
static void s3_compact_got(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_dev *d = p->d;
	struct s3obj_version v = x->v, nv;
	struct s3obj *o;
	size_t bs = d->block_size, to = 0, from = 0;
	char key[64];
	uint64_t live;

	pthread_mutex_lock(&d->lock);
	o = s3obj_get(&p->objs, v.objno);
	o->gets--;
	if (res < 0 || o->state != S3OBJ_STORED || o->gen != v.gen || !o->used) {
		s3_todo(p, v.objno, s3obj_compact_abort(&p->objs, v.objno));
		s3_counters(p);
		pthread_mutex_unlock(&d->lock);
		p->compacting = false;
		s3_idle(p, x);
		return;
	}
	live = o->used & v.layout;
	nv = (struct s3obj_version){v.objno, p->objs.next_gen++, live, false, false};
	pthread_mutex_unlock(&d->lock);
	for (unsigned i = 0; i < p->pack; i++) {
		if (!(v.layout & (1ULL << i)))
			continue;
		if (live & (1ULL << i)) {
			if (to != from)
				memmove(p->compact_buf + to, p->compact_buf + from, bs);
			to += bs;
		}
		from += bs;
	}
	s3_xfer_reset(x);
	x->job = S3_JOB_COMPACT_PUT;
	x->body = p->compact_buf;
	x->len = to;
	x->v = nv;
	pk_key(key, sizeof(key), &nv);
	if (s3_xfer_aim(x, S3_PUT, key, 0) < 0) {
		pthread_mutex_lock(&d->lock);
		s3_todo(p, v.objno, s3obj_compact_abort(&p->objs, v.objno));
		pthread_mutex_unlock(&d->lock);
		p->compacting = false;
		s3_idle(p, x);
		return;
	}
	x->deadline_ns = dev_now_ns() + p->timeout_ns;
	s3_launch(p, x);
}

static void s3_compact_put_done(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_dev *d = p->d;
	struct s3obj_version nv = x->v, old;

	pthread_mutex_lock(&d->lock);
	if (res >= 0) {
		enum s3obj_todo todo = s3obj_compacted(&p->objs, nv.objno, nv.gen, nv.layout, &old);

		s3_del_queue(p, &old);
		s3_todo(p, nv.objno, todo);
		d->compacted_objects++;
		d->compacted_bytes += x->len;
	} else {
		s3_todo(p, nv.objno, s3obj_compact_abort(&p->objs, nv.objno));
		s3_del_queue(p, &nv); /* it may have been stored all the same */
	}
	s3_counters(p);
	pthread_mutex_unlock(&d->lock);
	p->compacting = false;
	s3_idle(p, x);
}

/* The job on x ended with res (bytes moved, or -errno). */
static void s3_complete(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_dev *d = p->d;
	struct tb_io *rs[S3OBJ_PACK_MAX];
	struct s3obj_version v = x->v;
	enum s3_job job = x->job;
	unsigned nr = x->nr;

	if (res < 0 && job != S3_JOB_DELETE)
		s3_log_failure(p, x);
	memcpy(rs, x->rs, nr * sizeof(*rs));
	switch (job) {
	case S3_JOB_READ:
		if (p->pack) {
			pthread_mutex_lock(&d->lock);
			s3obj_get(&p->objs, v.objno)->gets--;
			pthread_mutex_unlock(&d->lock);
		}
		s3_idle(p, x);
		s3_finish_reqs(p, rs, nr, res);
		break;
	case S3_JOB_WRITE:
		p->nputs--;
		if (p->pack) {
			pthread_mutex_lock(&d->lock);
			if (res >= 0)
				s3obj_stored(&p->objs, v.objno, v.gen, v.layout);
			else
				s3obj_put_failed(&p->objs, v.objno);
			s3_counters(p);
			pthread_mutex_unlock(&d->lock);
		}
		s3_idle(p, x);
		s3_finish_reqs(p, rs, nr, res);
		break;
	case S3_JOB_DELETE:
		p->ndeletes--;
		s3_delete_done(p, x, res);
		s3_idle(p, x);
		break;
	case S3_JOB_COMPACT_GET:
		s3_compact_got(p, x, res);
		break;
	case S3_JOB_COMPACT_PUT:
		s3_compact_put_done(p, x, res);
		break;
	case S3_JOB_CHECK:
		s3_idle(p, x);
		break;
	}
}

static void s3_launch(struct s3_priv *p, struct s3_xfer *x)
{
	s3_attempt_prepare(x, dev_now_ns());
	if (curl_multi_add_handle(p->multi, x->easy) != CURLM_OK) {
		snprintf(x->curl_err, sizeof(x->curl_err), "cannot add a transfer to libcurl");
		x->code = CURLE_OUT_OF_MEMORY;
		if (x == &p->probe)
			p->probing = false;
		else
			s3_complete(p, x, -EIO);
	}
}

/* The earliest deadline of requests rs: each may take timeout after it was taken. */
static uint64_t reqs_deadline(const struct s3_priv *p, struct tb_io **rs, unsigned n)
{
	uint64_t first = rs[0]->start_ns;

	for (unsigned i = 1; i < n; i++)
		if (rs[i]->start_ns < first)
			first = rs[i]->start_ns;
	return first + p->timeout_ns;
}

/* Aim x at its job's key and start it, or fail the job. */
static void s3_go(struct s3_priv *p, struct s3_xfer *x, enum s3_method m, const char *key,
		  size_t off)
{
	int ret = s3_xfer_aim(x, m, key, off);

	if (ret < 0) {
		snprintf(x->curl_err, sizeof(x->curl_err), "%s", strerror(-ret));
		x->code = CURLE_OUT_OF_MEMORY;
		s3_complete(p, x, ret);
		return;
	}
	s3_launch(p, x);
}

/* ---- the engine: what to start ---- */

/* Hold a packed write until its object can go whole. */
static void s3_fill_add(struct s3_priv *p, struct tb_io *r, uint64_t now)
{
	uint64_t k = r->slot / p->pack;
	unsigned i = (unsigned)(r->slot % p->pack);
	struct s3_fill **pp = &p->fills, *f;

	while (*pp && (*pp)->objno != k)
		pp = &(*pp)->next;
	f = *pp;
	if (!f) {
		f = calloc(1, sizeof(*f));
		if (!f) {
			s3_finish_reqs(p, &r, 1, -ENOMEM);
			return;
		}
		f->objno = k;
		*pp = f; /* at the end: objects go in the order they were filled */
	}
	f->r[i] = r;
	f->got |= 1ULL << i;
	f->last_ns = now;
	f->push |= r->push;
	if (p->last_write_ns && now > p->last_write_ns)
		p->write_gap_ns = 0.8 * p->write_gap_ns + 0.2 * (double)(now - p->last_write_ns);
	p->last_write_ns = now;
	pthread_mutex_lock(&p->d->lock);
	s3obj_get(&p->objs, k)->held++;
	pthread_mutex_unlock(&p->d->lock);
}

/* How long partly filled object f waits for its next block. */
static uint64_t pack_wait_ns(const struct s3_priv *p, const struct s3_fill *f)
{
	double w = S3_PACK_WAIT_GAPS * p->write_gap_ns;

	/*
	 * Nobody waits for these (no fsync, no unmount, no age limit): the
	 * most. The flusher sends objects whole when it can, and at 2 ms a
	 * flusher preempted halfway through a batch on a loaded machine
	 * closed objects with part of their blocks: more PUTs, and more GETs
	 * to read them back.
	 */
	if (!f->push)
		return S3_PACK_WAIT_MAX_NS;

	if (w < S3_PACK_WAIT_MIN_NS)
		return S3_PACK_WAIT_MIN_NS;
	return w > S3_PACK_WAIT_MAX_NS ? S3_PACK_WAIT_MAX_NS : (uint64_t)w;
}

/*
 * Whether f's object can go: every slot handed out of it is here (the
 * others were freed), and the allocator has moved on, or has given it
 * nothing for pack_wait_ns (then it moves on now). Otherwise *wait says
 * when to look again. d->lock held.
 */
static bool s3_fill_ready(struct s3_priv *p, struct s3_fill *f, uint64_t now, uint64_t *wait)
{
	struct s3obj *o = s3obj_get(&p->objs, f->objno);
	uint64_t due = f->last_ns + pack_wait_ns(p, f);

	if ((f->got & o->used) != o->used)
		return false; /* more requests to come */
	if (p->objs.open == f->objno) {
		if (now < due) {
			if (due - now < *wait)
				*wait = due - now;
			return false;
		}
		s3obj_close(&p->objs, f->objno);
	}
	return true;
}

static void s3_start_put(struct s3_priv *p, struct s3_xfer *x, struct s3_fill *f)
{
	char key[64];

	pthread_mutex_lock(&p->d->lock);
	x->v = (struct s3obj_version){f->objno, p->objs.next_gen++, f->got, false, false};
	pthread_mutex_unlock(&p->d->lock);
	x->job = S3_JOB_WRITE;
	for (unsigned i = 0; i < p->pack; i++)
		if (f->got & (1ULL << i))
			x->rs[x->nr++] = f->r[i];
	x->len = x->nr * p->d->block_size;
	x->slot = x->rs[0]->slot;
	x->deadline_ns = reqs_deadline(p, x->rs, x->nr);
	free(f);
	pk_key(key, sizeof(key), &x->v);
	p->nputs++;
	s3_go(p, x, S3_PUT, key, 0);
}

/* An unpacked tier: one slot, one object. */
static void s3_start_single(struct s3_priv *p, struct s3_xfer *x, struct tb_io *r)
{
	char key[sizeof(S3_BLK_DIR) + 16];

	snprintf(key, sizeof(key), S3_BLK_DIR "%016llx", (unsigned long long)r->slot);
	x->job = r->op == IO_READ ? S3_JOB_READ : S3_JOB_WRITE;
	x->rs[0] = r;
	x->nr = 1;
	x->len = r->len;
	x->slot = r->slot;
	x->deadline_ns = r->start_ns + p->timeout_ns;
	if (r->op == IO_WRITE)
		p->nputs++;
	s3_go(p, x, r->op == IO_READ ? S3_GET : S3_PUT, key, 0);
}

/* Take q off the list of reads waiting; pp points at the link to it. */
static void unlink_read(struct s3_priv *p, struct tb_io **pp, struct tb_io *prev)
{
	struct tb_io *q = *pp;

	*pp = q->next;
	if (p->reads_tail == q)
		p->reads_tail = prev;
	q->next = NULL;
}

/*
 * Start the first waiting read on x, with every waiting read of the same
 * object that extends its byte range: one ranged GET. False when x was not
 * used (the block is missing from its object: the read failed).
 */
static bool s3_start_read(struct s3_priv *p, struct s3_xfer *x)
{
	struct tb_dev *d = p->d;
	struct tb_io *r = p->reads;
	size_t bs = d->block_size;
	int64_t lo, hi;
	bool grew = true;
	char key[64];
	uint64_t k;

	unlink_read(p, &p->reads, NULL);
	if (!p->pack) {
		s3_start_single(p, x, r);
		return true;
	}
	k = r->slot / p->pack;
	pthread_mutex_lock(&d->lock);
	lo = s3obj_offset(&p->objs, r->slot, bs);
	if (lo < 0) {
		pthread_mutex_unlock(&d->lock);
		if (log_ratelimit(&p->err_log_sec[1], S3_LOG_INTERVAL_S))
			log_err("%s: slot %llu is in no object of the bucket", d->name,
				(unsigned long long)r->slot);
		s3_finish_reqs(p, &r, 1, -EIO);
		return false;
	}
	hi = lo + (int64_t)bs;
	x->rs[0] = r;
	x->nr = 1;
	while (grew && x->nr < p->pack) {
		struct tb_io **pp = &p->reads, *prev = NULL;

		grew = false;
		while (*pp && x->nr < p->pack) {
			struct tb_io *q = *pp;
			int64_t off =
			    q->slot / p->pack == k ? s3obj_offset(&p->objs, q->slot, bs) : -1;

			if (off >= 0 && (off == hi || off + (int64_t)bs == lo)) {
				unlink_read(p, pp, prev);
				if (off == hi) {
					x->rs[x->nr++] = q;
					hi += (int64_t)bs;
				} else {
					memmove(x->rs + 1, x->rs, x->nr * sizeof(*x->rs));
					x->rs[0] = q;
					x->nr++;
					lo -= (int64_t)bs;
				}
				grew = true;
				continue;
			}
			prev = q;
			pp = &q->next;
		}
	}
	struct s3obj *o = s3obj_get(&p->objs, k);
	o->gets++;
	x->v = (struct s3obj_version){k, o->gen, o->layout, false, false};
	pthread_mutex_unlock(&d->lock);
	x->job = S3_JOB_READ;
	x->len = (size_t)(hi - lo);
	x->slot = x->rs[0]->slot;
	x->deadline_ns = reqs_deadline(p, x->rs, x->nr);
	pk_key(key, sizeof(key), &x->v);
	s3_go(p, x, S3_GET, key, (size_t)lo);
	return true;
}

/* The next packed object ready to go, taken off the list; *wait as s3_fill_ready. */
static struct s3_fill *s3_ready_fill(struct s3_priv *p, uint64_t now, uint64_t *wait)
{
	struct s3_fill **pp = &p->fills, *f = NULL;

	pthread_mutex_lock(&p->d->lock);
	while (*pp && !s3_fill_ready(p, *pp, now, wait))
		pp = &(*pp)->next;
	if (*pp) {
		f = *pp;
		*pp = f->next;
	}
	pthread_mutex_unlock(&p->d->lock);
	return f;
}

/* When a partly filled object stops waiting for more, if the allocator still fills it. */
static void s3_fills_wait(struct s3_priv *p, uint64_t now, uint64_t *wait)
{
	pthread_mutex_lock(&p->d->lock);
	for (struct s3_fill *f = p->fills; f; f = f->next) {
		uint64_t due = f->last_ns + pack_wait_ns(p, f), left = due > now ? due - now : 0;

		if (p->objs.open == f->objno && left < *wait)
			*wait = left;
	}
	pthread_mutex_unlock(&p->d->lock);
}

/* A delete that is due and that no running GET could trip over, taken off the queue. */
static struct s3_del *s3_due_delete(struct s3_priv *p, uint64_t now, uint64_t *wait)
{
	struct s3_del **pp = &p->dels, *dl = NULL, *prev = NULL;

	pthread_mutex_lock(&p->d->lock);
	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		struct s3obj *o = s3obj_get(&p->objs, (*pp)->v.objno);

		if ((*pp)->due_ns > now) {
			if ((*pp)->due_ns - now < *wait)
				*wait = (*pp)->due_ns - now;
			continue;
		}
		if (o && o->gets)
			continue;
		dl = *pp;
		*pp = dl->next;
		if (p->dels_tail == dl)
			p->dels_tail = prev;
		break;
	}
	pthread_mutex_unlock(&p->d->lock);
	return dl;
}

static bool s3_queue_empty(struct tb_dev *d)
{
	bool empty = true;

	pthread_mutex_lock(&d->lock);
	for (int c = 0; c < IO_NCLASS; c++)
		if (d->head[c])
			empty = false;
	pthread_mutex_unlock(&d->lock);
	return empty;
}

static bool s3_dev_down(struct tb_dev *d);

/* Compaction, when the device has nothing else to do. */
static bool s3_start_compaction(struct s3_priv *p, struct s3_xfer *x)
{
	struct tb_dev *d = p->d;
	struct s3obj *o;
	char key[64];
	uint64_t k;

	pthread_mutex_lock(&d->lock);
	k = d->stopping ? S3OBJ_NONE : s3obj_compact_next(&p->objs);
	if (k == S3OBJ_NONE) {
		pthread_mutex_unlock(&d->lock);
		return false;
	}
	o = s3obj_get(&p->objs, k);
	o->gets++;
	x->v = (struct s3obj_version){k, o->gen, o->layout, false, false};
	pthread_mutex_unlock(&d->lock);
	x->job = S3_JOB_COMPACT_GET;
	x->dst = p->compact_buf;
	x->len = (size_t)__builtin_popcountll(x->v.layout) * d->block_size;
	x->slot = k * p->pack;
	x->deadline_ns = dev_now_ns() + p->timeout_ns;
	p->compacting = true;
	pk_key(key, sizeof(key), &x->v);
	s3_go(p, x, S3_GET, key, 0);
	return true;
}

static struct s3_xfer *take_idle(struct s3_priv *p)
{
	struct s3_xfer *x = p->idle;

	p->idle = x->next;
	x->next = NULL;
	return x;
}

/*
 * Start what idle handles can: reads first (neighbours in one GET), then
 * whole objects to write (a quarter of the handles while reads wait), then
 * deletes and compaction when no read waits. Returns ns until a partly
 * filled object or a delete is due.
 */
static uint64_t s3_dispatch(struct s3_priv *p, uint64_t now)
{
	uint64_t wait = UINT64_MAX;
	unsigned put_share = (p->nx + S3_PUT_SHARE - 1) / S3_PUT_SHARE;

	while (p->idle && p->reads) {
		struct s3_xfer *x = take_idle(p);

		if (!s3_start_read(p, x)) {
			x->next = p->idle;
			p->idle = x;
		}
	}
	while (p->idle && (!p->reads || p->nputs < put_share)) {
		struct s3_fill *f = NULL;

		if (!p->pack && p->writes) {
			struct tb_io *r = p->writes;

			p->writes = r->next;
			if (!p->writes)
				p->writes_tail = NULL;
			s3_start_single(p, take_idle(p), r);
			continue;
		}
		if (p->pack)
			f = s3_ready_fill(p, now, &wait);
		if (!f)
			break;
		s3_start_put(p, take_idle(p), f);
	}
	if (p->pack && p->fills)
		s3_fills_wait(p, now, &wait);
	if (!p->pack || s3_dev_down(p->d))
		return wait;
	/* While reads wait, one DELETE at a time, so dead objects do not pile up. */
	while (p->idle && (!p->reads || !p->ndeletes)) {
		struct s3_del *dl = s3_due_delete(p, now, &wait);
		struct s3_xfer *x;
		char key[64];

		if (!dl)
			break;
		x = take_idle(p);
		x->job = S3_JOB_DELETE;
		x->v = dl->v;
		x->slot = dl->v.objno * p->pack;
		x->deadline_ns = now + p->timeout_ns;
		free(dl);
		pk_key(key, sizeof(key), &x->v);
		p->ndeletes++;
		s3_go(p, x, S3_DELETE, key, 0);
	}
	if (p->idle && !p->reads && !p->compacting && !p->fills && s3_queue_empty(p->d)) {
		struct s3_xfer *x = take_idle(p);

		if (!s3_start_compaction(p, x)) {
			x->next = p->idle;
			p->idle = x;
		}
	}
	return wait;
}

/*
 * The device is driven hard while the engine holds requests it has no
 * handle for: reads waiting, or objects ready to go. (Its depth is large,
 * so its queue is rarely where they wait.)
 */
static void s3_backlog(struct s3_priv *p, uint64_t now)
{
	unsigned n = 0;
	uint64_t wait = UINT64_MAX;

	for (struct tb_io *r = p->reads; r; r = r->next)
		n++;
	pthread_mutex_lock(&p->d->lock);
	if (!p->idle)
		for (struct s3_fill *f = p->fills; f; f = f->next)
			n += s3_fill_ready(p, f, now, &wait);
	if (n != p->d->backlog) {
		dev_load_tick(p->d, now);
		p->d->backlog = n;
	}
	pthread_mutex_unlock(&p->d->lock);
}

/* Take what the queue allows: reads wait for a handle, writes for their object. */
static void s3_take(struct s3_priv *p, uint64_t now)
{
	struct tb_io *batch[S3_TAKE_MAX];
	unsigned n = dev_take(p->d, batch, S3_TAKE_MAX);

	for (unsigned i = 0; i < n; i++) {
		struct tb_io *r = batch[i];

		r->next = NULL;
		if (r->op == IO_READ) {
			if (p->reads_tail)
				p->reads_tail->next = r;
			else
				p->reads = r;
			p->reads_tail = r;
		} else if (!p->pack) {
			if (p->writes_tail)
				p->writes_tail->next = r;
			else
				p->writes = r;
			p->writes_tail = r;
		} else {
			s3_fill_add(p, r, now);
		}
	}
}

static bool s3_dev_down(struct tb_dev *d)
{
	bool down;

	pthread_mutex_lock(&d->lock);
	down = d->health == DEV_DOWN;
	pthread_mutex_unlock(&d->lock);
	return down;
}

/*
 * Attempts that find no server at all take the device down at once, without
 * waiting for requests to run out of time: writes then go elsewhere and
 * stop holding connections that reads need.
 */
static void s3_count_no_server(struct s3_priv *p, struct s3_xfer *x)
{
	if (x->code != CURLE_COULDNT_CONNECT && x->code != CURLE_COULDNT_RESOLVE_HOST) {
		if (x->code == CURLE_OK)
			p->no_server = 0;
		return;
	}
	if (++p->no_server == S3_DOWN_AFTER_NO_SERVER)
		dev_set_health(p->d, false);
}

/* An attempt of a request ended: finish it, or put it in backoff. */
static void s3_attempt_done(struct s3_priv *p, struct s3_xfer *x)
{
	enum s3_verdict v;
	uint64_t now, wait;
	int err;

	s3_count_no_server(p, x);
	if (x == &p->probe) {
		p->probing = false;
		if (s3_judge(x, &err) == S3_DONE)
			dev_set_health(p->d, true);
		return;
	}
	/* Test builds: an attempt answered as by an overloaded server. */
	if (fault_inject(p->d->name, FAULT_S3_ATTEMPT, x->slot) == -EAGAIN) {
		x->code = CURLE_RECV_ERROR;
		snprintf(x->curl_err, sizeof(x->curl_err), "injected fault: HTTP 503");
	}
	v = s3_judge(x, &err);
	if (v == S3_DONE) {
		s3_complete(p, x, (long)x->len);
		return;
	}
	/* While down, a write goes elsewhere sooner than it would here. */
	if (v == S3_RETRY && !(x->method == S3_PUT && s3_dev_down(p->d))) {
		now = dev_now_ns();
		wait = s3_backoff_ns(p, x->attempts);
		if (now + wait < x->deadline_ns) {
			pthread_mutex_lock(&p->d->lock);
			p->d->retries++;
			pthread_mutex_unlock(&p->d->lock);
			x->retry_ns = now + wait;
			x->next = p->backoff;
			p->backoff = x;
			return;
		}
	}
	s3_complete(p, x, err);
}

/* Reap finished attempts; returns how many. */
static unsigned s3_reap(struct s3_priv *p)
{
	unsigned n = 0;
	CURLMsg *m;
	int left;

	while ((m = curl_multi_info_read(p->multi, &left))) {
		struct s3_xfer *x;
		char *priv = NULL;

		if (m->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
		x = (struct s3_xfer *)priv;
		x->code = m->data.result;
		curl_multi_remove_handle(p->multi, x->easy);
		s3_attempt_done(p, x);
		n++;
	}
	return n;
}

/* Start the attempts whose backoff is over; returns ns to the next one. */
static uint64_t s3_retry_due(struct s3_priv *p, uint64_t now)
{
	struct s3_xfer **pp = &p->backoff;
	uint64_t next = UINT64_MAX;

	while (*pp) {
		struct s3_xfer *x = *pp;

		if (x->retry_ns > now) {
			if (x->retry_ns - now < next)
				next = x->retry_ns - now;
			pp = &x->next;
			continue;
		}
		*pp = x->next;
		s3_launch(p, x);
	}
	return next;
}

/* While the device is down, HEAD the identity object every probe interval. */
static uint64_t s3_probe_due(struct s3_priv *p, uint64_t now)
{
	struct s3_xfer *x = &p->probe;
	uint64_t limit =
	    p->timeout_ns < S3_PROBE_INTERVAL_NS ? p->timeout_ns : S3_PROBE_INTERVAL_NS;

	if (p->probing || !s3_dev_down(p->d))
		return UINT64_MAX;
	if (now < p->next_probe_ns)
		return p->next_probe_ns - now;
	p->next_probe_ns = now + S3_PROBE_INTERVAL_NS;
	if (s3_xfer_set(x, S3_HEAD, S3_ID_OBJ, NULL, NULL, 0) < 0)
		return S3_PROBE_INTERVAL_NS;
	x->deadline_ns = now + limit;
	p->probing = true;
	s3_launch(p, x);
	return S3_PROBE_INTERVAL_NS;
}

/*
 * Stopping, and nothing queued, in flight, held, in backoff or probing;
 * deletes are done first while the bucket answers, so that an unmount
 * leaves no dead object behind.
 */
static bool s3_finished(struct s3_priv *p)
{
	struct tb_dev *d = p->d;
	unsigned idle = 0;
	bool done;

	for (struct s3_xfer *x = p->idle; x; x = x->next)
		idle++;
	pthread_mutex_lock(&d->lock);
	done = d->stopping && !p->probing && idle == p->nx && (!p->dels || d->health == DEV_DOWN);
	for (int c = 0; c < IO_NCLASS; c++)
		if (d->head[c] || d->inflight[c])
			done = false;
	pthread_mutex_unlock(&d->lock);
	return done;
}

static void *s3_thread(void *arg)
{
	struct s3_priv *p = arg;
	struct tb_dev *d = p->d;

	dev_name_thread(d);
	while (!s3_finished(p)) {
		struct curl_waitfd wfd = {d->wake_efd, CURL_WAIT_POLLIN, 0};
		uint64_t now = dev_now_ns(), wait_ns, t;
		int running, nfds;

		wait_ns = s3_retry_due(p, now);
		t = s3_probe_due(p, now);
		wait_ns = t < wait_ns ? t : wait_ns;
		s3_take(p, now);
		t = s3_dispatch(p, now);
		wait_ns = t < wait_ns ? t : wait_ns;
		s3_backlog(p, now);
		t = dev_throttle_ns(d);
		if (t && t < wait_ns)
			wait_ns = t;
		curl_multi_perform(p->multi, &running);
		if (s3_reap(p))
			continue; /* handles came free: take more before waiting */
		t = wait_ns / NS_PER_MS + 1;
		curl_multi_poll(p->multi, &wfd, 1, t < S3_POLL_MAX_MS ? (int)t : S3_POLL_MAX_MS,
				&nfds);
		if (wfd.revents)
			dev_drain_efd(d->wake_efd);
	}
	return NULL;
}

/* ---- listing at start ---- */

/* Percent-encode everything but RFC 3986 unreserved characters: a query value. */
static int query_encode(char *out, size_t outlen, const char *in)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (const unsigned char *c = (const unsigned char *)in; *c; c++) {
		bool plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
			     (*c >= '0' && *c <= '9') || strchr("-._~", *c);

		if (o + (plain ? 1 : 3) >= outlen)
			return -ENAMETOOLONG;
		if (plain) {
			out[o++] = (char)*c;
		} else {
			out[o++] = '%';
			out[o++] = hex[*c >> 4];
			out[o++] = hex[*c & 0xf];
		}
	}
	out[o] = 0;
	return 0;
}

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
	if (!body || query_encode(prefix, sizeof(prefix), raw) < 0) {
		free(body);
		return body ? -ENAMETOOLONG : -ENOMEM;
	}
	do {
		/* Sorted by name, as SigV4 wants and libcurl 7.88 does not do. */
		etoken[0] = 0;
		if (token[0] && query_encode(etoken, sizeof(etoken), token) < 0) {
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

static int s3_start(struct tb_dev *d)
{
	struct s3_priv *p = d->priv;

	if (p->pack) {
		int ret = s3_sweep(p);

		if (ret)
			return ret;
		/* Compaction's buffer, made now: memory does not grow in a long run. */
		p->compact_buf = malloc(p->pack * d->block_size);
		if (!p->compact_buf)
			return -ENOMEM;
		memset(p->compact_buf, 0, p->pack * d->block_size);
	}
	return -pthread_create(&p->thread, NULL, s3_thread, p);
}

static void s3_stop(struct tb_dev *d)
{
	struct s3_priv *p = d->priv;

	pthread_join(p->thread, NULL);
}

static void s3_xfer_fini(struct s3_priv *p, struct s3_xfer *x)
{
	if (!x->easy)
		return;
	if (p->multi)
		curl_multi_remove_handle(p->multi, x->easy);
	curl_easy_cleanup(x->easy);
	s3_xfer_reset(x);
	x->easy = NULL;
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
	d->priv = NULL;
}

static const struct dev_engine s3_engine = {
    .name = "libcurl",
    .start = s3_start,
    .stop = s3_stop,
    .fini = s3_fini,
    .bind = s3_bind,
};

/* A tier that packs slots into objects manages its slots by object. */
static const struct dev_engine s3_packed_engine = {
    .name = "libcurl",
    .start = s3_start,
    .stop = s3_stop,
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
	sha256_hex("", 0, p->empty_sha);
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
