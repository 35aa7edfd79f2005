/*
 * fuzz_cfg.c - the harness of the configuration targets (fuzz_cfg.h).
 */
#include "fuzz_cfg.h"
#include "log.h"

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

static char home[PATH_MAX];

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* The home and whatever the targets made in it go at exit: each run left one behind. */
static void remove_home(void)
{
	nftw(home, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

void fuzz_cfg_setup(const char *target, bool env_credentials)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(home, sizeof(home), "%s/tfs-fuzz-home-%s.XXXXXX", tmp && *tmp ? tmp : "/tmp",
		 target);
	if (!mkdtemp(home))
		abort();
	atexit(remove_home);
	setenv("XDG_DATA_HOME", home, 1);
	unsetenv("AWS_SESSION_TOKEN");
	if (env_credentials) {
		setenv("AWS_ACCESS_KEY_ID", "FUZZKEY", 1);
		setenv("AWS_SECRET_ACCESS_KEY", "fuzz-secret", 1);
	} else {
		unsetenv("AWS_ACCESS_KEY_ID");
		unsetenv("AWS_SECRET_ACCESS_KEY");
	}
	log_set_level(LOG_LVL_ERR);
}

void fuzz_cfg_check(const struct fs_config *c)
{
	if (c->block < 4096 || (c->block & (c->block - 1)) || !c->dram || !c->meta)
		abort();
	if (c->n_devs > FS_MAX_NVME + FS_MAX_REMOTES || c->n_nvme > FS_MAX_NVME)
		abort();
	for (unsigned i = 0; i < c->n_devs; i++)
		if (c->devs[i].kind != TB_KIND_S3 && !c->devs[i].path)
			abort();
	if (c->has_s3 && (!c->s3.bucket || !c->s3.region || !c->s3.access_key))
		abort();
}
