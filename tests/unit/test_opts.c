/* Unit test of option parsing: sizes, ranges, the INI file, precedence. */
#include "opts.h"
#include "test.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	CHECK(f);
	fputs(text, f);
	fclose(f);
}

static int resolve(struct fs_config *c, const char *nvme, char *err)
{
	c->nvme_s = strdup(nvme);
	return fs_config_resolve(c, err, 512);
}

int main(void)
{
	char dir[] = "/tmp/tfs-opts.XXXXXX", path[256], err[512];
	struct fs_config c;
	size_t v;

	CHECK_EQ(fs_parse_size("4096", &v), 0);
	CHECK_EQ(v, 4096);
	CHECK_EQ(fs_parse_size("64K", &v), 0);
	CHECK_EQ(v, 65536);
	CHECK_EQ(fs_parse_size("1m", &v), 0);
	CHECK_EQ(v, 1 << 20);
	CHECK_EQ(fs_parse_size("16GiB", &v), 0);
	CHECK_EQ(v, 16ULL << 30);
	CHECK_EQ(fs_parse_size("2T", &v), 0);
	CHECK_EQ(v, 2ULL << 40);
	CHECK_EQ(fs_parse_size("12Q", &v), -EINVAL);
	CHECK_EQ(fs_parse_size("", &v), -EINVAL);
	CHECK_EQ(fs_parse_size("-1G", &v), -EINVAL);
	CHECK_EQ(fs_parse_size("G", &v), -EINVAL);
	CHECK_EQ(fs_parse_size("99999999999999T", &v), -ERANGE);

	CHECK(mkdtemp(dir));

	/* Good values resolve, defaults fill the rest. */
	memset(&c, 0, sizeof(c));
	c.dram_s = strdup("512M");
	CHECK_EQ(resolve(&c, dir, err), 0);
	CHECK_EQ(c.dram, 512 << 20);
	CHECK_EQ(c.block, 1 << 20);
	CHECK_EQ(c.threads, 32);
	CHECK_EQ(c.n_nvme, 1);
	CHECK(strstr(c.meta, "/meta") != NULL);
	fs_config_free(&c);

	/* Each bad value is refused and named. */
	const char *bad[][2] = {{"block", "3K"}, {"block", "1T"},     {"block", "2K"},
				{"dram", "12Q"}, {"dram", ""},	      {"threads", "0"},
				{"threads", "x"}, {"nvme_engine", "spdk"}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&c, 0, sizeof(c));
		char **field = strcmp(bad[i][0], "block") == 0	     ? &c.block_s
			       : strcmp(bad[i][0], "dram") == 0	     ? &c.dram_s
			       : strcmp(bad[i][0], "threads") == 0 ? &c.threads_s
								   : &c.engine_s;
		*field = strdup(bad[i][1]);
		CHECK_EQ(resolve(&c, dir, err), -EINVAL);
		CHECK(strstr(err, bad[i][0]) != NULL);
		fs_config_free(&c);
	}

	/* A missing nvme folder, and one listed twice. */
	memset(&c, 0, sizeof(c));
	snprintf(path, sizeof(path), "%s/nope", dir);
	CHECK(resolve(&c, path, err) < 0);
	CHECK(strstr(err, "nope") != NULL);
	fs_config_free(&c);
	memset(&c, 0, sizeof(c));
	snprintf(path, sizeof(path), "%s:%s", dir, dir);
	CHECK_EQ(resolve(&c, path, err), -EINVAL);
	CHECK(strstr(err, "twice") != NULL);
	fs_config_free(&c);

	/* The INI file fills what -o left unset, and -o wins. */
	snprintf(path, sizeof(path), "%s/tensorfs.conf", dir);
	write_file(path, "[tensorfs]\ndram = 1G\nblock = 256K\nthreads = 8\n");
	memset(&c, 0, sizeof(c));
	c.threads_s = strdup("4");
	CHECK_EQ(fs_config_load_file(&c, path, err, sizeof(err)), 0);
	CHECK_EQ(resolve(&c, dir, err), 0);
	CHECK_EQ(c.dram, 1 << 30);
	CHECK_EQ(c.block, 256 << 10);
	CHECK_EQ(c.threads, 4);
	fs_config_free(&c);

	write_file(path, "[tensorfs]\ndram = 1G\nfrobnicate = 1\n");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(fs_config_load_file(&c, path, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "frobnicate") != NULL && strstr(err, "line 3") != NULL);
	fs_config_free(&c);

	write_file(path, "[other]\ndram = 1G\n");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(fs_config_load_file(&c, path, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "section") != NULL);
	fs_config_free(&c);

	memset(&c, 0, sizeof(c));
	snprintf(path, sizeof(path), "%s/missing.conf", dir);
	CHECK(fs_config_load_file(&c, path, err, sizeof(err)) < 0);
	CHECK(strstr(err, "missing.conf") != NULL);
	fs_config_free(&c);

	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	CHECK_EQ(system(path), 0);
	return 0;
}
