/*
 * fuzz_cfg.h - the harness that the configuration targets share:
 * fuzz_opts (mount options) and fuzz_config (the INI file). It gives each
 * a home of its own for default folders, the credentials it wants in the
 * environment and a quiet log, and checks what a configuration that
 * fs_config_resolve accepted promises the rest of the daemon.
 */
#ifndef TENSORFS_FUZZ_CFG_H
#define TENSORFS_FUZZ_CFG_H

#include "opts.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Before the first input: XDG_DATA_HOME in a fresh folder
 * $TMPDIR/tfs-fuzz-home-TARGET.XXXXXX (/tmp without TMPDIR), removed at
 * exit, so that a default nvme folder is made there and never in a real
 * home; AWS credentials in the environment, or none; only errors logged.
 */
void fuzz_cfg_setup(const char *target, bool env_credentials);
/* Abort unless a resolved configuration is one the daemon can run with. */
void fuzz_cfg_check(const struct fs_config *c);

#endif
