/*
 * s3http.c - one request to the bucket on one libcurl easy handle: the
 * bucket's URL and the key folder, percent-encoding, the body sent from and
 * received into the blocks of the requests it carries, SigV4 signing by
 * libcurl (the payload hashed over plain http), and the verdict on each
 * attempt. A 5xx, 429 or 408 answer, a timeout or a connection error is
 * retried with exponential backoff and jitter until the request's deadline
 * (timeout_ms after it was taken), then fails with EIO. s3_perform runs a
 * request to its end on the calling thread (at open); the engine (s3io.c)
 * runs many at once on its multi handle.
 */
#include "s3_int.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define S3_BACKOFF_MIN_MS 50
#define S3_BACKOFF_MAX_MS 2000
#define S3_CONNECT_TIMEOUT_MS 3000 /* per attempt, so a lost SYN is tried again */
#define S3_RECV_BUFFER (512L << 10)
#define S3_SEND_BUFFER (256L << 10)
#define XORSHIFT64_MULT 2685821657736338717ULL
#define NS_PER_SEC 1000000000ULL

/* ---- names, URLs and hashes ---- */

/*
 * Percent-encode all but RFC 3986 unreserved characters, and '/' where
 * keep_slash (a path; a query value encodes it too).
 */
int s3_uri_encode(char *out, size_t outlen, const char *in, bool keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (const unsigned char *c = (const unsigned char *)in; *c; c++) {
		bool plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
			     (*c >= '0' && *c <= '9') || strchr("-._~", *c) ||
			     (keep_slash && *c == '/');

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

void s3_sha256_hex(const void *buf, size_t len, char out[SHA256_HEX_LEN + 1])
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
int s3_base_url(struct s3_priv *p, const struct tb_s3_config *cfg, char *err, size_t errlen)
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
	if (s3_uri_encode(bucket, sizeof(bucket), cfg->bucket, true) < 0 || strchr(cfg->bucket, '/')) {
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
int s3_keydir(struct s3_priv *p, const char *prefix, const char *store_id)
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
	return s3_uri_encode(p->keydir, sizeof(p->keydir), raw, true);
}

/* The S3 error code of an error answer (its <Code> element), or "". */
void s3_error_code(const struct s3_xfer *x, char *code, size_t len)
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
void s3_describe(const struct s3_xfer *x, char *buf, size_t len)
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

int s3_xfer_init(struct s3_priv *p, struct s3_xfer *x, const struct tb_s3_config *cfg)
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

void s3_xfer_reset(struct s3_xfer *x)
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
int s3_xfer_aim(struct s3_xfer *x, enum s3_method m, const char *key, size_t off)
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
int s3_xfer_set(struct s3_xfer *x, enum s3_method m, const char *key, const void *body, void *dst,
		size_t len)
{
	s3_xfer_reset(x);
	x->job = S3_JOB_CHECK;
	x->body = body;
	x->dst = dst;
	x->len = len;
	return s3_xfer_aim(x, m, key, 0);
}

/* Options of the next attempt: method, headers, and the time left. */
void s3_attempt_prepare(struct s3_xfer *x, uint64_t now)
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
enum s3_verdict s3_judge(struct s3_xfer *x, int *err)
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
uint64_t s3_backoff_ns(struct s3_priv *p, unsigned attempts)
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
enum s3_verdict s3_perform(struct s3_xfer *x, int *err)
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

void s3_xfer_fini(struct s3_priv *p, struct s3_xfer *x)
{
	if (!x->easy)
		return;
	if (p->multi)
		curl_multi_remove_handle(p->multi, x->easy);
	curl_easy_cleanup(x->easy);
	s3_xfer_reset(x);
	x->easy = NULL;
}
