/*
 * fault.c - fault injection for tests (see fault.h for the rule syntax).
 *
 * Built only with -Dfault_injection=true. The devices ask fault_inject
 * before they start a request, before a device flush, and (s3) after each
 * HTTP attempt; the answer fails the request, delays it, or lets it be.
 * Rules keep their own counters and random state under one lock, so a run
 * with a given seed injects the same faults into the same sequence of
 * requests. The rules of TENSORFS_FAULT_FILE are replaced whenever the file
 * changes (another inode, size or mtime), which a test does by renaming a
 * new file over it; their counters start again from zero.
 */
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define FAULT_MAX_RULES 16
#define FAULT_FILE_MAX 4096 /* bytes of rules read from the file */
#define FAULT_DEFAULT_MS 100
#define FAULT_MAX_MS 60000
#define FAULT_DEV_MAX 16
#define XORSHIFT64_MULT 2685821657736338717ULL
#define SEED_MIX 0x9e3779b97f4a7c15ULL

enum fault_kind { FK_ERRNO, FK_DELAY, FK_503 };

struct fault_rule {
	char dev[FAULT_DEV_MAX]; /* "" for every device */
	unsigned ops;		 /* bits 1 << enum fault_point */
	enum fault_kind kind;
	int err; /* FK_ERRNO: the errno to fail with */
	double rate;
	uint64_t after, count, ms;
	uint64_t rng;
	uint64_t seen, injected;
};

struct fault_set {
	struct fault_rule rule[FAULT_MAX_RULES];
	unsigned n;
};

static struct {
	pthread_mutex_t lock;  /* guards everything below */
	struct fault_set env;  /* from TENSORFS_FAULT, for the daemon's life */
	struct fault_set file; /* from TENSORFS_FAULT_FILE, as the file says now */
	char *path;
	bool have_file;
	struct stat file_st; /* what was read last: ino, size, mtime */
	uint64_t total;
} F = {.lock = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_result;

static const struct {
	const char *name;
	int err;
} errnames[] = {{"EIO", EIO}, {"ENOSPC", ENOSPC}, {"ETIMEDOUT", ETIMEDOUT}};

static const char *const point_names[] = {"read", "write", "sync", "attempt", "turn", "block"};

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!*s || *s == '-')
		return -EINVAL;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

static int parse_pair(struct fault_rule *r, const char *key, const char *val, char *err,
		      size_t errlen)
{
	char *end;

	if (strcmp(key, "dev") == 0) {
		if (strlen(val) >= FAULT_DEV_MAX)
			goto bad;
		snprintf(r->dev, sizeof(r->dev), "%s", strcmp(val, "*") ? val : "");
	} else if (strcmp(key, "op") == 0) {
		if (strcmp(val, "read") == 0)
			r->ops = 1u << FAULT_READ;
		else if (strcmp(val, "write") == 0)
			r->ops = 1u << FAULT_WRITE;
		else if (strcmp(val, "sync") == 0)
			r->ops = 1u << FAULT_SYNC;
		else if (strcmp(val, "flusher") == 0)
			r->ops = 1u << FAULT_FLUSHER;
		else if (strcmp(val, "prefetch") == 0)
			r->ops = 1u << FAULT_PREFETCH;
		else if (strcmp(val, "any") == 0)
			r->ops = 1u << FAULT_READ | 1u << FAULT_WRITE | 1u << FAULT_SYNC;
		else
			goto bad;
	} else if (strcmp(key, "err") == 0) {
		r->kind = FK_ERRNO;
		r->err = 0;
		if (strcasecmp(val, "delay") == 0)
			r->kind = FK_DELAY;
		else if (strcmp(val, "503") == 0)
			r->kind = FK_503;
		for (size_t i = 0; i < sizeof(errnames) / sizeof(errnames[0]); i++)
			if (strcasecmp(val, errnames[i].name) == 0)
				r->err = errnames[i].err;
		if (r->kind == FK_ERRNO && !r->err)
			goto bad;
	} else if (strcmp(key, "rate") == 0) {
		errno = 0;
		r->rate = strtod(val, &end);
		if (errno || end == val || *end || !(r->rate >= 0 && r->rate <= 1))
			goto bad;
	} else if (strcmp(key, "after") == 0) {
		if (parse_u64(val, &r->after))
			goto bad;
	} else if (strcmp(key, "count") == 0) {
		if (parse_u64(val, &r->count))
			goto bad;
	} else if (strcmp(key, "ms") == 0) {
		if (parse_u64(val, &r->ms) || r->ms > FAULT_MAX_MS)
			goto bad;
	} else if (strcmp(key, "seed") == 0) {
		if (parse_u64(val, &r->rng))
			goto bad;
		r->rng = r->rng * SEED_MIX + 1;
	} else {
		snprintf(err, errlen, "unknown key '%s'", key);
		return -EINVAL;
	}
	return 0;
bad:
	snprintf(err, errlen, "bad %s='%s'", key, val);
	return -EINVAL;
}

/* One rule: key=value pairs separated by commas, in place. */
static int parse_rule(struct fault_rule *r, char *text, char *err, size_t errlen)
{
	char *save = NULL;
	bool has_err = false;

	*r = (struct fault_rule){.ops = 1u << FAULT_READ | 1u << FAULT_WRITE | 1u << FAULT_SYNC,
				 .rate = 1,
				 .ms = FAULT_DEFAULT_MS,
				 .rng = SEED_MIX + 1};
	for (char *kv = strtok_r(text, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '=');

		kv += strspn(kv, " \t");
		if (!eq) {
			snprintf(err, errlen, "'%s' is not key=value", kv);
			return -EINVAL;
		}
		*eq = 0;
		for (char *e = eq - 1; e >= kv && (*e == ' ' || *e == '\t'); e--)
			*e = 0;
		for (char *e = eq + strlen(eq + 1); e > eq && *e && strchr(" \t\r", *e); e--)
			*e = 0;
		if (parse_pair(r, kv, eq + 1 + strspn(eq + 1, " \t"), err, errlen))
			return -EINVAL;
		has_err |= strcmp(kv, "err") == 0;
	}
	if (!has_err) {
		snprintf(err, errlen, "a rule needs err=");
		return -EINVAL;
	}
	/* A 503 is an answer to an HTTP attempt: it means nothing elsewhere. */
	if (r->kind == FK_503)
		r->ops = 1u << FAULT_S3_ATTEMPT;
	return 0;
}

/* Rules separated by ';' or new lines; '#' comments to the end of a line. */
static int parse_set(const char *spec, struct fault_set *set, char *err, size_t errlen)
{
	char *buf = strdup(spec), *save = NULL;
	int ret = 0;

	set->n = 0;
	if (!buf)
		return -ENOMEM;
	for (char *c = strchr(buf, '#'); c; c = strchr(c, '#')) {
		size_t n = strcspn(c, "\n");

		memset(c, ' ', n);
	}
	for (char *t = strtok_r(buf, ";\n", &save); t && !ret; t = strtok_r(NULL, ";\n", &save)) {
		if (t[strspn(t, " \t\r")] == 0)
			continue;
		if (set->n == FAULT_MAX_RULES) {
			snprintf(err, errlen, "more than %d rules", FAULT_MAX_RULES);
			ret = -EINVAL;
			break;
		}
		ret = parse_rule(&set->rule[set->n], t, err, errlen);
		if (!ret)
			set->n++;
	}
	free(buf);
	return ret;
}

int fault_parse(const char *spec, char *err, size_t errlen)
{
	struct fault_set *set = malloc(sizeof(*set));
	int ret;

	if (!set)
		return -ENOMEM;
	ret = parse_set(spec, set, err, errlen);
	ret = ret ? ret : (int)set->n;
	free(set);
	return ret;
}

static void init(void)
{
	const char *spec = getenv("TENSORFS_FAULT");
	const char *path = getenv("TENSORFS_FAULT_FILE");
	char err[256] = "";

	if (spec && *spec) {
		init_result = parse_set(spec, &F.env, err, sizeof(err));
		if (init_result)
			log_err("fault injection: TENSORFS_FAULT: %s", err);
		else
			log_info("fault injection: %u rule(s) from TENSORFS_FAULT", F.env.n);
	}
	if (path && *path) {
		F.path = strdup(path);
		log_info("fault injection: rules from %s while it exists", path);
	}
}

int fault_init(void)
{
	pthread_once(&init_once, init);
	return init_result;
}

/* Read the rule file again if it changed since the last look. Lock held. */
static void reload_file(void)
{
	struct fault_set *set = &F.file;
	char buf[FAULT_FILE_MAX + 1], err[256] = "";
	struct stat st;
	FILE *f;
	size_t n;

	if (!F.path)
		return;
	if (stat(F.path, &st) < 0) {
		if (F.have_file)
			log_info("fault injection: %s is gone: its rules are off", F.path);
		F.have_file = false;
		set->n = 0;
		return;
	}
	if (F.have_file && st.st_ino == F.file_st.st_ino && st.st_size == F.file_st.st_size &&
	    st.st_mtim.tv_sec == F.file_st.st_mtim.tv_sec &&
	    st.st_mtim.tv_nsec == F.file_st.st_mtim.tv_nsec)
		return;
	F.have_file = true;
	F.file_st = st;
	set->n = 0;
	f = fopen(F.path, "r");
	if (!f) {
		log_err("fault injection: cannot read %s", F.path);
		return;
	}
	n = fread(buf, 1, FAULT_FILE_MAX, f);
	fclose(f);
	buf[n] = 0;
	if (parse_set(buf, set, err, sizeof(err)) < 0) {
		log_err("fault injection: %s: %s; no rules from it", F.path, err);
		set->n = 0;
		return;
	}
	log_info("fault injection: %u rule(s) from %s", set->n, F.path);
}

static double rule_random(struct fault_rule *r)
{
	/* xorshift64*: reproducible from the seed, and enough for a coin. */
	r->rng ^= r->rng >> 12;
	r->rng ^= r->rng << 25;
	r->rng ^= r->rng >> 27;
	return (double)((r->rng * XORSHIFT64_MULT) >> 11) / (double)(1ULL << 53);
}

/* Whether r fires for this request; counts it. Lock held. */
static bool rule_fires(struct fault_rule *r, const char *dev, enum fault_point at)
{
	if (!(r->ops & 1u << at) || (r->dev[0] && strcmp(r->dev, dev) != 0))
		return false;
	if (r->seen++ < r->after)
		return false;
	if (r->count && r->injected >= r->count)
		return false;
	if (rule_random(r) >= r->rate)
		return false;
	r->injected++;
	return true;
}

static const char *what(const struct fault_rule *r, char *buf, size_t len)
{
	if (r->kind == FK_DELAY)
		snprintf(buf, len, "delay %llu ms", (unsigned long long)r->ms);
	else if (r->kind == FK_503)
		snprintf(buf, len, "HTTP 503");
	else
		snprintf(buf, len, "%s", strerror(r->err));
	return buf;
}

int fault_inject(const char *dev, enum fault_point at, uint64_t slot)
{
	struct fault_set *sets[] = {&F.env, &F.file};
	uint64_t delay_ms = 0;
	char why[64];
	int ret = 0;

	fault_init();
	pthread_mutex_lock(&F.lock);
	reload_file();
	for (unsigned s = 0; s < 2 && !ret; s++) {
		for (unsigned i = 0; i < sets[s]->n && !ret; i++) {
			struct fault_rule *r = &sets[s]->rule[i];

			if (!rule_fires(r, dev, at))
				continue;
			F.total++;
			log_info("fault injected: %s %s of slot %llu: %s (%s rule %u, %llu in all)",
				 dev, point_names[at], (unsigned long long)slot,
				 what(r, why, sizeof(why)), s ? "file" : "env", i + 1,
				 (unsigned long long)F.total);
			if (r->kind == FK_DELAY)
				delay_ms += r->ms; /* and later rules may still fail it */
			else
				ret = r->kind == FK_503 ? -EAGAIN : -r->err;
		}
	}
	pthread_mutex_unlock(&F.lock);
	if (delay_ms) {
		struct timespec ts = {(time_t)(delay_ms / 1000),
				      (long)(delay_ms % 1000) * 1000000L};

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	return ret;
}
