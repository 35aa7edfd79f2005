/*
 * fuzz_opts.c - libFuzzer target: mount options, as the daemon parses them.
 *
 * The input is a list of lines; each becomes one -o argument of a command
 * line "tensorfs -o LINE ... MOUNTPOINT", parsed by fuse_opt with the
 * daemon's own option table, then checked and resolved by
 * fs_config_resolve and precheck, and freed. The table and its callback
 * are static in fs/cmdline.c, and precheck in fs/main.c, so this file
 * includes both (main() renamed) rather than fuzz a copy that could drift
 * from them. Nothing is mounted: the mount point does not exist and is
 * never looked at.
 *
 * Besides crashes and leaks, it checks what a resolved configuration
 * promises the rest of the daemon (fuzz_cfg.c, shared with fuzz_config).
 */
#define main tensorfs_main
#include "main.c"
#undef main
#include "cmdline.c"

#include "fuzz_cfg.h"

#include <stdint.h>
#include <stdlib.h>

#define FUZZ_MAX_OPTS 32

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_cfg_setup("opts", true); /* s3 options find credentials */
	return 0;
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
		fuzz_cfg_check(&cfg);
		precheck(&cfg, err, sizeof(err));
	}
	fuse_opt_free_args(&args);
	fs_config_free(&cfg);
	free(buf);
	return 0;
}
