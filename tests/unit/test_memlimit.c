/*
 * Unit test of fs_memlimit_read on trees laid out as the kernel lays out
 * /proc/self/cgroup and /sys/fs/cgroup: v2 with the lowest memory.max up
 * the tree, v2 without a limit, a container's view whose top folder is its
 * cgroup, v1 through hierarchical_memory_limit, v1 without a limit, and a
 * hybrid host (memory on v1). The working set is the usage less inactive
 * file pages. tests/mount/test_memlimit.sh runs the daemon in a real one.
 */
#include "memlimit.h"
#include "test.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[] = "/tmp/tfs-memlimit.XXXXXX";

/* Write text at root/path, making its folders. */
static void put(const char *path, const char *fmt, ...)
{
	char full[512], *p;
	va_list ap;
	FILE *f;

	snprintf(full, sizeof(full), "%s/%s", root, path);
	for (p = full + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = 0;
		mkdir(full, 0755);
		*p = '/';
	}
	f = fopen(full, "w");
	CHECK(f);
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fclose(f);
}

static void clear(void)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "rm -rf %s/proc %s/sys", root, root);
	CHECK(system(cmd) == 0);
}

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), t = strlen(tail);

	return n >= t && strcmp(s + n - t, tail) == 0;
}

int main(void)
{
	struct fs_memlimit m;

	CHECK(mkdtemp(root));

	/* v2: the parent's limit is the lower one. */
	put("proc/self/cgroup", "0::/pod/ctr\n");
	put("sys/fs/cgroup/pod/memory.max", "1073741824\n");
	put("sys/fs/cgroup/pod/ctr/memory.max", "max\n");
	put("sys/fs/cgroup/pod/ctr/memory.current", "300000000\n");
	put("sys/fs/cgroup/pod/ctr/memory.stat", "anon 100\nfile 200\ninactive_file 100000000\n");
	CHECK_EQ(fs_memlimit_read(root, &m), 0);
	CHECK_EQ(m.limit, 1073741824);
	CHECK_EQ(m.working_set, 200000000);
	CHECK(ends_with(m.file, "/sys/fs/cgroup/pod/memory.max"));
	/* ... until the child's is lower */
	put("sys/fs/cgroup/pod/ctr/memory.max", "536870912\n");
	CHECK_EQ(fs_memlimit_read(root, &m), 0);
	CHECK_EQ(m.limit, 536870912);
	CHECK(ends_with(m.file, "/sys/fs/cgroup/pod/ctr/memory.max"));
	clear();

	/* v2 without a limit anywhere: none. */
	put("proc/self/cgroup", "0::/user.slice\n");
	put("sys/fs/cgroup/user.slice/memory.max", "max\n");
	CHECK_EQ(fs_memlimit_read(root, &m), -ENOENT);
	clear();

	/* A container's view: the path is the host's, the top folder the container's cgroup. */
	put("proc/self/cgroup", "0::/kubepods/burstable/pod1/abc\n");
	put("sys/fs/cgroup/memory.max", "2147483648\n");
	put("sys/fs/cgroup/memory.current", "1000\n");
	CHECK_EQ(fs_memlimit_read(root, &m), 0);
	CHECK_EQ(m.limit, 2147483648LL);
	CHECK_EQ(m.working_set, 1000);
	clear();

	/* v1: hierarchical_memory_limit is the effective one; the file named is the ancestor's. */
	put("proc/self/cgroup", "9:pids:/a/b\n4:cpuacct,memory:/a/b\n1:name=systemd:/a/b\n");
	put("sys/fs/cgroup/memory/a/memory.limit_in_bytes", "805306368\n");
	put("sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "9223372036854771712\n");
	put("sys/fs/cgroup/memory/a/b/memory.usage_in_bytes", "50000000\n");
	put("sys/fs/cgroup/memory/a/b/memory.stat",
	    "cache 1\nhierarchical_memory_limit 805306368\ntotal_inactive_file 60000000\n");
	CHECK_EQ(fs_memlimit_read(root, &m), 0);
	CHECK_EQ(m.limit, 805306368);
	CHECK_EQ(m.working_set, 0); /* inactive file above usage: none */
	CHECK(ends_with(m.file, "/sys/fs/cgroup/memory/a/memory.limit_in_bytes"));
	clear();

	/* v1 without a limit. */
	put("proc/self/cgroup", "4:memory:/\n");
	put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put("sys/fs/cgroup/memory/memory.stat", "hierarchical_memory_limit 9223372036854771712\n");
	CHECK_EQ(fs_memlimit_read(root, &m), -ENOENT);
	clear();

	/* Hybrid: memory on v1, systemd's tree on v2 (whose files say nothing of memory). */
	put("proc/self/cgroup", "0::/svc\n4:memory:/svc\n");
	put("sys/fs/cgroup/memory/svc/memory.limit_in_bytes", "268435456\n");
	put("sys/fs/cgroup/memory/svc/memory.usage_in_bytes", "1000\n");
	CHECK_EQ(fs_memlimit_read(root, &m), 0);
	CHECK_EQ(m.limit, 268435456);
	CHECK_EQ(m.working_set, 1000);
	clear();

	/* No /proc/self/cgroup: none. */
	CHECK_EQ(fs_memlimit_read(root, &m), -ENOENT);
	rmdir(root);
	printf("PASS\n");
	return 0;
}
