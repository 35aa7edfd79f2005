/*
 * where.c - tfsctl where: the bytes of a file, or of every file under a
 * folder, that each tier holds.
 *
 * Each regular file reports its own placement in the user.tensorfs.tiers
 * xattr, a JSON object of tier name to bytes, plus "allocated": the bytes
 * of the whole blocks it holds, what st_blocks and du count. A folder's is
 * the sum over the files under it, walked with nftw without leaving the
 * mount.
 */
#include "tfsctl.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#define XATTR_MAX 4096 /* a few tiers' names and numbers */
#define WALK_FDS 32
#define ALLOCATED "allocated" /* not a tier: the bytes of the blocks held */

/* nftw passes no argument to its callback: the walk's totals live here. */
static struct {
	json_t *tiers; /* name -> bytes, in the order first seen */
	uint64_t files, size, allocated;
	bool failed;
} sum;

static int add_file(const char *path, const struct stat *st)
{
	char buf[XATTR_MAX];
	ssize_t n = getxattr(path, TIERS_XATTR, buf, sizeof(buf) - 1);
	const char *tier;
	json_t *j, *v;

	if (n < 0 && errno == ENOENT)
		return 0; /* removed while we walked */
	if (n < 0) {
		if (errno == ENODATA || errno == ENOTSUP)
			errmsg("%s: no %s xattr; is the mount older than where?", path,
			       TIERS_XATTR);
		else
			errmsg("%s: %s", path, strerror(errno));
		return -1;
	}
	j = json_loadb(buf, (size_t)n, 0, NULL);
	if (!json_is_object(j)) {
		errmsg("%s: %s is not the JSON object expected", path, TIERS_XATTR);
		json_decref(j);
		return -1;
	}
	json_object_foreach(j, tier, v) {
		json_t *have = json_object_get(sum.tiers, tier);
		uint64_t add = jint(j, tier);

		if (strcmp(tier, ALLOCATED) == 0)
			sum.allocated += add;
		else if (have)
			json_integer_set(have, json_integer_value(have) + (json_int_t)add);
		else
			json_object_set_new(sum.tiers, tier, json_integer((json_int_t)add));
	}
	json_decref(j);
	sum.files++;
	sum.size += (uint64_t)st->st_size;
	return 0;
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)ftw;
	if (type == FTW_DNR || type == FTW_NS) {
		errmsg("%s: cannot read it: %s", path, strerror(errno));
		sum.failed = true;
		return 0;
	}
	if (type == FTW_F && S_ISREG(st->st_mode) && add_file(path, st) < 0)
		sum.failed = true;
	return 0;
}

int cmd_where(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;
	char target[PATH_MAX + 32], real[PATH_MAX];
	struct stat st;
	int status = 0;

	if (argc != 1) {
		errmsg("where takes one PATH");
		fprintf(stderr, "usage: tfsctl where [--json] PATH\n");
		return EXIT_USAGE;
	}
	if (tfs_find_mount(a->mopt, argv[0], &m) < 0 ||
	    tfs_ctl_target(&m, argv[0], target, sizeof(target)) < 0)
		return EXIT_RUNTIME;
	if (!realpath(argv[0], real) || stat(real, &st) < 0) {
		errmsg("%s: %s", argv[0], strerror(errno));
		return EXIT_RUNTIME;
	}
	sum.tiers = json_object();
	if (S_ISREG(st.st_mode))
		sum.failed = add_file(real, &st) < 0;
	else if (S_ISDIR(st.st_mode))
		nftw(real, visit, WALK_FDS, FTW_PHYS | FTW_MOUNT);
	else
		errmsg("%s: not a file or folder", argv[0]), sum.failed = true;
	if (sum.failed) {
		status = EXIT_RUNTIME;
		goto out;
	}
	if (a->json) {
		json_t *j = json_pack("{sssIsIsIsO}", "path", real, "files", (json_int_t)sum.files,
				      "size", (json_int_t)sum.size, ALLOCATED,
				      (json_int_t)sum.allocated, "tiers", sum.tiers);

		tfs_print_json(j);
		goto out;
	}

	const char *tier;
	json_t *v;
	char h[16];

	fmt_bytes(sum.size, h, sizeof(h));
	print_name("", argv[0]);
	printf(": %llu file%s, %s (%llu bytes)\n", (unsigned long long)sum.files,
	       sum.files == 1 ? "" : "s", h, (unsigned long long)sum.size);
	json_object_foreach(sum.tiers, tier, v) {
		uint64_t b = (uint64_t)json_integer_value(v);
		char pct[16];

		fmt_bytes(b, h, sizeof(h));
		if (sum.size)
			fmt_pct((double)b / (double)sum.size, pct, sizeof(pct));
		else
			snprintf(pct, sizeof(pct), "-");
		printf("  %-8s %9s  (%llu bytes, %s of its size)\n", tier, h, (unsigned long long)b,
		       pct);
	}
	fmt_bytes(sum.allocated, h, sizeof(h));
	printf("  %s %s in whole blocks (%llu bytes): what du counts\n", ALLOCATED, h,
	       (unsigned long long)sum.allocated);
out:
	json_decref(sum.tiers);
	return status;
}
