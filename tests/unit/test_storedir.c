/*
 * Unit test of the checks on folders that hold store files
 * (tiers/storedir.c) and of their use by meta_open and the device folders:
 * a folder that another user owns or can write is refused; a link, a FIFO,
 * a folder, another user's file or a file open to others under a store
 * file's name is refused, never followed and never blocked on; new files
 * are mode 600; a refused open makes nothing. The parts that need another
 * owner run as root only.
 */
#include "meta.h"
#include "storedir.h"
#include "tb.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OTHER_UID 65534

static char base[] = "/tmp/tfs-storedir.XXXXXX";

/* base/name; the result lives until eight more calls have been made. */
static const char *at(const char *name)
{
	static char paths[8][512];
	static int next;
	char *p = paths[next++ % 8];

	snprintf(p, sizeof(paths[0]), "%s/%s", base, name);
	return p;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");

	CHECK(f);
	fputs(text, f);
	fclose(f);
	CHECK_EQ(chmod(path, mode), 0);
}

static bool file_is(const char *path, const char *text)
{
	char buf[256] = "";
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return strcmp(buf, text) == 0;
}

static void folders(void)
{
	char dir[512], err[512] = "";
	bool made = false;
	int fd;

	snprintf(dir, sizeof(dir), "%s/d", base);

	/* A missing folder passes the check, and is made 0700 when opened. */
	CHECK_EQ(storedir_check("meta folder", dir, NULL, err, sizeof(err)), 0);
	fd = storedir_open("meta folder", dir, true, &made, err, sizeof(err));
	CHECK(fd >= 0 && made);
	close(fd);
	struct stat st;
	CHECK_EQ(stat(dir, &st), 0);
	CHECK_EQ(st.st_mode & 07777, 0700);

	/* 755 is fine; writable by group or others is not. */
	CHECK_EQ(chmod(dir, 0755), 0);
	fd = storedir_open("meta folder", dir, false, NULL, err, sizeof(err));
	CHECK(fd >= 0);
	close(fd);
	mode_t bad_modes[] = {0777, 0775, 0757, 01777};
	for (size_t i = 0; i < sizeof(bad_modes) / sizeof(bad_modes[0]); i++) {
		CHECK_EQ(chmod(dir, bad_modes[i]), 0);
		err[0] = 0;
		CHECK_EQ(storedir_open("meta folder", dir, false, NULL, err, sizeof(err)), -EPERM);
		CHECK(strstr(err, dir) && strstr(err, "writable by group or others"));
		CHECK_EQ(storedir_check("meta folder", dir, NULL, err, sizeof(err)), -EPERM);
	}
	CHECK_EQ(chmod(dir, 0700), 0);

	/* A file where a folder should be. */
	write_file(at("file"), "x", 0600);
	CHECK_EQ(storedir_check("nvme folder", at("file"), NULL, err, sizeof(err)), -ENOTDIR);
	CHECK(strstr(err, "not a directory"));

	if (geteuid() != 0)
		return;
	CHECK_EQ(chown(dir, OTHER_UID, OTHER_UID), 0);
	CHECK_EQ(storedir_open("nvme folder", dir, false, NULL, err, sizeof(err)), -EPERM);
	CHECK(strstr(err, "nvme folder") && strstr(err, "owned by uid 65534"));
	CHECK_EQ(chown(dir, 0, 0), 0);
}

static void files(void)
{
	const char *names[] = {"a", "b", NULL};
	char dir[512], err[512] = "";
	struct stat st;
	bool created;
	int dfd, fd;

	snprintf(dir, sizeof(dir), "%s/f", base);

	CHECK_EQ(mkdir(dir, 0755), 0);
	dfd = storedir_open("nvme folder", dir, false, NULL, err, sizeof(err));
	CHECK(dfd >= 0);

	/* Made 0600 with O_EXCL, then opened as it is. */
	fd = storedir_open_file(dfd, "nvme folder", dir, "a", O_RDWR, true, &created, err,
				sizeof(err));
	CHECK(fd >= 0 && created);
	CHECK_EQ(fstat(fd, &st), 0);
	CHECK_EQ(st.st_mode & 0777, 0600);
	CHECK((fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
	close(fd);
	fd = storedir_open_file(dfd, "nvme folder", dir, "a", O_RDWR, true, &created, err,
				sizeof(err));
	CHECK(fd >= 0 && !created);
	close(fd);
	CHECK_EQ(storedir_open_file(dfd, "nvme folder", dir, "b", O_RDONLY, false, NULL, err,
				    sizeof(err)),
		 -ENOENT);
	CHECK_EQ(storedir_check("nvme folder", dir, names, err, sizeof(err)), 0);

	/* A link is never followed: not to a file, not to where none is yet. */
	write_file(at("target"), "precious", 0600);
	CHECK_EQ(symlink(at("target"), at("f/b")), 0);
	CHECK_EQ(storedir_check("nvme folder", dir, names, err, sizeof(err)), -ELOOP);
	CHECK(strstr(err, "b is a symbolic link"));
	CHECK_EQ(storedir_open_file(dfd, "nvme folder", dir, "b", O_RDWR, true, &created, err,
				    sizeof(err)),
		 -ELOOP);
	CHECK(file_is(at("target"), "precious"));
	CHECK_EQ(unlink(at("f/b")), 0);
	CHECK_EQ(symlink(at("nowhere"), at("f/b")), 0);
	CHECK_EQ(storedir_open_file(dfd, "nvme folder", dir, "b", O_WRONLY, true, &created, err,
				    sizeof(err)),
		 -ELOOP);
	CHECK(access(at("nowhere"), F_OK) < 0);
	CHECK_EQ(unlink(at("f/b")), 0);

	/* A FIFO is refused at once, whichever way it is opened. */
	CHECK_EQ(mkfifo(at("f/b"), 0600), 0);
	int modes[] = {O_RDONLY, O_WRONLY, O_RDWR};
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		err[0] = 0;
		CHECK(storedir_open_file(dfd, "nvme folder", dir, "b", modes[i], false, NULL, err,
					 sizeof(err)) < 0);
		CHECK(strstr(err, "b is a FIFO"));
	}
	CHECK_EQ(storedir_check("nvme folder", dir, names, err, sizeof(err)), -EINVAL);
	CHECK_EQ(unlink(at("f/b")), 0);

	/* A folder under a file's name. */
	CHECK_EQ(mkdir(at("f/b"), 0700), 0);
	CHECK(storedir_open_file(dfd, "nvme folder", dir, "b", O_RDONLY, false, NULL, err,
				 sizeof(err)) < 0);
	CHECK(strstr(err, "b is a folder"));
	CHECK_EQ(rmdir(at("f/b")), 0);

	/* Open to group or others: refused, whoever owns it. */
	write_file(at("f/b"), "x", 0644);
	CHECK_EQ(storedir_open_file(dfd, "nvme folder", dir, "b", O_RDONLY, false, NULL, err,
				    sizeof(err)),
		 -EPERM);
	CHECK(strstr(err, "open to group or others (mode 0644)"));
	CHECK_EQ(storedir_check("nvme folder", dir, names, err, sizeof(err)), -EPERM);

	if (geteuid() == 0) {
		CHECK_EQ(chmod(at("f/b"), 0600), 0);
		CHECK_EQ(chown(at("f/b"), OTHER_UID, OTHER_UID), 0);
		CHECK_EQ(storedir_open_file(dfd, "nvme folder", dir, "b", O_RDWR, true, &created,
					    err, sizeof(err)),
			 -EPERM);
		CHECK(strstr(err, "b is owned by uid 65534"));
	}
	close(dfd);
}

static void meta_folder(void)
{
	struct fs_meta *m = NULL;
	char dir[512], id[40], err[512] = "";
	size_t bs = 0;

	snprintf(dir, sizeof(dir), "%s/meta", base);

	/* LMDB's files: a link under their names is refused, its target untouched. */
	CHECK_EQ(mkdir(dir, 0700), 0);
	write_file(at("victim"), "root's own", 0600);
	CHECK_EQ(symlink(at("victim"), at("meta/lock.mdb")), 0);
	CHECK_EQ(meta_check_folder(dir, err, sizeof(err)), -ELOOP);
	CHECK(strstr(err, "lock.mdb is a symbolic link"));
	CHECK_EQ(meta_open(&m, dir, &bs, false, false, 0, 0, id, err, sizeof(err)), -ELOOP);
	CHECK(file_is(at("victim"), "root's own"));
	CHECK(access(at("meta/data.mdb"), F_OK) < 0 && access(at("meta/lock"), F_OK) < 0);
	CHECK_EQ(unlink(at("meta/lock.mdb")), 0);

	/* A folder writable by others: refused by meta_open too, nothing made. */
	CHECK_EQ(chmod(dir, 0777), 0);
	CHECK_EQ(meta_open(&m, dir, &bs, false, false, 0, 0, id, err, sizeof(err)), -EPERM);
	CHECK(access(at("meta/lock"), F_OK) < 0);
	CHECK_EQ(chmod(dir, 0700), 0);

	/* A store: its files are 600, and a second look at the folder passes. */
	CHECK_EQ(meta_open(&m, dir, &bs, false, false, 0, 0, id, err, sizeof(err)), 0);
	meta_close(m);
	const char *names[] = {"meta/data.mdb", "meta/lock.mdb", "meta/lock"};
	for (size_t i = 0; i < 3; i++) {
		struct stat st;

		CHECK_EQ(lstat(at(names[i]), &st), 0);
		CHECK(S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600);
	}
	CHECK_EQ(meta_check_folder(dir, err, sizeof(err)), 0);
	CHECK(meta_store_exists(dir));

	/* A store file opened up to others afterwards is refused. */
	CHECK_EQ(chmod(at("meta/data.mdb"), 0644), 0);
	CHECK_EQ(meta_open(&m, dir, &bs, false, false, 0, 0, id, err, sizeof(err)), -EPERM);
	CHECK(strstr(err, "data.mdb is open to group or others"));
	CHECK(!meta_store_exists(dir));
	CHECK_EQ(chmod(at("meta/data.mdb"), 0600), 0);
}

static void device_folder(void)
{
	char dir[512], err[1024] = "";

	snprintf(dir, sizeof(dir), "%s/nvme", base);

	CHECK_EQ(mkdir(dir, 0755), 0);
	CHECK_EQ(tb_check_folder(TB_KIND_NVME, dir, err, sizeof(err)), 0);
	CHECK_EQ(tb_check_unclaimed(TB_KIND_NVME, dir, "/m", err, sizeof(err)), 0);
	CHECK_EQ(symlink(at("victim"), at("nvme/tensorfs.slab")), 0);
	CHECK_EQ(tb_check_folder(TB_KIND_NVME, dir, err, sizeof(err)), -ELOOP);
	CHECK(strstr(err, "nvme folder") && strstr(err, "tensorfs.slab is a symbolic link"));
	CHECK_EQ(unlink(at("nvme/tensorfs.slab")), 0);

	/* Another store's identity, and no store in the meta folder given. */
	write_file(at("nvme/tensorfs.dev"), "tensorfs-dev store=abc-123 index=0 kind=nvme\n", 0600);
	CHECK_EQ(tb_check_unclaimed(TB_KIND_NVME, dir, "/some/meta", err, sizeof(err)), -EEXIST);
	CHECK(strstr(err, "holds tensorfs.dev of store abc-123 but meta folder /some/meta holds "
			  "no store"));
	CHECK(strstr(err, "remove ") && strstr(err, "/nvme/tensorfs.slab"));
	CHECK_EQ(chmod(at("nvme/tensorfs.dev"), 0666), 0);
	CHECK_EQ(tb_check_unclaimed(TB_KIND_PFS, dir, "/m", err, sizeof(err)), -EPERM);
	CHECK(strstr(err, "pfs folder") && strstr(err, "open to group or others"));
}

int main(void)
{
	char cmd[600];

	umask(022);
	CHECK(mkdtemp(base));
	folders();
	files();
	meta_folder();
	device_folder();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	CHECK_EQ(system(cmd), 0);
	return 0;
}
