/*
 * s3_int.h - what the s3 tier's files share, and nothing outside them
 * includes: the transfer, held-write, delete and device structures, and the
 * calls that cross between s3.c (the device: open, identity, slots, the
 * listing at start), s3io.c (the engine thread: objects written whole, read
 * by ranges, deleted and compacted) and s3http.c (one signed request on one
 * libcurl easy handle, judged and retried). Calls go one way: s3.c to s3io.c
 * and s3http.c, s3io.c to s3http.c.
 */
#ifndef TFS_S3_INT_H
#define TFS_S3_INT_H

#include "dev.h"
#include "s3obj.h"

#include <curl/curl.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* 7.87 takes the payload hash from our x-amz-content-sha256 header. */
#if LIBCURL_VERSION_NUM < 0x075700
#error "the s3 tier needs libcurl 7.87 or newer"
#endif

#define S3_URL_MAX 2048
#define S3_KEY_MAX 1024
#define S3_ERR_BODY_MAX 1024 /* start of an error answer, kept for its <Code> */
#define S3_ID_OBJ "tensorfs.dev"
#define S3_PK_DIR "pk/" /* packed objects */
#define SHA256_HEX_LEN (2 * SHA256_DIGEST_LENGTH)
#define NS_PER_MS 1000000ULL

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
	uint64_t deadline_ns;	/* no attempt starts, or runs, past this */
	uint64_t retry_ns;	/* in backoff: when to try again */
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
	unsigned no_server;		    /* attempts in a row that could not connect */
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
};

/* s3http.c: names, URLs and one transfer. */
int s3_base_url(struct s3_priv *p, const struct tb_s3_config *cfg, char *err, size_t errlen);
int s3_keydir(struct s3_priv *p, const char *prefix, const char *store_id);
void s3_error_code(const struct s3_xfer *x, char *code, size_t len);
void s3_describe(const struct s3_xfer *x, char *buf, size_t len);
int s3_xfer_init(struct s3_priv *p, struct s3_xfer *x, const struct tb_s3_config *cfg);
void s3_xfer_reset(struct s3_xfer *x);
int s3_xfer_aim(struct s3_xfer *x, enum s3_method m, const char *key, size_t off);
int s3_xfer_set(struct s3_xfer *x, enum s3_method m, const char *key, const void *body, void *dst,
		size_t len);
void s3_attempt_prepare(struct s3_xfer *x, uint64_t now);
enum s3_verdict s3_judge(struct s3_xfer *x, int *err);
uint64_t s3_backoff_ns(struct s3_priv *p, unsigned attempts);
enum s3_verdict s3_perform(struct s3_xfer *x, int *err);
void s3_xfer_fini(struct s3_priv *p, struct s3_xfer *x);
void s3_sha256_hex(const void *buf, size_t len, char out[SHA256_HEX_LEN + 1]);

/* s3io.c: the engine. d->lock held for all but s3_thread. */
void s3_counters(struct s3_priv *p);
void s3_del_queue(struct s3_priv *p, const struct s3obj_version *v);
void s3_todo(struct s3_priv *p, uint64_t objno, enum s3obj_todo todo);
void *s3_thread(void *arg); /* arg: the device */

/* Percent-encoding for a URL path (keep_slash) or a query value (s3http.c). */
int s3_uri_encode(char *out, size_t outlen, const char *in, bool keep_slash);

#endif
