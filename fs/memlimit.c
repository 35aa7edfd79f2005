/*
 * memlimit.c - the memory limit of the cgroup the daemon runs in
 * (memlimit.h). Read the way the kernel's documentation describes the
 * files (Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/memory.rst):
 * /proc/self/cgroup names the cgroup; its folder under /sys/fs/cgroup (v2)
 * or /sys/fs/cgroup/memory (v1) holds the limit. Inside a container the
 * cgroup's path may name a folder that its own view of /sys/fs/cgroup does
 * not have; the view's top folder is then the container's cgroup.
 */
#include "memlimit.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NO_LIMIT (1ULL << 60) /* v1 writes "no limit" as a page-rounded LLONG_MAX */

/* One number, or "max" (UINT64_MAX), the first line of path. */
static int read_u64(const char *path, uint64_t *v)
{
	FILE *f = fopen(path, "r");
	char line[64];
	int ret = -EINVAL;

	if (!f)
		return -errno;
	if (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "max", 3) == 0) {
			*v = UINT64_MAX;
			ret = 0;
		} else if (sscanf(line, "%" SCNu64, v) == 1) {
			ret = 0;
		}
	}
	fclose(f);
	return ret;
}

/* The value of "key N" in a memory.stat file; 0 when it has none. */
static uint64_t stat_field(const char *path, const char *key)
{
	FILE *f = fopen(path, "r");
	char line[256];
	size_t n = strlen(key);
	uint64_t v = 0;

	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, key, n) == 0 && line[n] == ' ') {
			if (sscanf(line + n + 1, "%" SCNu64, &v) != 1)
				v = 0;
			break;
		}
	if (f)
		fclose(f);
	return v;
}

static bool is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether the comma-separated list has the word memory. */
static bool lists_memory(const char *list, size_t len)
{
	for (const char *p = list, *end = list + len; p < end;) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		size_t n = comma ? (size_t)(comma - p) : (size_t)(end - p);

		if (n == 6 && strncmp(p, "memory", 6) == 0)
			return true;
		p += n + 1;
	}
	return false;
}

/*
 * From root's /proc/self/cgroup: the v1 memory controller's cgroup into
 * v1 (empty: none), the v2 cgroup into v2.
 */
static int cgroup_paths(const char *root, char *v1, char *v2, size_t len)
{
	char path[PATH_MAX], line[PATH_MAX + 64];
	FILE *f;

	snprintf(path, sizeof(path), "%s/proc/self/cgroup", root);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	v1[0] = v2[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

		if (!c2)
			continue;
		line[strcspn(line, "\n")] = 0;
		char *to = NULL;
		size_t n = strlen(c2 + 1);

		if (lists_memory(c1 + 1, (size_t)(c2 - c1 - 1)))
			to = v1;
		else if (c1 == line + 1 && line[0] == '0' && c2 == c1 + 1)
			to = v2;
		if (to && n < len)
			memcpy(to, c2 + 1, n + 1);
	}
	fclose(f);
	return 0;
}

/* The cgroup's folder under base, or base where the view does not have it. */
static void leaf_dir(char *out, size_t len, const char *base, const char *cg)
{
	snprintf(out, len, "%s%s", base, strcmp(cg, "/") == 0 ? "" : cg);
	if (!is_dir(out))
		snprintf(out, len, "%s", base);
}

/* m->limit and m->file: the lowest of the files called name from leaf up to base. */
static void lowest_up(struct fs_memlimit *m, const char *base, const char *leaf, const char *name)
{
	char dir[PATH_MAX], path[PATH_MAX + 32];
	uint64_t v;
	char *slash;

	m->limit = UINT64_MAX;
	snprintf(dir, sizeof(dir), "%s", leaf);
	for (;;) {
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		if (read_u64(path, &v) == 0 && v < m->limit) {
			m->limit = v;
			snprintf(m->file, sizeof(m->file), "%s", path);
		}
		if (strcmp(dir, base) == 0 || !(slash = strrchr(dir, '/')) ||
		    (size_t)(slash - dir) < strlen(base))
			return;
		*slash = 0;
	}
}

/* m->working_set: leaf's usage file less the inactive file pages its memory.stat counts. */
static void working_set(struct fs_memlimit *m, const char *leaf, const char *usage_name,
			const char *inactive_key)
{
	char path[PATH_MAX + 32];
	uint64_t usage, inactive;

	snprintf(path, sizeof(path), "%s/%s", leaf, usage_name);
	if (read_u64(path, &usage) != 0)
		usage = 0;
	snprintf(path, sizeof(path), "%s/memory.stat", leaf);
	inactive = stat_field(path, inactive_key);
	m->working_set = usage > inactive ? usage - inactive : 0;
}

static int read_v1(const char *root, const char *cg, struct fs_memlimit *m)
{
	char base[PATH_MAX], leaf[PATH_MAX], path[PATH_MAX + 32];
	uint64_t hier;

	snprintf(base, sizeof(base), "%s/sys/fs/cgroup/memory", root);
	leaf_dir(leaf, sizeof(leaf), base, cg);
	lowest_up(m, base, leaf, "memory.limit_in_bytes");
	/* The limit the kernel applies, where the view hides the folders above. */
	snprintf(path, sizeof(path), "%s/memory.stat", leaf);
	hier = stat_field(path, "hierarchical_memory_limit");
	if (hier && hier < m->limit) {
		m->limit = hier;
		snprintf(m->file, sizeof(m->file), "%s", path);
	}
	if (m->limit >= NO_LIMIT)
		return -ENOENT;
	working_set(m, leaf, "memory.usage_in_bytes", "total_inactive_file");
	return 0;
}

static int read_v2(const char *root, const char *cg, struct fs_memlimit *m)
{
	char base[PATH_MAX], leaf[PATH_MAX];

	snprintf(base, sizeof(base), "%s/sys/fs/cgroup", root);
	leaf_dir(leaf, sizeof(leaf), base, cg);
	lowest_up(m, base, leaf, "memory.max");
	if (m->limit >= NO_LIMIT)
		return -ENOENT;
	working_set(m, leaf, "memory.current", "inactive_file");
	return 0;
}

int fs_memlimit_read(const char *root, struct fs_memlimit *m)
{
	char v1[PATH_MAX], v2[PATH_MAX];

	memset(m, 0, sizeof(*m));
	if (cgroup_paths(root, v1, v2, sizeof(v1)) != 0)
		return -ENOENT;
	/* A hybrid host keeps memory on v1 and only systemd's tree on v2. */
	if (v1[0])
		return read_v1(root, v1, m);
	if (v2[0])
		return read_v2(root, v2, m);
	return -ENOENT;
}
