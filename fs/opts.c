/*
 * opts.c - configuration parsing and defaults.
 *
 * fuse_opt (in main.c) fills the string fields from -o; this file adds the
 * INI file, read with inih, then turns strings into checked values. The
 * defaults live in one table at the top.
 */
#include "opts.h"
#include "memlimit.h"
#include "meta.h"
#include "storedir.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEF_BLOCK META_BLOCK_DEFAULT
#define MIN_BLOCK META_BLOCK_MIN /* what a store's format record may name */
#define MAX_BLOCK META_BLOCK_MAX
#define DEF_THREADS 32
#define MAX_THREADS 1024
#define DEF_QUEUE_DEPTH 32
#define DEF_FLUSH_DELAY_MS 100
#define DEF_SYNC_INTERVAL_MS 1000
#define DEF_PUNCH_AFTER_MS 10000
#define DEF_SYNC_COMMITS 256
#define DEF_DIRTY_EXPIRE_MS 30000 /* as the kernel's dirty_expire_centisecs */
/*
 * A writer held at the dirty mark while every write-back fails (a full
 * disk) gets ENOSPC or EIO once the failures have gone on this long:
 * seconds, as a rank's watchdog would wait, not the minutes another
 * process may keep the disk full.
 */
#define DEF_STALL_WAIT_MS 5000
#define MAX_STALL_WAIT_MS 600000
#define DRAM_SHARE_OF_AVAILABLE 4 /* a quarter */
#define DRAM_MAX_PERCENT_OF_TOTAL 90 /* dram= above this share of MemTotal is refused */
#define DRAM_MAX_PERCENT_OF_LIMIT 90 /* dram= and DRAM_BASE, DRAM_PER_THREAD: of a cgroup's limit */
#define DRAM_BASE (64ULL << 20)	     /* the daemon's memory beside the tier and its threads' */
#define DRAM_PER_THREAD (3ULL << 20) /* a request buffer, up to two spare slots of the arena */
#define DEF_LOG_LEVEL 2		  /* info */
#define DEF_REGION "us-east-1"
#define DEF_REMOTE_TIMEOUT_MS 30000
#define DEF_LOCK_WAIT_S META_LOCK_WAIT_S
#define MAX_LOCK_WAIT_S 86400
#define DEF_S3_CONNECTIONS 16
#define DEF_READAHEAD (8UL << 20)
#define DEF_REMOTE_READAHEAD (64UL << 20)
#define MAX_REMOTE_READAHEAD (16UL << 30)
/*
 * Blocks per s3 object, by default: a sixteenth of the DRAM tier, from 8
 * to 64 MiB. Eight 1 MiB blocks per object read 4.3x and wrote 1.3x faster
 * than one against s3rver (0bdecce); where each request waits
 * for its first byte, as in a region, what counts is requests per GB, and
 * 64 MiB objects make 16 of them each way. The DRAM tier bounds it: the
 * write-back keeps a few whole objects in flight and a reader two ahead.
 */
#define MIN_DEF_S3_OBJECT (8UL << 20)
#define MAX_DEF_S3_OBJECT (64UL << 20)
#define DEF_S3_OBJECT_DRAM_SHARE 16
#define MIN_S3_OBJECT (4UL << 10)
#define MAX_S3_OBJECT (1UL << 30)

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
	/* 2G, 2GB and 2GiB are bytes; a lower-case b (2Gb) would be bits: refused */
	if (shift && *end == 'i' && end[1] == 'B')
		end += 2;
	else if (shift && *end == 'B')
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
	bool has_secret;
	bool remote_from_cmdline; /* -o remote= wins over the file's */
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
		    {"punch_after_ms", &c->punch_after_s},
		    {"sync_commits", &c->sync_commits_s},
		    {"dirty_expire_ms", &c->dirty_expire_s},
		    {"stall_wait_ms", &c->stall_wait_s},
		    {"logfile", &c->logfile},
		    {"log_level", &c->log_level_s},
		    {"endpoint", &c->endpoint_s},
		    {"region", &c->region_s},
		    {"s3_addressing", &c->s3_addressing_s},
		    {"remote_timeout", &c->remote_timeout_s},
		    {"nvme_bw", &c->nvme_bw_s},
		    {"nvme_cap", &c->nvme_cap_s},
		    {"remote_bw", &c->remote_bw_s},
		    {"remote_cap", &c->remote_cap_s},
		    {"s3_bw", &c->s3_bw_s},
		    {"s3_cap", &c->s3_cap_s},
		    {"pfs_bw", &c->pfs_bw_s},
		    {"pfs_cap", &c->pfs_cap_s},
		    {"dedup", &c->dedup_s},
		    {"cache_policy", &c->policy_s},
		    {"readahead", &c->readahead_s},
		    {"remote_readahead", &c->remote_readahead_s},
		    {"s3_object", &c->s3_object_s},
		    {"prefetch", &c->prefetch_s},
		    {"cuda", &c->cuda_s},
		    {"lock_wait", &c->lock_wait_s},
		    {"checksum", &c->checksum_s},
		    {"scratch", &c->scratch_s}};
	struct {
		const char *key;
		char **field;
	} secrets[] = {{"access_key_id", &c->s3_key},
		       {"secret_access_key", &c->s3_secret},
		       {"session_token", &c->s3_token}};

	if (strcmp(section, "s3") == 0) {
		for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++) {
			if (strcmp(name, secrets[i].key) != 0)
				continue;
			if (*secrets[i].field) /* given twice: no copy left in freed memory */
				explicit_bzero(*secrets[i].field, strlen(*secrets[i].field));
			free(*secrets[i].field);
			*secrets[i].field = strdup(value);
			x->has_secret = true;
			return 1;
		}
		snprintf(x->err, x->errlen, "unknown key '%s' in [s3]", name);
		return 0;
	}
	if (strcmp(section, "tensorfs") != 0) {
		snprintf(x->err, x->errlen, "unknown section [%s]", section);
		return 0;
	}
	if (strcmp(name, "remote") == 0) {
		if (!x->remote_from_cmdline && fs_config_add_remote(c, value) < 0) {
			snprintf(x->err, x->errlen, "out of memory");
			return 0;
		}
		return 1;
	}
	if (0) {
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

#define MAX_LINKS 40 /* links one lookup follows, as the kernel's limit */

/*
 * Resolve path as the kernel would, into out (PATH_MAX bytes): absolute,
 * without ".", ".." or links. Components from the first that does not
 * exist on are kept as written (the daemon makes them), and *missing says
 * so. A link is followed only when it belongs to the user tensorfs runs
 * as or to root: one of another user's, in a folder of theirs or planted
 * in /tmp, would let that user choose where a root daemon writes. what
 * and shown name the option and its value in messages. 0, or -errno with
 * err set.
 */
static int resolve_path(const char *what, const char *shown, const char *path, char *out,
			bool *missing, char *err, size_t errlen)
{
	char todo[2 * PATH_MAX], link[PATH_MAX], tmp[2 * PATH_MAX];
	const char *p = todo;
	unsigned links = 0;
	size_t len = 0;
	struct stat st;

	*missing = false;
	if ((size_t)snprintf(todo, sizeof(todo), "%s", path) >= PATH_MAX)
		goto too_long;
	if (path[0] != '/') {
		if (!getcwd(out, PATH_MAX)) {
			snprintf(err, errlen, "%s %s: the working directory: %s", what, shown,
				 strerror(errno));
			return -errno;
		}
		len = strcmp(out, "/") == 0 ? 0 : strlen(out);
	}
	out[len] = 0;
	while (*p) {
		const char *comp;
		size_t clen;

		while (*p == '/')
			p++;
		comp = p;
		clen = strcspn(p, "/");
		p += clen;
		if (clen == 0 || (clen == 1 && comp[0] == '.'))
			continue;
		if (clen == 2 && comp[0] == '.' && comp[1] == '.') {
			if (*missing) {
				snprintf(err, errlen, "%s %s: %s does not exist", what, shown, out);
				return -ENOENT;
			}
			len = (size_t)(strrchr(out, '/') ? strrchr(out, '/') - out : 0);
			out[len] = 0;
			continue;
		}
		if (len + 1 + clen >= PATH_MAX)
			goto too_long;
		out[len] = '/';
		memcpy(out + len + 1, comp, clen);
		out[len + 1 + clen] = 0;
		if (!*missing && lstat(out, &st) < 0) {
			if (errno != ENOENT) {
				snprintf(err, errlen, "%s %s: %s: %s", what, shown, out,
					 strerror(errno));
				return -errno;
			}
			*missing = true;
		}
		if (*missing || !S_ISLNK(st.st_mode)) {
			len += 1 + clen;
			continue;
		}
		if (st.st_uid != geteuid() && st.st_uid != 0) {
			snprintf(err, errlen,
				 "%s %s: %s is a symbolic link of uid %u: a link of another user "
				 "must not choose where tensorfs writes; give the real path",
				 what, shown, out, (unsigned)st.st_uid);
			return -EPERM;
		}
		ssize_t n = readlink(out, link, sizeof(link) - 1);

		if (n < 0 || ++links > MAX_LINKS) {
			int e = n < 0 ? errno : ELOOP;

			snprintf(err, errlen, "%s %s: %s: %s", what, shown, out, strerror(e));
			return -e;
		}
		link[n] = 0;
		if ((size_t)snprintf(tmp, sizeof(tmp), "%s/%s", link, p) >= sizeof(tmp))
			goto too_long;
		memcpy(todo, tmp, strlen(tmp) + 1);
		p = todo;
		len = link[0] == '/' ? 0 : len;
		out[len] = 0;
	}
	if (len == 0)
		strcpy(out, "/");
	return 0;
too_long:
	snprintf(err, errlen, "%s %s: the path is too long", what, shown);
	return -ENAMETOOLONG;
}

/*
 * Resolve the folder of file path (resolve_path) and keep its last name as
 * given, into out (PATH_MAX bytes): the file itself is opened with
 * O_NOFOLLOW, so a link in its place is refused, not followed.
 */
static int resolve_file(const char *what, const char *path, char *out, char *err, size_t errlen)
{
	const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
	char dir[PATH_MAX];
	bool missing;
	int ret;

	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
		snprintf(err, errlen, "%s %s names a folder, not a file", what, path);
		return -EISDIR;
	}
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == path)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	ret = resolve_path(what, path, dir, out, &missing, err, errlen);
	if (ret)
		return ret;
	if (strlen(out) + 1 + strlen(name) >= PATH_MAX) {
		snprintf(err, errlen, "%s %s: the path is too long", what, path);
		return -ENAMETOOLONG;
	}
	if (strcmp(out, "/") != 0)
		strcat(out, "/");
	strcat(out, name);
	return 0;
}

int fs_check_opened(int fd, const char *what, const char *path, unsigned rules, struct stat *st,
		    char *err, size_t errlen)
{
	uid_t me = geteuid();
	int ret = -EPERM;

	if (fstat(fd, st) < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s %s: %s", what, path, strerror(-ret));
	} else if (!S_ISREG(st->st_mode)) {
		ret = S_ISDIR(st->st_mode) ? -EISDIR : -EINVAL;
		snprintf(err, errlen, "%s %s is not a regular file (it is %s)", what, path,
			 storedir_file_type(st->st_mode));
	} else if (st->st_uid != me && !(st->st_uid == 0 && (rules & FS_OPENED_ROOT_MAY_OWN))) {
		snprintf(err, errlen,
			 "%s %s is owned by uid %u, not by uid %u (the user tensorfs runs as)%s: "
			 "remove it if it is not yours",
			 what, path, (unsigned)st->st_uid, (unsigned)me,
			 (rules & FS_OPENED_ROOT_MAY_OWN) && me != 0 ? " or root" : "");
	} else if ((rules & FS_OPENED_ONE_LINK) && st->st_nlink != 1) {
		snprintf(err, errlen,
			 "%s %s has %lu links: it may be another file under a second name", what,
			 path, (unsigned long)st->st_nlink);
	} else if (st->st_mode & (S_IWGRP | S_IWOTH)) {
		snprintf(err, errlen,
			 "%s %s is writable by group or others (mode %03o); chmod go-w it", what,
			 path, (unsigned)(st->st_mode & 0777));
	} else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s %s: %s", what, path, strerror(-ret));
	} else {
		return fd;
	}
	close(fd);
	return ret;
}

/*
 * Open the config file for reading, or refuse it: it chooses the folders a
 * root daemon writes into and may hold credentials, so it must be a regular
 * file (a FIFO or a device would hang the start, a folder reads as empty),
 * not a link, owned by the user tensorfs runs as or root, and writable by
 * nobody else. A descriptor, or -errno with err set.
 */
static int open_config(const char *path, struct stat *st, char *err, size_t errlen)
{
	char real[PATH_MAX];
	int fd, ret = resolve_file("config file", path, real, err, errlen);

	if (ret)
		return ret;
	fd = open(real, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (ret == -ELOOP && lstat(path, st) == 0 && S_ISLNK(st->st_mode))
			snprintf(err, errlen,
				 "config file %s is a symbolic link; give the path of the file "
				 "itself",
				 path);
		else
			snprintf(err, errlen, "config file %s: %s", path, strerror(-ret));
		return ret;
	}
	return fs_check_opened(fd, "config file", path, FS_OPENED_ROOT_MAY_OWN, st, err, errlen);
}

int fs_config_load_file(struct fs_config *c, const char *path, char *err, size_t errlen)
{
	char why[256] = "";
	struct ini_ctx x = {c, why, sizeof(why), path, false, c->remote_s != NULL};
	struct stat st;
	FILE *f;
	int fd, rc;

	fd = open_config(path, &st, err, errlen);
	if (fd < 0)
		return fd;
	f = fdopen(fd, "r");
	if (!f) {
		rc = -errno;
		close(fd);
		snprintf(err, errlen, "config file %s: %s", path, strerror(-rc));
		return rc;
	}
	rc = ini_parse_file(f, on_ini_value, &x);
	fclose(f);
	/* Credentials in a file others can read are already leaked: refuse. */
	if (rc == 0 && x.has_secret && (st.st_mode & 077)) {
		snprintf(err, errlen,
			 "config %s holds S3 credentials but is readable by group or "
			 "others (mode %03o); chmod 600 it",
			 path, (unsigned)(st.st_mode & 0777));
		return -EPERM;
	}
	if (rc != 0) {
		snprintf(err, errlen, "config %s line %d: %s", path, rc,
			 why[0] ? why : "cannot parse");
		return -EINVAL;
	}
	return 0;
}

/*
 * A quarter of what is available: of MemAvailable, and of what the cgroup's
 * memory limit leaves beside what the cgroup holds now (a container's
 * /proc/meminfo shows the host's memory).
 */
static size_t default_dram(const struct fs_memlimit *m)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb = 0;
	uint64_t avail;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	if (!kb)
		kb = 1ULL << 20; /* 1 GiB when /proc says nothing */
	avail = kb * 1024;
	if (m) {
		uint64_t left = m->limit > m->working_set ? m->limit - m->working_set : 0;

		avail = left < avail ? left : avail;
	}
	return (size_t)(avail / DRAM_SHARE_OF_AVAILABLE);
}

/*
 * The DRAM tier is mlocked, so a dram= near or above the host's memory
 * would call in the OOM killer: refuse more than DRAM_MAX_PERCENT_OF_TOTAL
 * of the physical memory. (Not of MemAvailable, which changes from one
 * start to the next: a mount that works should work again.)
 */
static int check_dram_bound(const struct fs_config *c, char *err, size_t errlen)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	unsigned long long total, most;

	if (pages <= 0 || page <= 0)
		return 0; /* not known: nothing to hold it to */
	total = (unsigned long long)pages * (unsigned long long)page;
	most = total / 100 * DRAM_MAX_PERCENT_OF_TOTAL;
	if (c->dram <= most)
		return 0;
	snprintf(err, errlen,
		 "bad dram='%s': %llu MiB is more than %d%% of this host's memory: it has %llu "
		 "MiB, so dram= may be at most %llu MiB",
		 c->dram_s, (unsigned long long)c->dram >> 20, DRAM_MAX_PERCENT_OF_TOTAL,
		 total >> 20, most >> 20);
	return -EINVAL;
}

/*
 * Under a cgroup's memory limit (a container's, systemd's MemoryMax), the
 * cgroup's OOM killer ends the daemon while it fills the tier, before it
 * can say why. Its memory is the tier and, beside it, about
 * DRAM_PER_THREAD for each serving thread and DRAM_BASE: together they
 * may take DRAM_MAX_PERCENT_OF_LIMIT of the limit. The default tier is
 * held to that too (c->dram 0: not given).
 */
static int check_dram_limit(struct fs_config *c, char *err, size_t errlen)
{
	struct fs_memlimit m;
	bool limited = fs_memlimit_read("", &m) == 0;
	uint64_t other = DRAM_BASE + (uint64_t)c->threads * DRAM_PER_THREAD, room = 0;

	if (limited) {
		uint64_t share = (uint64_t)((unsigned __int128)m.limit * DRAM_MAX_PERCENT_OF_LIMIT / 100);

		room = share > other ? share - other : 0;
	}
	if (!c->dram_s) {
		c->dram = default_dram(limited ? &m : NULL);
		if (limited && c->dram > room)
			c->dram = room;
	}
	if (!limited || (c->dram <= room && c->dram))
		return 0;
	if (!c->dram_s) {
		snprintf(err, errlen,
			 "the memory limit of this process's cgroup (%llu MiB, %s) leaves no room "
			 "for a DRAM tier beside the daemon's other memory (about %llu MiB with "
			 "threads=%u): raise the limit, or give fewer threads=",
			 (unsigned long long)m.limit >> 20, m.file, (unsigned long long)other >> 20,
			 c->threads);
		return -EINVAL;
	}
	snprintf(err, errlen,
		 "bad dram='%s': %llu MiB and the daemon's other memory (about %llu MiB with "
		 "threads=%u) are more than %d%% of the memory limit of this process's cgroup "
		 "(%llu MiB, %s), whose OOM killer would end the daemon while it fills the tier: "
		 "dram= may be at most %llu MiB here",
		 c->dram_s, (unsigned long long)c->dram >> 20, (unsigned long long)other >> 20,
		 c->threads, DRAM_MAX_PERCENT_OF_LIMIT, (unsigned long long)m.limit >> 20, m.file,
		 (unsigned long long)room >> 20);
	return -EINVAL;
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
		bool missing;
		int ret = resolve_path("nvme folder", tok, tok, real, &missing, err, errlen);

		if (ret || missing) {
			if (!ret)
				snprintf(err, errlen, "nvme folder %s: %s", tok, strerror(ENOENT));
			free(list);
			return ret ? ret : -ENOENT;
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

static int opt_size(const char *s, const char *name, uint64_t *out, char *err, size_t errlen)
{
	size_t v = 0;

	*out = 0;
	if (!s)
		return 0;
	if (fs_parse_size(s, &v) < 0 || v == 0)
		return bad(err, errlen, name, s, "not a size (e.g. 500M, 2G)");
	*out = v;
	return 0;
}

/* An on/off option: *out from s, or dflt where s is not given. */
static int opt_switch(const char *s, const char *name, bool dflt, bool *out, char *err,
		      size_t errlen)
{
	*out = dflt;
	if (!s)
		return 0;
	if (strcmp(s, "on") == 0)
		*out = true;
	else if (strcmp(s, "off") == 0)
		*out = false;
	else
		return bad(err, errlen, name, s, "must be on or off");
	return 0;
}

/* A whole-number option as fs_config_resolve reads it (parse_uint). */
struct uint_opt {
	const char *name, *s;
	unsigned *out;
	unsigned dflt, min, max;
	const char *why; /* what a value out of range must be */
};

/* A word an option may take, and the value it stands for. */
struct choice {
	const char *word;
	int value;
};

/* The words of dedup=, cache_policy= and nvme_engine=; the first is the default. */
static const struct choice dedup_words[] = {
    {"verify", TB_DEDUP_VERIFY}, {"trust", TB_DEDUP_TRUST}, {"off", TB_DEDUP_OFF}};
static const struct choice policy_words[] = {{"auto", TB_POLICY_AUTO},
					     {"clock", TB_POLICY_CLOCK},
					     {"lru", TB_POLICY_LRU},
					     {"2q", TB_POLICY_2Q}};
static const struct choice engine_words[] = {
    {"auto", TB_ENGINE_AUTO}, {"io_uring", TB_ENGINE_URING}, {"libaio", TB_ENGINE_AIO}};

#define N_WORDS(w) (sizeof(w) / sizeof((w)[0]))

/*
 * An option that takes one of the words of words[0..n): *out its value, or
 * words[0]'s where s is not given; any other word is bad, must be as why says.
 */
static int opt_choice(const char *s, const char *name, const struct choice *words, size_t n,
		      const char *why, int *out, char *err, size_t errlen)
{
	*out = words[0].value;
	if (!s)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (strcmp(s, words[i].word) == 0) {
			*out = words[i].value;
			return 0;
		}
	return bad(err, errlen, name, s, why);
}

static char *env_or(char *have, const char *var)
{
	const char *v = getenv(var);

	if (have || !v || !*v)
		return have;
	return strdup(v);
}

int fs_config_add_remote(struct fs_config *c, const char *value)
{
	size_t n = (c->remote_s ? strlen(c->remote_s) + 1 : 0) + strlen(value) + 1;
	char *joined = malloc(n);

	if (!joined)
		return -ENOMEM;
	snprintf(joined, n, "%s%s%s", c->remote_s ? c->remote_s : "", c->remote_s ? ";" : "",
		 value);
	free(c->remote_s);
	c->remote_s = joined;
	return 0;
}

static bool url_has(CURLU *u, CURLUPart part)
{
	char *v = NULL;
	bool has = curl_url_get(u, part, &v, 0) == CURLUE_OK;

	curl_free(v);
	return has;
}

/*
 * An s3 endpoint is http:// or https:// (in any case), a host, and maybe a
 * port and a path: no user or password, query or fragment. It is shown in
 * the log, in stats and in the config, so a secret in it would be too; and
 * whatever is wrong with it, the value is never printed here. Parsed by
 * libcurl's URL API, as the s3 tier parses it.
 */
static int check_endpoint(const char *url, char *err, size_t errlen)
{
	CURLU *u = curl_url();
	char *scheme = NULL;
	CURLUcode rc;
	int ret = -EINVAL;

	if (!u)
		return -ENOMEM;
	rc = curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME);
	if (rc != CURLUE_OK)
		snprintf(err, errlen,
			 "bad endpoint=: not a URL like http(s)://host[:port] (%s); the value is "
			 "not shown, as it may hold a secret",
			 curl_url_strerror(rc));
	else if (url_has(u, CURLUPART_USER) || url_has(u, CURLUPART_PASSWORD) ||
		 url_has(u, CURLUPART_OPTIONS))
		snprintf(err, errlen,
			 "bad endpoint=: a user or password in the URL is refused, and not "
			 "shown; give credentials in AWS_* variables or the [s3] section of the "
			 "config file");
	else if (url_has(u, CURLUPART_QUERY) || url_has(u, CURLUPART_FRAGMENT))
		snprintf(err, errlen,
			 "bad endpoint=: a query (?...) or fragment (#...) in the URL is refused, "
			 "and not shown; an s3 endpoint is http(s)://host[:port][/path]");
	else if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
		 (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0))
		snprintf(err, errlen,
			 "bad endpoint=: must start with http:// or https://, not %s://",
			 scheme ? scheme : "?");
	else
		ret = 0;
	curl_free(scheme);
	curl_url_cleanup(u);
	return ret;
}

/*
 * Whether b (blen bytes) can be a bucket name: letters, digits, '.', '-'
 * and '_' (S3's rules, with the capitals and '_' of old us-east-1 buckets),
 * 1 to 63 of them. Nothing else: "KEY:SECRET@bucket" is refused here.
 */
static bool bucket_name_ok(const char *b, size_t blen)
{
	if (blen == 0 || blen > 63)
		return false;
	for (size_t i = 0; i < blen; i++)
		if (!(b[i] >= 'a' && b[i] <= 'z') && !(b[i] >= 'A' && b[i] <= 'Z') &&
		    !(b[i] >= '0' && b[i] <= '9') && !strchr(".-_", b[i]))
			return false;
	return true;
}

/*
 * remote=s3://BUCKET[/PREFIX]. The bucket and prefix are shown in the log,
 * in stats and in the config, so a value that is refused is never printed:
 * s3://KEY:SECRET@bucket, a user and password where a URL has them, is
 * what people write, and the secret may hold '/' (where the prefix would
 * start) as AWS's do; so an '@' anywhere in it is refused.
 */
static int resolve_s3(struct fs_config *c, const char *url, unsigned timeout_ms, char *err,
		      size_t errlen)
{
	struct tb_s3_config *s3 = &c->s3;
	const char *b = url + 5, *slash = strchr(b, '/');
	size_t blen = slash ? (size_t)(slash - b) : strlen(b);

	if (c->has_s3) {
		snprintf(err, errlen, "bad remote=s3://...: only one s3 tier per mount");
		return -EINVAL;
	}
	if (strchr(url, '@')) {
		snprintf(err, errlen,
			 "bad remote=s3://...: a user or password in it ('@') is refused, and "
			 "not shown; give credentials in AWS_* variables or the [s3] section of "
			 "the config file");
		return -EINVAL;
	}
	if (!bucket_name_ok(b, blen)) {
		snprintf(err, errlen,
			 "bad remote=s3://...: not a bucket name (1 to 63 letters, digits, '.', "
			 "'-' or '_') before the first '/'; the value is not shown, as it may "
			 "hold a secret");
		return -EINVAL;
	}
	c->s3_bucket = strndup(b, blen);
	c->s3_prefix = strdup(slash ? slash + 1 : "");
	c->s3_key = env_or(c->s3_key, "AWS_ACCESS_KEY_ID");
	c->s3_secret = env_or(c->s3_secret, "AWS_SECRET_ACCESS_KEY");
	c->s3_token = env_or(c->s3_token, "AWS_SESSION_TOKEN");
	if (!c->s3_key || !c->s3_secret) {
		snprintf(err, errlen,
			 "remote=s3://%s needs credentials: AWS_ACCESS_KEY_ID and "
			 "AWS_SECRET_ACCESS_KEY, or an [s3] section in the config file",
			 c->s3_bucket);
		return -EINVAL;
	}
	if (c->s3_addressing_s && strcmp(c->s3_addressing_s, "path") &&
	    strcmp(c->s3_addressing_s, "virtual"))
		return bad(err, errlen, "s3_addressing", c->s3_addressing_s,
			   "must be path or virtual");
	s3->bucket = c->s3_bucket;
	s3->prefix = c->s3_prefix;
	s3->region = c->region_s ? c->region_s : DEF_REGION;
	s3->endpoint = c->endpoint_s;
	s3->access_key = c->s3_key;
	s3->secret_key = c->s3_secret;
	s3->session_token = c->s3_token;
	/* A custom endpoint (MinIO, Ceph, a test server) is usually path-style. */
	s3->path_style = c->s3_addressing_s ? strcmp(c->s3_addressing_s, "path") == 0
					    : c->endpoint_s != NULL;
	s3->timeout_ms = timeout_ms;
	s3->connections = DEF_S3_CONNECTIONS;
	s3->object_bytes = c->s3_object;
	s3->readahead_max = c->remote_readahead;
	c->has_s3 = true;
	return 0;
}

static int resolve_pfs(struct fs_config *c, const char *dir, char *err, size_t errlen)
{
	char real[PATH_MAX];

	if (c->n_pfs == FS_MAX_REMOTES)
		return bad(err, errlen, "remote", dir, "too many remote folders");
	bool missing;
	int ret = resolve_path("remote folder", dir, dir, real, &missing, err, errlen);

	if (ret)
		return ret;
	if (missing) {
		snprintf(err, errlen, "remote folder %s: %s", dir, strerror(ENOENT));
		return -ENOENT;
	}
	for (unsigned i = 0; i < c->n_nvme; i++)
		if (strcmp(c->nvme[i], real) == 0) {
			snprintf(err, errlen, "remote folder %s is also an nvme folder", dir);
			return -EINVAL;
		}
	for (unsigned i = 0; i < c->n_pfs; i++)
		if (strcmp(c->remote_path[i], real) == 0) {
			snprintf(err, errlen, "remote folder %s is listed twice", dir);
			return -EINVAL;
		}
	c->remote_path[c->n_pfs++] = strdup(real);
	return 0;
}

static int parse_timeout(struct fs_config *c, unsigned *timeout_ms, char *err, size_t errlen)
{
	char *end;
	unsigned long n;

	*timeout_ms = DEF_REMOTE_TIMEOUT_MS;
	if (!c->remote_timeout_s)
		return 0;
	/* seconds, or a number with s or ms */
	n = strtoul(c->remote_timeout_s, &end, 10);
	if (end == c->remote_timeout_s || (*end && strcmp(end, "s") && strcmp(end, "ms")) ||
	    n == 0 || n > 86400000UL)
		return bad(err, errlen, "remote_timeout", c->remote_timeout_s,
			   "a time like 30 (seconds), 30s or 500ms");
	*timeout_ms = strcmp(end, "ms") == 0 ? (unsigned)n : (unsigned)n * 1000;
	return 0;
}

/* lock_wait=: seconds (0: refuse at once), with or without an s. */
static int parse_lock_wait(struct fs_config *c, char *err, size_t errlen)
{
	char *end;
	unsigned long n;

	c->lock_wait_secs = DEF_LOCK_WAIT_S;
	if (!c->lock_wait_s)
		return 0;
	n = strtoul(c->lock_wait_s, &end, 10);
	if (end == c->lock_wait_s || (*end && strcmp(end, "s")) || c->lock_wait_s[0] == '-' ||
	    n > MAX_LOCK_WAIT_S)
		return bad(err, errlen, "lock_wait", c->lock_wait_s,
			   "seconds, from 0 (do not wait) to 86400");
	c->lock_wait_secs = (unsigned)n;
	return 0;
}

static int resolve_devices(struct fs_config *c, char *err, size_t errlen)
{
	uint64_t nvme_bw, nvme_cap, remote_bw, remote_cap, s3_bw, s3_cap, pfs_bw, pfs_cap;
	unsigned timeout_ms;
	int ret;

	if ((ret = opt_size(c->nvme_bw_s, "nvme_bw", &nvme_bw, err, errlen)) ||
	    (ret = opt_size(c->nvme_cap_s, "nvme_cap", &nvme_cap, err, errlen)) ||
	    (ret = opt_size(c->remote_bw_s, "remote_bw", &remote_bw, err, errlen)) ||
	    (ret = opt_size(c->remote_cap_s, "remote_cap", &remote_cap, err, errlen)) ||
	    (ret = opt_size(c->s3_bw_s, "s3_bw", &s3_bw, err, errlen)) ||
	    (ret = opt_size(c->s3_cap_s, "s3_cap", &s3_cap, err, errlen)) ||
	    (ret = opt_size(c->pfs_bw_s, "pfs_bw", &pfs_bw, err, errlen)) ||
	    (ret = opt_size(c->pfs_cap_s, "pfs_cap", &pfs_cap, err, errlen)) ||
	    (ret = parse_timeout(c, &timeout_ms, err, errlen)))
		return ret;
	if (c->endpoint_s && (ret = check_endpoint(c->endpoint_s, err, errlen)))
		return ret;
	if (!c->remote_s && c->endpoint_s) {
		snprintf(err, errlen, "endpoint= given without remote=");
		return -EINVAL;
	}
	if (!c->remote_s && (c->remote_bw_s || c->remote_cap_s))
		return bad(err, errlen, c->remote_bw_s ? "remote_bw" : "remote_cap",
			   c->remote_bw_s ? c->remote_bw_s : c->remote_cap_s,
			   "given without remote=");
	c->n_devs = 0;
	for (unsigned i = 0; i < c->n_nvme; i++)
		c->devs[c->n_devs++] = (struct tb_dev_spec){TB_KIND_NVME, c->nvme[i], nvme_bw,
							    nvme_cap};
	if (!c->remote_s)
		return 0;

	char *list = strdup(c->remote_s), *save = NULL;
	if (!list)
		return -ENOMEM;
	for (char *r = strtok_r(list, ";", &save); r && !ret; r = strtok_r(NULL, ";", &save)) {
		if (c->n_devs == TB_MAX_DEVS) {
			ret = bad(err, errlen, "remote", r, "too many devices");
		} else if (strncmp(r, "s3://", 5) == 0) {
			ret = resolve_s3(c, r, timeout_ms, err, errlen);
			if (!ret)
				c->devs[c->n_devs++] = (struct tb_dev_spec){
					TB_KIND_S3, NULL, s3_bw ? s3_bw : remote_bw,
					s3_cap ? s3_cap : remote_cap};
		} else if (r[0] == '/') {
			ret = resolve_pfs(c, r, err, errlen);
			if (!ret)
				c->devs[c->n_devs++] = (struct tb_dev_spec){
					TB_KIND_PFS, c->remote_path[c->n_pfs - 1],
					pfs_bw ? pfs_bw : remote_bw, pfs_cap ? pfs_cap : remote_cap};
		} else if (strchr(r, '@') || strstr(r, "://")) {
			/* S3://KEY:SECRET@bucket, say: not shown. */
			snprintf(err, errlen,
				 "bad remote=: must be s3://bucket[/prefix] (lowercase s3) or a "
				 "folder; not shown, as it may hold a secret");
			ret = -EINVAL;
		} else {
			ret = bad(err, errlen, "remote", r,
				  "must be s3://bucket[/prefix] or an absolute folder");
		}
	}
	free(list);
	return ret;
}

/*
 * Resolve *path in place: as a folder (resolve_path), or as a file in a
 * folder (resolve_file).
 */
static int resolve_in_place(const char *what, char **path, bool file, char *err, size_t errlen)
{
	char real[PATH_MAX], *dup;
	bool missing;
	int ret;

	if (!*path)
		return 0;
	ret = file ? resolve_file(what, *path, real, err, errlen)
		   : resolve_path(what, *path, *path, real, &missing, err, errlen);
	if (ret)
		return ret;
	dup = strdup(real);
	if (!dup)
		return -ENOMEM;
	free(*path);
	*path = dup;
	return 0;
}

int fs_config_resolve(struct fs_config *c, char *err, size_t errlen)
{
	int ret, dedup, policy, engine;

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
		ret = check_dram_bound(c, err, errlen);
		if (ret)
			return ret;
	}
	c->dirty = 0;
	if (c->dirty_s && (fs_parse_size(c->dirty_s, &c->dirty) < 0 || c->dirty == 0))
		return bad(err, errlen, "dirty", c->dirty_s, "not a size");
	/* The whole-number options, each with its default, its range and what it must be. */
	const struct uint_opt uints[] = {
	    {"threads", c->threads_s, &c->threads, DEF_THREADS, 1, MAX_THREADS,
	     "must be 1 to 1024"},
	    {"queue_depth", c->qd_s, &c->queue_depth, DEF_QUEUE_DEPTH, 1, 4096,
	     "must be 1 to 4096"},
	    {"flush_delay_ms", c->flush_delay_s, &c->flush_delay_ms, DEF_FLUSH_DELAY_MS, 0, 60000,
	     "must be 0 to 60000"},
	    {"dirty_expire_ms", c->dirty_expire_s, &c->dirty_expire_ms, DEF_DIRTY_EXPIRE_MS, 0,
	     86400000, "must be 0 (no age limit) to 86400000"},
	    {"stall_wait_ms", c->stall_wait_s, &c->stall_wait_ms, DEF_STALL_WAIT_MS, 0,
	     MAX_STALL_WAIT_MS, "must be 0 to 600000"},
	    {"sync_interval_ms", c->sync_interval_s, &c->sync_interval_ms, DEF_SYNC_INTERVAL_MS, 10,
	     600000, "must be 10 to 600000"},
	    {"sync_commits", c->sync_commits_s, &c->sync_commits, DEF_SYNC_COMMITS, 1, 100000000,
	     "must be 1 to 100000000"},
	    {"punch_after_ms", c->punch_after_s, &c->punch_after_ms, DEF_PUNCH_AFTER_MS, 0,
	     86400000, "must be 0 (never) to 86400000"},
	};
	for (size_t i = 0; i < sizeof(uints) / sizeof(uints[0]); i++) {
		const struct uint_opt *u = &uints[i];

		*u->out = u->dflt;
		if (u->s && parse_uint(u->s, u->min, u->max, u->out) < 0)
			return bad(err, errlen, u->name, u->s, u->why);
	}
	ret = check_dram_limit(c, err, errlen); /* and the default dram=, from threads= */
	if (ret)
		return ret;
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
	if ((ret = opt_choice(c->dedup_s, "dedup", dedup_words, N_WORDS(dedup_words),
			      "must be verify, trust or off", &dedup, err, errlen)) ||
	    (ret = opt_choice(c->policy_s, "cache_policy", policy_words, N_WORDS(policy_words),
			      "must be auto, 2q, clock or lru", &policy, err, errlen)))
		return ret;
	c->dedup = (enum tb_dedup)dedup;
	c->policy = (enum tb_policy)policy;
	if ((ret = opt_switch(c->cuda_s, "cuda", false, &c->cuda, err, errlen)) ||
	    (ret = opt_switch(c->checksum_s, "checksum", true, &c->checksum, err, errlen)) ||
	    (ret = opt_switch(c->scratch_s, "scratch", false, &c->scratch, err, errlen)) ||
	    (ret = opt_switch(c->prefetch_s, "prefetch", true, &c->prefetch, err, errlen)))
		return ret;
	c->readahead = DEF_READAHEAD;
	if (c->readahead_s && strcmp(c->readahead_s, "0") != 0 &&
	    fs_parse_size(c->readahead_s, &c->readahead) < 0)
		return bad(err, errlen, "readahead", c->readahead_s, "not a size (0 turns it off)");
	if (c->readahead_s && strcmp(c->readahead_s, "0") == 0)
		c->readahead = 0;
	c->remote_readahead = DEF_REMOTE_READAHEAD;
	if (c->remote_readahead_s && strcmp(c->remote_readahead_s, "0") == 0)
		c->remote_readahead = 0;
	else if (c->remote_readahead_s &&
		 (fs_parse_size(c->remote_readahead_s, &c->remote_readahead) < 0 ||
		  c->remote_readahead > MAX_REMOTE_READAHEAD))
		return bad(err, errlen, "remote_readahead", c->remote_readahead_s,
			   "not a size up to 16G (0 turns the deep window off)");
	c->s3_object = MAX_DEF_S3_OBJECT;
	while (c->s3_object > MIN_DEF_S3_OBJECT &&
	       c->s3_object > c->dram / DEF_S3_OBJECT_DRAM_SHARE)
		c->s3_object /= 2;
	if (c->s3_object_s && (fs_parse_size(c->s3_object_s, &c->s3_object) < 0 ||
			       c->s3_object < MIN_S3_OBJECT || c->s3_object > MAX_S3_OBJECT))
		return bad(err, errlen, "s3_object", c->s3_object_s, "not a size from 4K to 1G");
	ret = parse_lock_wait(c, err, errlen);
	if (ret)
		return ret;
	ret = opt_choice(c->engine_s, "nvme_engine", engine_words, N_WORDS(engine_words),
			 "must be auto, io_uring or libaio", &engine, err, errlen);
	if (ret)
		return ret;
	c->engine = (enum tb_engine)engine;

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
	if (strcmp(c->nvme_s, "none") == 0) {
		/* Only the remote tier persists blocks; the metadata needs a home. */
		if (!c->remote_s || !c->meta_s) {
			snprintf(err, errlen, "nvme=none needs remote= and meta=");
			return -EINVAL;
		}
	} else {
		ret = split_nvme(c, err, errlen);
		if (ret < 0)
			return ret;
	}
	ret = resolve_devices(c, err, errlen);
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
	if (!c->meta)
		return -ENOMEM;
	/*
	 * In the background the daemon moves to /, where a relative logfile=
	 * or meta= would name another file than the one meant; and another
	 * user's link on the way must not choose where a root daemon writes.
	 */
	if (c->logfile && !c->logfile[0])
		return bad(err, errlen, "logfile", c->logfile, "empty");
	ret = resolve_in_place("logfile", &c->logfile, true, err, errlen);
	if (!ret)
		ret = resolve_in_place("meta folder", &c->meta, false, err, errlen);
	return ret;
}

void fs_config_free(struct fs_config *c)
{
	char **strs[] = {&c->dram_s,	      &c->nvme_s,	   &c->block_s,	  &c->meta_s,
			 &c->threads_s,	      &c->engine_s,	   &c->dirty_s,	  &c->qd_s,
			 &c->flush_delay_s,   &c->sync_interval_s, &c->config_file, &c->logfile,
			 &c->log_level_s,     &c->source,	   &c->mountpoint, &c->meta,
			 &c->remote_s,	      &c->endpoint_s,	   &c->region_s,  &c->s3_addressing_s,
			 &c->remote_timeout_s, &c->nvme_bw_s,	   &c->nvme_cap_s, &c->remote_bw_s,
			 &c->remote_cap_s,    &c->s3_key,	   &c->s3_token,  &c->s3_bucket,
			 &c->s3_prefix,	      &c->s3_bw_s,	   &c->s3_cap_s,  &c->pfs_bw_s,
			 &c->pfs_cap_s,	      &c->dedup_s,	   &c->policy_s,  &c->readahead_s,
			 &c->prefetch_s, &c->cuda_s, &c->dirty_expire_s, &c->remote_readahead_s,
			 &c->s3_object_s, &c->lock_wait_s, &c->sync_commits_s, &c->punch_after_s,
			 &c->stall_wait_s, &c->checksum_s, &c->scratch_s};

	if (c->s3_secret) {
		/* Do not leave the secret in freed memory. */
		explicit_bzero(c->s3_secret, strlen(c->s3_secret));
		free(c->s3_secret);
		c->s3_secret = NULL;
	}
	if (c->s3_token) /* a session token is a credential too; freed below */
		explicit_bzero(c->s3_token, strlen(c->s3_token));

	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
		free(*strs[i]);
		*strs[i] = NULL;
	}
	for (unsigned i = 0; i < c->n_nvme; i++)
		free(c->nvme[i]);
	c->n_nvme = 0;
	for (unsigned i = 0; i < c->n_pfs; i++)
		free(c->remote_path[i]);
	c->n_pfs = 0;
}
