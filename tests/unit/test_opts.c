/*
 * Unit test of option parsing: sizes, ranges, the INI file, precedence;
 * the bound on dram=; endpoints, whose refusals never show the value;
 * config files that are not regular files of ours; and lock_wait=.
 */
#include "meta.h"
#include "opts.h"
#include "test.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
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

/* Resolve with an s3 tier at endpoint; credentials as if from the environment. */
static int resolve_endpoint(struct fs_config *c, const char *dir, const char *endpoint, bool remote,
			    char *err)
{
	c->endpoint_s = strdup(endpoint);
	if (remote)
		c->remote_s = strdup("s3://bucket/p");
	c->s3_key = strdup("key");
	c->s3_secret = strdup("secret");
	return resolve(c, dir, err);
}

static void endpoints(const char *dir)
{
	const char *refused[][2] = {
	    {"HTTP://a:Secret42@127.0.0.1:1/", "user or password"},
	    {"ftp://u:Secret42@h/", "user or password"},
	    {"http://:Secret42@h:9000", "user or password"},
	    {"https://Secret42@h", "user or password"},
	    {"http://h:9000/?X-Amz-Signature=Secret42", "query"},
	    {"http://h:9000/#Secret42", "fragment"},
	    {"ftp://Secret42.example/", "http:// or https://"},
	    {"http://u:p wSecret42@h", "not a URL"},
	    {"Secret42", "not a URL"},
	};
	struct fs_config c;
	char err[512];

	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		memset(&c, 0, sizeof(c));
		err[0] = 0;
		CHECK_EQ(resolve_endpoint(&c, dir, refused[i][0], true, err), -EINVAL);
		CHECK(strstr(err, "endpoint") && strstr(err, refused[i][1]));
		CHECK(!strstr(err, "Secret42"));
		fs_config_free(&c);
	}
	/* Without remote= it is refused too, and not shown either. */
	memset(&c, 0, sizeof(c));
	CHECK_EQ(resolve_endpoint(&c, dir, "http://u:Secret42@h", false, err), -EINVAL);
	CHECK(!strstr(err, "Secret42"));
	fs_config_free(&c);
	memset(&c, 0, sizeof(c));
	CHECK_EQ(resolve_endpoint(&c, dir, "http://h:9000", false, err), -EINVAL);
	CHECK(strstr(err, "without remote="));
	fs_config_free(&c);

	/* The scheme in any case, a port, a path. */
	const char *good[] = {"HTTP://127.0.0.1:9000", "https://s3.example.com/base/",
			      "Https://[::1]:9000"};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		memset(&c, 0, sizeof(c));
		CHECK_EQ(resolve_endpoint(&c, dir, good[i], true, err), 0);
		CHECK(c.has_s3 && strcmp(c.s3.endpoint, good[i]) == 0);
		fs_config_free(&c);
	}
}

static void dram_bound(const char *dir)
{
	unsigned long long total =
	    (unsigned long long)sysconf(_SC_PHYS_PAGES) * (unsigned long long)sysconf(_SC_PAGESIZE);
	struct fs_config c;
	char err[512], v[64];

	memset(&c, 0, sizeof(c));
	snprintf(v, sizeof(v), "%lluK", total * 2 >> 10);
	c.dram_s = strdup(v);
	CHECK_EQ(resolve(&c, dir, err), -EINVAL);
	CHECK(strstr(err, "dram") && strstr(err, v) && strstr(err, "more than 90%"));
	fs_config_free(&c);

	memset(&c, 0, sizeof(c));
	snprintf(v, sizeof(v), "%lluK", total / 100 * 91 >> 10);
	c.dram_s = strdup(v);
	CHECK_EQ(resolve(&c, dir, err), -EINVAL);
	fs_config_free(&c);

	memset(&c, 0, sizeof(c));
	snprintf(v, sizeof(v), "%lluK", total / 100 * 89 >> 10);
	c.dram_s = strdup(v);
	CHECK_EQ(resolve(&c, dir, err), 0);
	fs_config_free(&c);
}

/* lock_wait= takes whole seconds from 0 to a day; the default is META_LOCK_WAIT_S. */
static void lock_wait(const char *dir)
{
	const char *bad[] = {"-1", "1.5", "1m", "86401", "x", ""};
	const struct {
		const char *s;
		unsigned secs;
	} good[] = {{NULL, META_LOCK_WAIT_S}, {"0", 0}, {"30", 30}, {"30s", 30}, {"86400", 86400}};
	struct fs_config c;
	char err[512];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&c, 0, sizeof(c));
		c.lock_wait_s = strdup(bad[i]);
		CHECK_EQ(resolve(&c, dir, err), -EINVAL);
		CHECK(strstr(err, "lock_wait") != NULL);
		fs_config_free(&c);
	}
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		memset(&c, 0, sizeof(c));
		c.lock_wait_s = good[i].s ? strdup(good[i].s) : NULL;
		CHECK_EQ(resolve(&c, dir, err), 0);
		CHECK_EQ(c.lock_wait_secs, good[i].secs);
		fs_config_free(&c);
	}
}

/* config=path is refused before it is read, saying why. */
static void config_refused(const char *path, const char *why)
{
	struct fs_config c;
	char err[512] = "";

	memset(&c, 0, sizeof(c));
	CHECK(fs_config_load_file(&c, path, err, sizeof(err)) < 0);
	if (!strstr(err, path) || !strstr(err, why)) {
		fprintf(stderr, "config=%s: '%s' does not say '%s'\n", path, err, why);
		exit(1);
	}
	fs_config_free(&c);
}

static void config_files(const char *dir)
{
	char path[256], link[256];

	config_refused(dir, "not a regular file (it is a folder)");
	config_refused("/dev/zero", "not a regular file (it is a character device)");
	snprintf(path, sizeof(path), "%s/fifo.conf", dir);
	CHECK_EQ(mkfifo(path, 0600), 0);
	config_refused(path, "not a regular file (it is a FIFO)"); /* at once, no writer needed */
	snprintf(path, sizeof(path), "%s/gw.conf", dir);
	write_file(path, "[tensorfs]\nthreads = 4\n");
	CHECK_EQ(chmod(path, 0620), 0);
	config_refused(path, "writable by group or others (mode 620)");
	CHECK_EQ(chmod(path, 0644), 0);
	snprintf(link, sizeof(link), "%s/link.conf", dir);
	CHECK_EQ(symlink(path, link), 0);
	config_refused(link, "symbolic link");
	if (geteuid() == 0) {
		snprintf(path, sizeof(path), "%s/other.conf", dir);
		write_file(path, "[s3]\naccess_key_id = k\nsecret_access_key = s\n");
		CHECK_EQ(chmod(path, 0600), 0);
		CHECK_EQ(chown(path, 65534, 65534), 0);
		config_refused(path, "owned by uid 65534");
	}
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
	CHECK_EQ(fs_parse_size("1GB", &v), 0);
	CHECK_EQ(v, 1ULL << 30);
	CHECK_EQ(fs_parse_size("1Gb", &v), -EINVAL); /* bits: refused, as 1.5G is */
	CHECK_EQ(fs_parse_size("1Gib", &v), -EINVAL);
	CHECK_EQ(fs_parse_size("1.5G", &v), -EINVAL);
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
	CHECK_EQ(c.sync_commits, 256);
	CHECK(c.checksum); /* reads are checked unless checksum=off */
	CHECK_EQ(c.punch_after_ms, 10000);
	fs_config_free(&c);

	/* The sync point's count and the space's return take their bounds. */
	memset(&c, 0, sizeof(c));
	c.sync_commits_s = strdup("1000");
	c.punch_after_s = strdup("0");
	CHECK_EQ(resolve(&c, dir, err), 0);
	CHECK_EQ(c.sync_commits, 1000);
	CHECK_EQ(c.punch_after_ms, 0);
	fs_config_free(&c);
	memset(&c, 0, sizeof(c));
	c.sync_commits_s = strdup("0");
	CHECK_EQ(resolve(&c, dir, err), -EINVAL);
	CHECK(strstr(err, "sync_commits") != NULL);
	fs_config_free(&c);
	memset(&c, 0, sizeof(c));
	c.punch_after_s = strdup("-1");
	CHECK_EQ(resolve(&c, dir, err), -EINVAL);
	CHECK(strstr(err, "punch_after_ms") != NULL);
	fs_config_free(&c);

	/* checksum= takes on or off, nothing else. */
	memset(&c, 0, sizeof(c));
	c.checksum_s = strdup("off");
	CHECK_EQ(resolve(&c, dir, err), 0);
	CHECK(!c.checksum);
	fs_config_free(&c);
	memset(&c, 0, sizeof(c));
	c.checksum_s = strdup("yes");
	CHECK_EQ(resolve(&c, dir, err), -EINVAL);
	CHECK(strstr(err, "checksum") && strstr(err, "on or off"));
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

	endpoints(dir);
	dram_bound(dir);
	config_files(dir);
	lock_wait(dir);

	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	CHECK_EQ(system(path), 0);
	return 0;
}
