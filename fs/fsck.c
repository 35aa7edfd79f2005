/*
 * fsck.c - the offline check of a metadata store, and its repair.
 *
 * The whole store is read into arrays in one transaction, then checked as a
 * graph: names lead from the root folder to inodes, inodes own block maps,
 * block maps reference block records, and the dedup index points at block
 * records. Every record that breaks an invariant is reported once, with the
 * file it belongs to where there is one (a file's count of mapped blocks,
 * which st_blocks is made of, must be its number of mappings). Repair
 * decides the fate of every record first (keep, drop, rewrite), so that
 * the counts it writes back (reference counts, link counts, block counts)
 * are those of the store as it will be, and then applies all of it in one
 * write transaction: a crash during repair leaves the store as it was.
 *
 * This file is the run: a pass loads and checks the store in one
 * transaction, run through meta_guarded, and with --repair applies the
 * repair in it; a second pass checks what repair left. It calls the
 * other files of fsck (fsck_int.h) and meta.c; none of them calls it.
 */
#include "fsck.h"
#include "fsck_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the run ---- */

static void summary_counts(struct fsck *f, const char *dir)
{
	struct ck_inode *in = f->inodes.v;
	uint64_t files = 0, dirs = 0;

	for (size_t i = 0; i < f->inodes.n; i++) {
		if (S_ISDIR(in[i].rec.mode))
			dirs++;
		else if (S_ISREG(in[i].rec.mode))
			files++;
	}
	fsck_report(f->out, "",
	       "fsck: %s: block size %zu, %zu inodes (%" PRIu64 " files, %" PRIu64
	       " folders), %zu names, %zu blocks, %zu mappings",
	       dir, f->bs, f->inodes.n, files, dirs, f->names.n, f->blocks.n, f->maps.n);
}

/* One pass: load and check in txn; with f->repair, also apply. */
static int pass(struct fsck *f, MDB_txn *txn, const char *dir, bool header)
{
	int ret = fsck_load(f, txn);

	if (ret)
		return ret;
	if (header)
		summary_counts(f, dir);
	ret = fsck_analyze(f);
	if (!ret && f->repair && !f->no_root && (f->problems || f->notes || f->freed_blocks))
		ret = fsck_apply(f, txn);
	return ret;
}

struct guarded_pass {
	struct fsck *f;
	const char *dir;
	bool first; /* the check (and repair); else the check after repair */
};

/*
 * A pass in its own transaction, committed when it repaired something.
 * Run through meta_guarded: a damaged data.mdb that LMDB would read as a
 * fault ends the pass with -EUCLEAN, not the process.
 */
static int run_pass(void *arg)
{
	struct guarded_pass *p = arg;
	struct fsck *f = p->f;
	bool write = p->first && f->repair;
	MDB_txn *txn;
	int ret = meta_begin(f->m, write, &txn);

	if (ret)
		return ret;
	meta_guard_hold(txn); /* kept reachable if a fault abandons it (meta.h) */
	ret = pass(f, txn, p->dir, p->first);
	meta_guard_release(txn);
	if (!ret && write && !f->no_root && (f->problems || f->notes || f->freed_blocks))
		ret = meta_commit(txn);
	else
		meta_abort(txn);
	return ret;
}

/* Say what a pass found ("fsck: clean", or its problems and then what); its exit status. */
static int pass_result(FILE *out, uint64_t problems, const char *what)
{
	if (problems)
		fprintf(out, "fsck: %" PRIu64 " problem%s%s\n", problems, problems == 1 ? "" : "s",
			what);
	else
		fprintf(out, "fsck: clean\n");
	return problems ? FSCK_PROBLEMS : FSCK_CLEAN;
}

int fs_fsck(const char *dir, bool repair, FILE *out, const char *prog)
{
	struct fsck f = {.out = out, .repair = repair};
	struct guarded_pass gp = {&f, dir, true};
	char err[512] = "", store_id[40];
	int ret, status;

	if (meta_check_folder(dir, err, sizeof(err)) < 0) {
		fsck_report(stderr, prog, ": %s", err);
		return FSCK_ERROR;
	}
	if (!meta_store_exists(dir)) {
		fsck_report(stderr, prog, ": %s: no tensorfs metadata store there", dir);
		return FSCK_ERROR;
	}
	/* A daemon still writing back after its unmount is waited for, as a mount does. */
	ret = meta_wait_holder(dir, META_LOCK_WAIT_S, prog, err, sizeof(err));
	if (!ret)
		ret = meta_open(&f.m, dir, &f.bs, false, false, getuid(), getgid(), store_id, err,
				sizeof(err));
	if (ret) {
		fsck_report(stderr, prog, ": %s", err[0] ? err : strerror(-ret));
		return FSCK_ERROR;
	}
	ret = meta_guarded(f.m, run_pass, &gp, err, sizeof(err));
	if (ret)
		goto error;
	if (repair && f.freed_blocks && !f.no_root)
		fprintf(out, "  repair: %" PRIu64 " blocks of purged inodes freed\n",
			f.freed_blocks);
	if (!repair || f.problems == 0 || f.no_root) {
		status = pass_result(out, f.problems, "");
		goto out;
	}
	fprintf(out, "fsck: %" PRIu64 " problem%s, repaired; checking again\n", f.problems,
		f.problems == 1 ? "" : "s");

	/* The check after repair: anything it finds, repair could not fix. */
	struct fsck again = {.m = f.m, .out = out, .bs = f.bs};
	struct guarded_pass gp2 = {&again, dir, false};

	fsck_free_vecs(&f);
	ret = meta_guarded(again.m, run_pass, &gp2, err, sizeof(err));
	fsck_free_vecs(&again);
	if (ret)
		goto error;
	status = pass_result(out, again.problems, " left after repair");
	goto out;
error:
	if (err[0])
		fsck_report(stderr, prog, ": %s", err);
	else
		fsck_report(stderr, prog, ": %s: %s", dir, meta_strerror(ret));
	status = FSCK_ERROR;
out:
	fsck_free_vecs(&f);
	meta_close(f.m);
	return status;
}
