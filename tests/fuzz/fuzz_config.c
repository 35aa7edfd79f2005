/*
 * fuzz_config.c - libFuzzer target: the INI config file (-o config=FILE).
 *
 * The first byte of the input picks the file's mode (0600, or readable by
 * others, which a file with credentials must not be) and whether -o gave a
 * remote= already (the file's then loses); the rest is the file, read by
 * fs_config_load_file from a memfd, then resolved and freed. It checks
 * that a file readable by others is never accepted with a secret in it,
 * and, as fuzz_opts does (fuzz_cfg.c), what a resolved configuration
 * promises.
 */
#include "fuzz_cfg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_cfg_setup("config", false); /* credentials only from the file */
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fs_config cfg = {0};
	char path[64], err[1024] = "";
	bool private_mode;
	int fd, ret;

	if (size < 1)
		return 0;
	private_mode = !(data[0] & 1);
	if (data[0] & 2)
		fs_config_add_remote(&cfg, "s3://cmdline-bucket");
	fd = memfd_create("tfs-fuzz-config", MFD_CLOEXEC);
	if (fd < 0)
		abort();
	if (fchmod(fd, private_mode ? 0600 : 0644) < 0 ||
	    write(fd, data + 1, size - 1) != (ssize_t)(size - 1))
		abort();
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ret = fs_config_load_file(&cfg, path, err, sizeof(err));
	if (ret == 0) {
		/* Credentials are refused from a file that others can read. */
		if (!private_mode && (cfg.s3_secret || cfg.s3_key || cfg.s3_token))
			abort();
		if (fs_config_resolve(&cfg, err, sizeof(err)) == 0)
			fuzz_cfg_check(&cfg);
	} else if (!err[0]) {
		abort(); /* every refusal says why */
	}
	close(fd);
	fs_config_free(&cfg);
	return 0;
}
