/*
 * fuzz_opts.c - libFuzzer target: mount options, as the daemon parses them.
 *
 * The input is a list of lines; each becomes one -o argument of a command
 * line "tensorfs -o LINE ... MOUNTPOINT", parsed by fuse_opt with the
 * daemon's own option table, then checked and resolved by
 * fs_config_resolve and precheck, and freed. The table and its callback
 * are static in fs/main.c, so this file includes it (with its main()
 * renamed) rather than fuzz a copy that could drift from it. Nothing is
 * mounted: the mount point does not exist and is never looked at.
 *
 * Besides crashes and leaks, it checks what a resolved configuration
 * promises the rest of the daemon.
 */
#define main tensorfs_main
#include "main.c"
#undef main

#include <stdint.h>
#include <stdlib.h>

#define FUZZ_MAX_OPTS 32

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_home[] = "/tmp/tfs-fuzz-opts.XXXXXX";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* A default nvme folder is created under here, never in a real home. */
	if (!mkdtemp(fuzz_home))
		abort();
	setenv("XDG_DATA_HOME", fuzz_home, 1);
	setenv("AWS_ACCESS_KEY_ID", "FUZZKEY", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "fuzz-secret", 1);
	log_set_level(LOG_LVL_ERR);
	return 0;
}

static void check_resolved(const struct fs_config *c)
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size + 1), *argv[2 + 2 * FUZZ_MAX_OPTS + 1], *save = NULL;
	struct fs_config cfg = {0};
	char err[1024];
	int argc = 0;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	buf[size] = 0;
	argv[argc++] = "tensorfs";
	for (char *line = strtok_r(buf, "\n", &save); line && argc < 1 + 2 * FUZZ_MAX_OPTS;
	     line = strtok_r(NULL, "\n", &save)) {
		argv[argc++] = "-o";
		argv[argc++] = line;
	}
	argv[argc++] = "/nonexistent/tfs-fuzz-mnt";
	argv[argc] = NULL;

	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);

	if (fuse_opt_parse(&args, &cfg, tfs_opts, opt_proc) == 0 && !cfg.show_help &&
	    !cfg.show_version && fs_config_resolve(&cfg, err, sizeof(err)) == 0) {
		check_resolved(&cfg);
		precheck(&cfg, err, sizeof(err));
	}
	fuse_opt_free_args(&args);
	fs_config_free(&cfg);
	free(buf);
	return 0;
}
