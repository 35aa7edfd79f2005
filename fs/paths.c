/*
 * paths.c - the names of files given by inode number, for the lists that
 * name them (the pins, the scrub's damaged blocks).
 *
 * The store keeps no link from an inode to its folder, so the names are
 * found by walking the folders from the root, breadth first, in one read
 * transaction, and the walk stops once every file asked for has a name.
 * A file with several names gets the first one the walk finds; one with
 * none (unlinked, still open) keeps none.
 */
#include "fs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct path_walk {
	struct fs *fs;
	MDB_txn *txn;
	struct fs_path *v; /* in inode order */
	size_t n, found;
	struct fs_ino_list dirs; /* folders to visit, breadth first */
	char **dir_paths;	 /* the path of each, parallel to dirs */
	size_t dir_cap;
	const char *parent; /* the path of the folder being read */
	int err;
};

static struct fs_path *find_ino(struct path_walk *w, uint64_t ino)
{
	size_t lo = 0, hi = w->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (w->v[mid].ino == ino)
			return &w->v[mid];
		if (w->v[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static char *join(const char *parent, const char *name, size_t len)
{
	size_t plen = strcmp(parent, "/") == 0 ? 0 : strlen(parent);
	char *p = malloc(plen + len + 2);

	if (!p)
		return NULL;
	memcpy(p, parent, plen);
	p[plen] = '/';
	memcpy(p + plen + 1, name, len);
	p[plen + 1 + len] = 0;
	return p;
}

/* Queue folder ino, whose path is path (taken over, freed on failure). */
static int add_dir(struct path_walk *w, uint64_t ino, char *path)
{
	if (path && w->dirs.n == w->dir_cap) {
		size_t cap = w->dir_cap ? w->dir_cap * 2 : 64;
		char **v = realloc(w->dir_paths, cap * sizeof(*v));

		if (v) {
			w->dir_paths = v;
			w->dir_cap = cap;
		}
	}
	if (!path || w->dirs.n == w->dir_cap || fs_ino_push(&w->dirs, ino) < 0) {
		free(path);
		return -ENOMEM;
	}
	w->dir_paths[w->dirs.n - 1] = path;
	return 0;
}

static int visit_name(void *arg, const char *name, size_t len, uint64_t ino, uint64_t cookie)
{
	struct path_walk *w = arg;
	struct meta_inode rec;
	struct fs_path *p;

	(void)cookie;
	if (meta_inode_get(w->fs->meta, w->txn, ino, &rec) != 0)
		return 0; /* a name without its inode: fsck's business */
	if (S_ISDIR(rec.mode)) {
		if (add_dir(w, ino, join(w->parent, name, len)) < 0)
			goto nomem;
		return 0;
	}
	p = find_ino(w, ino);
	if (p && !p->path) {
		p->path = join(w->parent, name, len);
		if (!p->path)
			goto nomem;
		w->found++;
	}
	return w->found == w->n;
nomem:
	w->err = -ENOMEM;
	return 1;
}

int fs_paths_find(struct fs *fs, MDB_txn *txn, struct fs_path *v, size_t n)
{
	struct path_walk w = {.fs = fs, .txn = txn, .v = v, .n = n};
	int ret = 0;

	if (n)
		ret = add_dir(&w, META_ROOT_INO, strdup("/"));
	for (size_t i = 0; !ret && i < w.dirs.n && w.found < n; i++) {
		w.parent = w.dir_paths[i];
		ret = meta_readdir(fs->meta, txn, w.dirs.v[i], 0, visit_name, &w);
		ret = ret ? ret : w.err;
	}
	for (size_t i = 0; i < w.dirs.n; i++)
		free(w.dir_paths[i]);
	free(w.dirs.v);
	free(w.dir_paths);
	return ret;
}
