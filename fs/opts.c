/*
 * opts.c - configuration parsing and defaults.
 *
 * fuse_opt (in main.c) fills the string fields from -o; this file adds the
 * INI file, read with inih, then turns strings into checked values. The
 * defaults live in one table at the top.
 */
#include "opts.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEF_BLOCK (1UL << 20)
#define MIN_BLOCK (4UL << 10)
#define MAX_BLOCK (64UL << 20)
#define DEF_THREADS 32
#define MAX_THREADS 1024
#define DEF_QUEUE_DEPTH 32
#define DEF_FLUSH_DELAY_MS 100
#define DEF_SYNC_INTERVAL_MS 1000
#define DRAM_SHARE_OF_AVAILABLE 4 /* a quarter */
#define DEF_LOG_LEVEL 2		  /* info */

int fs_parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || !*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: break;
	}
	if (shift && (*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b'))
		end += 2;
	else if (shift && (*end == 'B' || *end == 'b'))
		end++;
	if (*end)
		return -EINVAL;
	if (shift && v > (ULLONG_MAX >> shift))
		return -ERANGE;
	*out = (size_t)(v << shift);
	return 0;
}

static int parse_uint(const char *s, unsigned min, unsigned max, unsigned *out)
{
	char *end;
	unsigned long v;

	if (!s || !*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return -EINVAL;
	*out = (unsigned)v;
	return 0;
}

struct ini_ctx {
	struct fs_config *c;
	char *err;
	size_t errlen;
	const char *path;
};

static int on_ini_value(void *user, const char *section, const char *name, const char *value)
{
	struct ini_ctx *x = user;
	struct fs_config *c = x->c;
	struct {
		const char *key;
		char **field;
	} keys[] = {{"dram", &c->dram_s},
		    {"nvme", &c->nvme_s},
		    {"block", &c->block_s},
		    {"meta", &c->meta_s},
		    {"threads", &c->threads_s},
		    {"nvme_engine", &c->engine_s},
		    {"dirty", &c->dirty_s},
		    {"queue_depth", &c->qd_s},
		    {"flush_delay_ms", &c->flush_delay_s},
		    {"sync_interval_ms", &c->sync_interval_s},
		    {"logfile", &c->logfile},
		    {"log_level", &c->log_level_s}};

	if (strcmp(section, "tensorfs") != 0) {
		snprintf(x->err, x->errlen, "unknown section [%s]", section);
		return 0;
	}
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (strcmp(name, keys[i].key) != 0)
			continue;
		if (!*keys[i].field) /* -o wins */
			*keys[i].field = strdup(value);
		return 1;
	}
	snprintf(x->err, x->errlen, "unknown key '%s'", name);
	return 0;
}

int fs_config_load_file(struct fs_config *c, const char *path, char *err, size_t errlen)
{
	char why[256] = "";
	struct ini_ctx x = {c, why, sizeof(why), path};
	FILE *f = fopen(path, "r");
	int rc;

	if (!f) {
		snprintf(err, errlen, "config file %s: %s", path, strerror(errno));
		return -errno;
	}
	rc = ini_parse_file(f, on_ini_value, &x);
	fclose(f);
	if (rc != 0) {
		snprintf(err, errlen, "config %s line %d: %s", path, rc,
			 why[0] ? why : "cannot parse");
		return -EINVAL;
	}
	return 0;
}

static size_t default_dram(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb = 0;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	if (!kb)
		kb = 1ULL << 20; /* 1 GiB when /proc says nothing */
	return (size_t)(kb * 1024 / DRAM_SHARE_OF_AVAILABLE);
}

static char *default_nvme_dir(void)
{
	const char *xdg = getenv("XDG_DATA_HOME");
	const char *home = getenv("HOME");
	char buf[PATH_MAX];

	if (xdg && *xdg)
		snprintf(buf, sizeof(buf), "%s/tensorfs", xdg);
	else if (geteuid() == 0)
		snprintf(buf, sizeof(buf), "/var/lib/tensorfs");
	else if (home && *home)
		snprintf(buf, sizeof(buf), "%s/.local/share/tensorfs", home);
	else
		return NULL;
	return strdup(buf);
}

static int split_nvme(struct fs_config *c, char *err, size_t errlen)
{
	char *list = strdup(c->nvme_s), *save = NULL, *tok;

	if (!list)
		return -ENOMEM;
	for (tok = strtok_r(list, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
		char real[PATH_MAX];

		if (c->n_nvme == FS_MAX_NVME) {
			snprintf(err, errlen, "nvme=: at most %d folders", FS_MAX_NVME);
			free(list);
			return -EINVAL;
		}
		if (!realpath(tok, real)) {
			snprintf(err, errlen, "nvme folder %s: %s", tok, strerror(errno));
			free(list);
			return -ENOENT;
		}
		for (unsigned i = 0; i < c->n_nvme; i++)
			if (strcmp(c->nvme[i], real) == 0) {
				snprintf(err, errlen, "nvme folder %s is listed twice", tok);
				free(list);
				return -EINVAL;
			}
		c->nvme[c->n_nvme++] = strdup(real);
	}
	free(list);
	if (!c->n_nvme) {
		snprintf(err, errlen, "nvme= names no folder");
		return -EINVAL;
	}
	return 0;
}

static int bad(char *err, size_t errlen, const char *opt, const char *val, const char *why)
{
	snprintf(err, errlen, "bad %s='%s': %s", opt, val ? val : "", why);
	return -EINVAL;
}

int fs_config_resolve(struct fs_config *c, char *err, size_t errlen)
{
	int ret;

	c->block = DEF_BLOCK;
	if (c->block_s) {
		if (fs_parse_size(c->block_s, &c->block) < 0)
			return bad(err, errlen, "block", c->block_s, "not a size");
		if (c->block < MIN_BLOCK || c->block > MAX_BLOCK || (c->block & (c->block - 1)))
			return bad(err, errlen, "block", c->block_s,
				   "must be a power of two from 4K to 64M");
		c->block_given = true;
	}
	if (c->dram_s) {
		if (fs_parse_size(c->dram_s, &c->dram) < 0 || c->dram == 0)
			return bad(err, errlen, "dram", c->dram_s, "not a size (e.g. 512M, 16G)");
	} else {
		c->dram = default_dram();
	}
	c->dirty = 0;
	if (c->dirty_s && (fs_parse_size(c->dirty_s, &c->dirty) < 0 || c->dirty == 0))
		return bad(err, errlen, "dirty", c->dirty_s, "not a size");
	c->threads = DEF_THREADS;
	if (c->threads_s && parse_uint(c->threads_s, 1, MAX_THREADS, &c->threads) < 0)
		return bad(err, errlen, "threads", c->threads_s, "must be 1 to 1024");
	c->queue_depth = DEF_QUEUE_DEPTH;
	if (c->qd_s && parse_uint(c->qd_s, 1, 4096, &c->queue_depth) < 0)
		return bad(err, errlen, "queue_depth", c->qd_s, "must be 1 to 4096");
	c->flush_delay_ms = DEF_FLUSH_DELAY_MS;
	if (c->flush_delay_s && parse_uint(c->flush_delay_s, 0, 60000, &c->flush_delay_ms) < 0)
		return bad(err, errlen, "flush_delay_ms", c->flush_delay_s, "must be 0 to 60000");
	c->sync_interval_ms = DEF_SYNC_INTERVAL_MS;
	if (c->sync_interval_s &&
	    parse_uint(c->sync_interval_s, 10, 600000, &c->sync_interval_ms) < 0)
		return bad(err, errlen, "sync_interval_ms", c->sync_interval_s,
			   "must be 10 to 600000");
	c->log_level = DEF_LOG_LEVEL;
	if (c->log_level_s) {
		static const char *const levels[] = {"error", "warning", "info", "debug"};
		int found = -1;

		for (int i = 0; i < 4; i++)
			if (strcasecmp(c->log_level_s, levels[i]) == 0)
				found = i;
		if (found < 0)
			return bad(err, errlen, "log_level", c->log_level_s,
				   "must be error, warning, info or debug");
		c->log_level = found;
	}
	c->engine = TB_ENGINE_AUTO;
	if (c->engine_s) {
		if (strcmp(c->engine_s, "io_uring") == 0)
			c->engine = TB_ENGINE_URING;
		else if (strcmp(c->engine_s, "libaio") == 0)
			c->engine = TB_ENGINE_AIO;
		else if (strcmp(c->engine_s, "auto") != 0)
			return bad(err, errlen, "nvme_engine", c->engine_s,
				   "must be auto, io_uring or libaio");
	}

	if (!c->nvme_s) {
		c->nvme_s = default_nvme_dir();
		if (!c->nvme_s) {
			snprintf(err, errlen, "no nvme= folder given and no HOME to default to");
			return -EINVAL;
		}
		c->default_nvme = true;
		if (mkdir(c->nvme_s, 0700) < 0 && errno != EEXIST) {
			snprintf(err, errlen, "cannot create the default nvme folder %s: %s",
				 c->nvme_s, strerror(errno));
			return -errno;
		}
	}
	ret = split_nvme(c, err, errlen);
	if (ret < 0)
		return ret;
	if (c->meta_s) {
		c->meta = strdup(c->meta_s);
	} else {
		size_t n = strlen(c->nvme[0]) + sizeof("/meta");

		c->meta = malloc(n);
		if (c->meta)
			snprintf(c->meta, n, "%s/meta", c->nvme[0]);
	}
	return c->meta ? 0 : -ENOMEM;
}

void fs_config_free(struct fs_config *c)
{
	char **strs[] = {&c->dram_s,	      &c->nvme_s,	   &c->block_s,	  &c->meta_s,
			 &c->threads_s,	      &c->engine_s,	   &c->dirty_s,	  &c->qd_s,
			 &c->flush_delay_s,   &c->sync_interval_s, &c->config_file, &c->logfile,
			 &c->log_level_s,     &c->source,	   &c->mountpoint, &c->meta};

	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
		free(*strs[i]);
		*strs[i] = NULL;
	}
	for (unsigned i = 0; i < c->n_nvme; i++)
		free(c->nvme[i]);
	c->n_nvme = 0;
}
