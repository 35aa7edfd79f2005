/*
 * s3.c - the s3 device: blocks as objects in an S3 bucket, moved by libcurl.
 *
 * Slot n is the object <prefix>/<store id>/blk/<n as 16 hex digits>, written
 * whole by PUT and read by a ranged GET; the store id keeps the stores of
 * many nodes apart in one bucket, and <prefix>/<store id>/tensorfs.dev binds
 * the keys to the store and the device position. Freed slots are not
 * deleted: the next write of a slot overwrites its object. One thread runs a
 * libcurl multi handle over a fixed pool of easy handles (connections are
 * reused); libcurl signs with SigV4. A 5xx, 429 or 408 answer, a timeout or
 * a connection error is retried with exponential backoff and jitter until
 * timeout_ms after the request was taken, then fails with EIO. While the
 * device is down, writes get one try (the flusher places them elsewhere) and
 * a HEAD every two seconds tells when it is back. A completed PUT is durable.
 */
#include "dev.h"
#include "fault.h"
#include "log.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
#define S3_BLK_DIR "blk/"
#define S3_ID_MAX 160 /* the one line of tensorfs.dev */
#define S3_BACKOFF_MIN_MS 50
#define S3_BACKOFF_MAX_MS 2000
#define S3_CONNECT_TIMEOUT_MS 3000 /* per attempt, so a lost SYN is tried again */
#define S3_PROBE_INTERVAL_NS 2000000000ULL
#define S3_POLL_MAX_MS 1000
#define S3_RECV_BUFFER (512L << 10)
#define S3_SEND_BUFFER (1L << 20)
#define S3_LOG_INTERVAL_S 10
#define S3_DOWN_AFTER_NO_SERVER 3 /* attempts in a row that found no server */
#define S3_TAKE_MAX 64		  /* requests taken at once, at most one per idle handle */
#define XORSHIFT64_MULT 2685821657736338717ULL
#define SHA256_HEX_LEN (2 * SHA256_DIGEST_LENGTH)
#define NS_PER_MS 1000000ULL
#define NS_PER_SEC 1000000000ULL

enum s3_method { S3_GET, S3_PUT, S3_HEAD, S3_DELETE };

/* What to do after one attempt. */
enum s3_verdict { S3_DONE, S3_RETRY, S3_FAILED };

struct s3_priv;

/* One easy handle and the request it carries. */
struct s3_xfer {
	struct s3_priv *p;
	CURL *easy;
	struct curl_slist *hdrs;
	enum s3_method method;
	struct tb_io *r;  /* NULL for the probe and the checks at open */
	const char *body; /* PUT: what to send */
	char *dst;	  /* GET: where the body goes */
	size_t len;	  /* bytes to send, or the length of the body to receive */
	bool exact;	  /* GET: a body of another length than len is an error */
	size_t pos;	  /* sent or received in this attempt */
	bool overflow;	  /* a GET body longer than len */
	long status;	  /* HTTP status of this attempt */
	CURLcode code;	  /* libcurl's result of this attempt */
	unsigned attempts;
	uint64_t deadline_ns; /* no attempt starts, or runs, past this */
	uint64_t retry_ns;    /* in backoff: when to try again */
	struct s3_xfer *next; /* on the idle list or the backoff list */
	char url[S3_URL_MAX];
	char err_body[S3_ERR_BODY_MAX];
	size_t err_len;
	char curl_err[CURL_ERROR_SIZE];
};

struct s3_priv {
	struct tb_dev *d;
	CURLM *multi;
	char sigv4[96];		 /* "aws:amz:<region>:s3" */
	char base[S3_URL_MAX];	 /* URL of the bucket, no trailing slash */
	char keydir[S3_KEY_MAX]; /* "<prefix>/<store id>/", URI-encoded */
	char endpoint[S3_URL_MAX];
	char bucket[256];
	bool https;
	char empty_sha[SHA256_HEX_LEN + 1];
	char *token_hdr; /* "x-amz-security-token: ..." or NULL */
	uint64_t timeout_ns;
	/* Owned by the engine thread once it runs. */
	unsigned nx;
	struct s3_xfer *xfers; /* the pool */
	struct s3_xfer *idle;
	struct s3_xfer *backoff;
	struct s3_xfer probe; /* health probe, and the checks at open */
	bool probing;
	uint64_t next_probe_ns;
	unsigned no_server; /* attempts in a row that could not connect */
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
	char raw[S3_KEY_MAX];
	size_t plen;

	prefix = prefix ? prefix : "";
	while (*prefix == '/')
		prefix++;
	plen = strlen(prefix);
	while (plen && prefix[plen - 1] == '/')
		plen--;
	if (snprintf(raw, sizeof(raw), "%.*s%s%s/", (int)plen, prefix, plen ? "/" : "", store_id) >=
	    (int)sizeof(raw))
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

static size_t s3_recv(char *data, size_t size, size_t n, void *arg)
{
	struct s3_xfer *x = arg;
	size_t bytes = size * n;

	if (!x->status)
		curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
	if (x->method == S3_GET && x->status / 100 == 2) {
		size_t take = bytes < x->len - x->pos ? bytes : x->len - x->pos;

		memcpy(x->dst + x->pos, data, take);
		x->pos += take;
		if (take < bytes)
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
	size_t take = size * n < x->len - x->pos ? size * n : x->len - x->pos;

	memcpy(out, x->body + x->pos, take);
	x->pos += take;
	return take;
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
	x->r = NULL;
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

/*
 * Aim x at key (below the store's key folder) with a method and a body, and
 * sign the payload: its SHA-256 over plain http, UNSIGNED-PAYLOAD over TLS.
 * The deadline is the caller's. We send no query string: libcurl 7.88 signs
 * one verbatim, so it would have to be sorted and encoded already.
 */
static int s3_xfer_set(struct s3_xfer *x, enum s3_method m, const char *key, const void *body,
		       void *dst, size_t len)
{
	struct s3_priv *p = x->p;
	char hdr[S3_URL_MAX], sha[SHA256_HEX_LEN + 1];
	struct curl_slist *h;

	s3_xfer_reset(x);
	x->method = m;
	x->body = body;
	x->dst = dst;
	x->len = len;
	x->exact = true;
	x->attempts = 0;
	if (snprintf(x->url, sizeof(x->url), "%s/%s%s", p->base, p->keydir, key) >=
	    (int)sizeof(x->url))
		return -ENAMETOOLONG;
	if (p->https)
		snprintf(sha, sizeof(sha), "UNSIGNED-PAYLOAD");
	else if (m == S3_PUT)
		sha256_hex(body, len, sha);
	else
		memcpy(sha, p->empty_sha, sizeof(sha));
	/* No "Expect:" to turn 100-continue off: libcurl 7.88 would sign it empty. */
	snprintf(hdr, sizeof(hdr), "x-amz-content-sha256: %s", sha);
	h = curl_slist_append(NULL, hdr);
	if (m == S3_GET) {
		snprintf(hdr, sizeof(hdr), "Range: bytes=0-%zu", len - 1);
		h = slist_add(h, hdr);
	}
	if (p->token_hdr)
		h = slist_add(h, p->token_hdr);
	x->hdrs = h;
	return h ? 0 : -ENOMEM;
}

/* Options of the next attempt: method, headers, and the time left. */
static void s3_attempt_prepare(struct s3_xfer *x, uint64_t now)
{
	CURL *e = x->easy;
	long left_ms = x->deadline_ns > now ? (long)((x->deadline_ns - now) / NS_PER_MS) : 0;

	if (left_ms < 1)
		left_ms = 1;
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
 * Bind the key folder to this store and this device position, or check
 * that it already is: block locations name devices by position.
 */
static int s3_check_identity(struct s3_priv *p, const char *store_id, char *err, size_t errlen)
{
	struct s3_xfer *x = &p->probe;
	char body[S3_ID_MAX], id[64] = "", kind[16] = "", code[64];
	unsigned idx = 0;
	int ret, e;

	ret = s3_xfer_set(x, S3_GET, S3_ID_OBJ, NULL, body, sizeof(body) - 1);
	if (ret)
		return ret;
	x->exact = false; /* one line, shorter than the range asked for */
	if (s3_perform(x, &e) == S3_DONE) {
		body[x->pos] = 0;
		if (sscanf(body, "tensorfs-dev store=%63s index=%u kind=%15s", id, &idx, kind) <
		    3) {
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
		return 0;
	}
	s3_error_code(x, code, sizeof(code));
	if (x->code != CURLE_OK || x->status != 404 || strcmp(code, "NoSuchKey") != 0)
		return s3_open_error(p, x, "reading " S3_ID_OBJ, err, errlen);
	snprintf(body, sizeof(body), "tensorfs-dev store=%s index=%u kind=s3\n", store_id,
		 p->d->index);
	ret = s3_xfer_set(x, S3_PUT, S3_ID_OBJ, body, NULL, strlen(body));
	if (ret)
		return ret;
	if (s3_perform(x, &e) != S3_DONE)
		return s3_open_error(p, x, "writing " S3_ID_OBJ, err, errlen);
	log_info("%s: new store key folder %s in s3 bucket %s", p->d->name, p->keydir, p->bucket);
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

/* ---- the engine ---- */

static void s3_log_failure(struct s3_priv *p, struct s3_xfer *x)
{
	char why[CURL_ERROR_SIZE + 64];

	if (!log_ratelimit(&p->err_log_sec[x->method == S3_GET], S3_LOG_INTERVAL_S))
		return;
	s3_describe(x, why, sizeof(why));
	log_err("%s: %s of slot %llu failed after %u attempt%s: %s", p->d->name,
		x->method == S3_GET ? "GET" : "PUT", (unsigned long long)x->r->slot, x->attempts,
		x->attempts == 1 ? "" : "s", why);
}

/* The request on x ended with res (its length, or -errno). */
static void s3_complete(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_io *r = x->r;

	if (res < 0)
		s3_log_failure(p, x);
	s3_xfer_reset(x);
	x->next = p->idle;
	p->idle = x;
	if (dev_finish(p->d, r, res))
		dev_requeue(p->d, r); /* cannot happen: a transfer is whole or failed */
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

/* Take what the queue allows onto idle handles and start it. */
static void s3_take(struct s3_priv *p)
{
	struct tb_io *batch[S3_TAKE_MAX];
	unsigned nidle = 0, n;

	for (struct s3_xfer *x = p->idle; x; x = x->next)
		nidle++;
	if (nidle > S3_TAKE_MAX)
		nidle = S3_TAKE_MAX;
	n = nidle ? dev_take(p->d, batch, nidle) : 0;
	for (unsigned i = 0; i < n; i++) {
		struct tb_io *r = batch[i];
		struct s3_xfer *x = p->idle;
		char key[sizeof(S3_BLK_DIR) + 16];
		int ret;

		p->idle = x->next;
		snprintf(key, sizeof(key), S3_BLK_DIR "%016llx", (unsigned long long)r->slot);
		ret = r->op == IO_READ ? s3_xfer_set(x, S3_GET, key, NULL, r->buf, r->len)
				       : s3_xfer_set(x, S3_PUT, key, r->buf, NULL, r->len);
		x->r = r;
		if (ret < 0) {
			snprintf(x->curl_err, sizeof(x->curl_err), "%s", strerror(-ret));
			x->code = CURLE_OUT_OF_MEMORY;
			s3_complete(p, x, ret);
			continue;
		}
		x->deadline_ns = r->start_ns + p->timeout_ns;
		s3_launch(p, x);
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
	if (fault_inject(p->d->name, FAULT_S3_ATTEMPT, x->r->slot) == -EAGAIN) {
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

/* Stopping, and nothing queued, in flight, in backoff or probing. */
static bool s3_finished(struct s3_priv *p)
{
	struct tb_dev *d = p->d;
	bool done;

	pthread_mutex_lock(&d->lock);
	done = d->stopping && !p->probing;
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
		s3_take(p);
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

static int s3_start(struct tb_dev *d)
{
	struct s3_priv *p = d->priv;

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
	free(p->xfers);
	free(p);
	d->priv = NULL;
}

static const struct dev_engine s3_engine = {
    .name = "libcurl",
    .start = s3_start,
    .stop = s3_stop,
    .fini = s3_fini,
};

/* Everything but the network: names, handles, the pool. */
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
	p->nx = cfg->connections ? cfg->connections : 1;
	p->xfers = calloc(p->nx, sizeof(*p->xfers));
	if (!p->multi || !p->xfers)
		return -ENOMEM;
	curl_multi_setopt(p->multi, CURLMOPT_MAXCONNECTS, (long)p->nx + 1);
	ret = s3_xfer_init(p, &p->probe, cfg);
	for (unsigned i = 0; i < p->nx && !ret; i++) {
		ret = s3_xfer_init(p, &p->xfers[i], cfg);
		p->xfers[i].next = p->idle;
		p->idle = &p->xfers[i];
	}
	if (ret)
		snprintf(err, errlen, "s3: this libcurl cannot sign requests (SigV4): %s",
			 strerror(-ret));
	return ret;
}

int dev_open_s3(struct tb_dev **out, unsigned index, const struct tb_s3_config *cfg,
		const char *store_id, size_t block_size, unsigned queue_depth, uint64_t bw_cap,
		uint64_t cap_bytes, const struct dram_arena *arena, char *err, size_t errlen)
{
	struct tb_dev *d;
	uint64_t nslots;
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
	ret = s3_check_identity(d->priv, store_id, err, errlen);
	if (ret)
		goto fail;
	ret = s3_check_write(d->priv, err, errlen);
	if (ret)
		goto fail;
	nslots = (cap_bytes ? cap_bytes : S3_DEFAULT_CAPACITY) / block_size;
	if (nslots == 0) {
		snprintf(err, errlen, "s3 bucket %s: remote_cap is below one block", cfg->bucket);
		ret = -EINVAL;
		goto fail;
	}
	ret = slot_alloc_init(&d->alloc, nslots);
	if (ret) {
		snprintf(err, errlen, "s3 bucket %s: no memory for %llu slots", cfg->bucket,
			 (unsigned long long)nslots);
		goto fail;
	}
	log_info("%s: %s, %u connections, timeout %u ms", d->name, d->where,
		 ((struct s3_priv *)d->priv)->nx, cfg->timeout_ms);
	*out = d;
	return 0;
fail:
	dev_close(d);
	return ret;
}
