/*
 * fsx: a random file-operation tester with an in-memory model.
 *
 * It opens one or more files in a folder and applies a seeded random stream
 * of operations to them: pwrite, pread, ftruncate, fallocate (mode 0 and
 * PUNCH_HOLE|KEEP_SIZE), copy_file_range (between files and within one
 * file), rename, fsync, close+reopen and, optionally, a remount done by an
 * outside command. Every operation is applied to a model of each file's
 * bytes and size too, and every read is compared in full against the model.
 *
 * Written data is a pattern derived from the seed, the operation number and
 * the file offset, so that bytes read back in error can often be traced to
 * the operation that wrote them. Some writes are all zeros, or carry runs of
 * zeros, because the filesystem under test stores all-zero blocks as holes.
 *
 * On the first mismatch or failed system call it prints the seed, the
 * operation number, the last operations and the bytes expected and read,
 * and exits 1. It exits 0 when every operation and the final full compare
 * succeed.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB (1024ULL)
#define MiB (1024ULL * KiB)

#define DEFAULT_OPS 20000
#define DEFAULT_MAX_SIZE (16 * MiB)
#define DEFAULT_FILES 2
#define DEFAULT_BLOCK MiB
#define DEFAULT_CHECK_EVERY 2000
#define DEFAULT_LOG 20
#define DIRECT_ALIGN 4096
#define DIRECT_SMALL_ALIGN 1024
#define COMPARE_CHUNK (4 * MiB)
#define MAX_LOG_LINE 192

enum op_kind {
	OP_WRITE,
	OP_READ,
	OP_TRUNCATE,
	OP_FALLOC,
	OP_PUNCH,
	OP_COPY,
	OP_RENAME,
	OP_FSYNC,
	OP_REOPEN,
	OP_NKINDS
};

static const char *const op_names[OP_NKINDS] = {
    "write", "read", "truncate", "falloc", "punch", "copy", "rename", "fsync", "reopen",
};

/* Relative weights of the operations; a disabled operation gets 0. */
static unsigned op_weight[OP_NKINDS] = {
    [OP_WRITE] = 32, [OP_READ] = 26,  [OP_TRUNCATE] = 6, [OP_FALLOC] = 5, [OP_PUNCH] = 5,
    [OP_COPY] = 9,   [OP_RENAME] = 3, [OP_FSYNC] = 2,	 [OP_REOPEN] = 2,
};

struct tfile {
	int fd;
	int name_idx; /* which of the two names the file has now: 0 or 1 */
	char name[2][64];
	uint8_t *model; /* max_size bytes; bytes at and past size are zero */
	uint64_t size;
};

struct log_entry {
	uint64_t op;
	char text[MAX_LOG_LINE];
	int file;
	uint64_t off;
	uint64_t len;
};

static struct {
	const char *dir;
	uint64_t nops;
	uint64_t seed;
	bool direct;
	uint64_t max_size;
	int nfiles;
	uint64_t block;
	const char *remount_cmd;
	uint64_t remount_every;
	uint64_t check_every;
	int log_len;
	bool verbose;
	bool keep;
	int dirfd;
} cfg;

static struct tfile *files;
static uint8_t *iobuf;	/* aligned, max_size bytes */
static uint8_t *iobuf2; /* aligned, max_size bytes, for copies inside the model */
static struct log_entry *oplog;
static uint64_t cur_op; /* number of the operation in progress, from 1 */
static uint64_t rng_s[4];
static uint64_t stat_ops[OP_NKINDS];
static uint64_t stat_short_copies, stat_remounts, stat_full_checks;

/* ---- random numbers: xoshiro256**, seeded by splitmix64 ---- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rnd(void)
{
	uint64_t r = rotl(rng_s[1] * 5, 7) * 9;
	uint64_t t = rng_s[1] << 17;

	rng_s[2] ^= rng_s[0];
	rng_s[3] ^= rng_s[1];
	rng_s[1] ^= rng_s[2];
	rng_s[0] ^= rng_s[3];
	rng_s[2] ^= t;
	rng_s[3] = rotl(rng_s[3], 45);
	return r;
}

/* A number in [0, n); n > 0. */
static uint64_t rnd_below(uint64_t n)
{
	return rnd() % n;
}

/* A number in [lo, hi]. */
static uint64_t rnd_range(uint64_t lo, uint64_t hi)
{
	return lo + rnd_below(hi - lo + 1);
}

static bool chance(unsigned percent)
{
	return rnd_below(100) < percent;
}

/* ---- data pattern ---- */

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdULL;
	z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ULL;
	return z ^ (z >> 33);
}

static uint64_t op_tag(uint64_t op)
{
	return mix64(cfg.seed ^ (op * 0x9e3779b97f4a7c15ULL));
}

static uint64_t pattern_word(uint64_t tag, uint64_t word_index)
{
	return mix64(tag ^ (word_index * 0xd6e8feb86659fd93ULL));
}

/* Fill buf with the pattern of operation op for file offsets [off, off+len). */
static void fill_pattern(uint8_t *buf, uint64_t off, uint64_t len, uint64_t op)
{
	uint64_t tag = op_tag(op);
	uint64_t o = off;
	uint64_t end = off + len;

	/* the head and tail words byte by byte, whole words in between */
	while (o < end && ((o & 7) || end - o < 8)) {
		buf[o - off] = (uint8_t)(pattern_word(tag, o >> 3) >> (8 * (o & 7)));
		o++;
	}
	for (; end - o >= 8; o += 8) {
		uint64_t w = pattern_word(tag, o >> 3);
		uint8_t *p = buf + (o - off);

		for (unsigned b = 0; b < 8; b++)
			p[b] = (uint8_t)(w >> (8 * b));
	}
	for (; o < end; o++)
		buf[o - off] = (uint8_t)(pattern_word(tag, o >> 3) >> (8 * (o & 7)));
}

/* ---- reporting ---- */

static void log_op(int file, uint64_t off, uint64_t len, const char *fmt, ...)
{
	struct log_entry *e = &oplog[cur_op % (uint64_t)cfg.log_len];
	va_list ap;

	e->op = cur_op;
	e->file = file;
	e->off = off;
	e->len = len;
	va_start(ap, fmt);
	vsnprintf(e->text, sizeof(e->text), fmt, ap);
	va_end(ap);
	if (cfg.verbose)
		printf("%6" PRIu64 " %s\n", cur_op, e->text);
}

static void print_log(int file, uint64_t bad_off)
{
	uint64_t first = cur_op >= (uint64_t)cfg.log_len ? cur_op - cfg.log_len + 1 : 1;

	fprintf(stderr, "fsx: last %" PRIu64 " operations (* = touched the bad offset):\n",
		cur_op - first + 1);
	for (uint64_t i = first; i <= cur_op; i++) {
		struct log_entry *e = &oplog[i % (uint64_t)cfg.log_len];
		bool hit;

		if (e->op != i)
			continue;
		hit =
		    file >= 0 && e->file == file && bad_off >= e->off && bad_off < e->off + e->len;
		fprintf(stderr, "  %c%6" PRIu64 " %s\n", hit ? '*' : ' ', e->op, e->text);
	}
}

static void print_stats(FILE *f)
{
	fprintf(f, "fsx: ops:");
	for (int k = 0; k < OP_NKINDS; k++)
		fprintf(f, " %s=%" PRIu64, op_names[k], stat_ops[k]);
	fprintf(f, " remount=%" PRIu64 " full_checks=%" PRIu64 " short_copies=%" PRIu64 "\n",
		stat_remounts, stat_full_checks, stat_short_copies);
}

static void die_common(int file, uint64_t bad_off)
{
	print_log(file, bad_off);
	print_stats(stderr);
	fprintf(stderr, "fsx: FAILED at operation %" PRIu64 ", seed %" PRIu64 "\n", cur_op,
		cfg.seed);
	exit(1);
}

static const char *fname(int f)
{
	return files[f].name[files[f].name_idx];
}

/* A system call failed or returned something it should not have. */
static void die_call(int file, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "fsx: operation %" PRIu64 " (seed %" PRIu64 ")", cur_op, cfg.seed);
	if (file >= 0)
		fprintf(stderr, " file %s", fname(file));
	fprintf(stderr, ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	die_common(file, UINT64_MAX);
}

static void hexdump(const char *label, const uint8_t *p, uint64_t off, uint64_t n)
{
	fprintf(stderr, "  %-8s @%-10" PRIu64, label, off);
	for (uint64_t i = 0; i < n; i++)
		fprintf(stderr, "%s%02x", i % 8 ? " " : "  ", p[i]);
	fprintf(stderr, "\n");
}

static bool all_zero(const uint8_t *p, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/*
 * Say where the bytes read in error may have come from: zeros, an earlier
 * write to the same offset, or data the model holds elsewhere. buf holds
 * len bytes read at file offset off; the first bad byte is at bad.
 */
static void explain_bytes(const uint8_t *buf, uint64_t off, uint64_t len, uint64_t bad)
{
	/* the pattern word that holds the bad byte, if it was read whole */
	uint64_t w_off = bad & ~7ULL;
	const uint8_t *probe;
	uint64_t probe_len;

	if (w_off < off)
		w_off += 8;
	probe = buf + (w_off - off);
	probe_len = w_off < off + len ? off + len - w_off : 0;
	if (all_zero(buf + (bad - off), off + len - bad < 16 ? off + len - bad : 16)) {
		fprintf(stderr, "  the bytes read are zeros (a hole or unwritten data?)\n");
		return;
	}
	if (probe_len < 8 || all_zero(probe, 8))
		return;
	for (uint64_t op = 1; op <= cur_op; op++) {
		uint64_t w = pattern_word(op_tag(op), w_off >> 3);
		uint8_t b[8];

		/* pattern bytes are stored low byte first */
		for (int i = 0; i < 8; i++)
			b[i] = (uint8_t)(w >> (8 * i));
		if (memcmp(b, probe, 8) == 0) {
			fprintf(stderr,
				"  the bytes read at %" PRIu64 " were written by operation %" PRIu64
				" at this same offset (stale data?)\n",
				w_off, op);
			return;
		}
	}
	if (probe_len < 16 || all_zero(probe, 16))
		return;
	for (int f = 0, shown = 0; f < cfg.nfiles && shown < 4; f++) {
		const uint8_t *m = files[f].model;
		const uint8_t *end = m + files[f].size;
		const uint8_t *p = m;

		while (shown < 4 && p < end && (p = memmem(p, end - p, probe, 16)) != NULL) {
			fprintf(stderr,
				"  the 16 bytes read at %" PRIu64
				" are what the model holds at file %d offset %td\n",
				w_off, f, p - m);
			shown++;
			p++;
		}
	}
}

/* Compare len bytes read at file offset off with the model; die on difference. */
static void check_bytes(int f, const uint8_t *got, uint64_t off, uint64_t len, const char *what)
{
	const uint8_t *exp = files[f].model + off;
	uint64_t first, last, nbad = 0;

	if (memcmp(exp, got, len) == 0)
		return;
	for (first = 0; exp[first] == got[first]; first++)
		;
	for (last = len - 1; exp[last] == got[last]; last--)
		;
	for (uint64_t i = first; i <= last; i++)
		nbad += exp[i] != got[i];
	fprintf(stderr,
		"fsx: DATA MISMATCH at operation %" PRIu64 " (%s), seed %" PRIu64 "\n"
		"  file %s (index %d), size %" PRIu64 ", read [%" PRIu64 ", +%" PRIu64 ")\n"
		"  first bad byte at offset %" PRIu64 " (0x%" PRIx64 "), last at %" PRIu64
		", %" PRIu64 " bad bytes\n",
		cur_op, what, cfg.seed, fname(f), f, files[f].size, off, len, off + first,
		off + first, off + last, nbad);
	{
		uint64_t s = first & ~15ULL;
		uint64_t n = len - s < 32 ? len - s : 32;

		hexdump("expected", exp + s, off + s, n);
		hexdump("got", got + s, off + s, n);
	}
	explain_bytes(got, off, len, off + first);
	die_common(f, off + first);
}

/* ---- helpers over system calls ---- */

static int open_flags(void)
{
	return O_RDWR | (cfg.direct ? O_DIRECT : 0);
}

static void check_size(int f, const char *what)
{
	struct stat st;

	if (fstat(files[f].fd, &st) < 0)
		die_call(f, "fstat after %s: %s", what, strerror(errno));
	if ((uint64_t)st.st_size != files[f].size)
		die_call(f, "size after %s is %jd, expected %" PRIu64, what, (intmax_t)st.st_size,
			 files[f].size);
}

/* Read [off, off+len) and compare it, including the exact short count at EOF. */
static void read_compare(int f, uint64_t off, uint64_t len, const char *what)
{
	uint64_t size = files[f].size;
	uint64_t want = off >= size ? 0 : (off + len > size ? size - off : len);
	ssize_t n = pread(files[f].fd, iobuf, len, (off_t)off);

	if (n < 0)
		die_call(f, "%s: pread(%" PRIu64 ", %" PRIu64 "): %s", what, off, len,
			 strerror(errno));
	if ((uint64_t)n != want)
		die_call(f,
			 "%s: pread(%" PRIu64 ", %" PRIu64 ") returned %zd, expected %" PRIu64
			 " (size %" PRIu64 ")",
			 what, off, len, n, want, size);
	if (want)
		check_bytes(f, iobuf, off, want, what);
}

/* Read a whole file and compare it; also checks the size and that EOF is where it should be. */
static void full_compare(int f, const char *what)
{
	uint64_t size = files[f].size;
	uint64_t off;

	check_size(f, what);
	for (off = 0; off < size; off += COMPARE_CHUNK)
		read_compare(f, off, COMPARE_CHUNK, what);
	/* one read at EOF must return 0 */
	read_compare(f, off, DIRECT_ALIGN, what);
	stat_full_checks++;
}

static void full_compare_all(const char *what)
{
	for (int f = 0; f < cfg.nfiles; f++)
		full_compare(f, what);
}

static void open_file(int f, bool create)
{
	int flags = open_flags() | (create ? O_CREAT | O_EXCL : 0);

	files[f].fd = openat(cfg.dirfd, fname(f), flags, 0644);
	if (files[f].fd < 0)
		die_call(f, "open%s: %s", create ? " (create)" : "", strerror(errno));
}

static void close_file(int f)
{
	if (close(files[f].fd) < 0)
		die_call(f, "close: %s", strerror(errno));
	files[f].fd = -1;
}

/* ---- choosing offsets and lengths ---- */

static uint64_t pick_len(void)
{
	unsigned r = rnd_below(100);

	if (r < 45)
		return rnd_range(1, 8 * KiB);
	if (r < 75)
		return rnd_range(1, 128 * KiB);
	if (r < 95)
		return rnd_range(1, MiB + 64 * KiB);
	return rnd_range(1, 3 * cfg.block + 4 * KiB);
}

/* An offset anywhere, near EOF of file f, or near a block boundary. */
static uint64_t pick_off(int f)
{
	unsigned r = rnd_below(100);
	uint64_t o;

	if (r < 40) {
		o = rnd_below(cfg.max_size);
	} else if (r < 70) {
		int64_t d = (int64_t)rnd_below(2 * MiB) - (int64_t)MiB;

		o = (int64_t)files[f].size + d < 0 ? 0 : files[f].size + d;
	} else {
		uint64_t nblocks = cfg.max_size / cfg.block;
		int64_t d = (int64_t)rnd_below(8 * KiB) - (int64_t)(4 * KiB);
		int64_t b = (int64_t)(rnd_below(nblocks + 1) * cfg.block);

		o = b + d < 0 ? 0 : (uint64_t)(b + d);
	}
	return o >= cfg.max_size ? cfg.max_size - 1 : o;
}

/*
 * Make [*off, *off+*len) fit under max_size and, with --direct, aligned to
 * 4 KiB mostly and 1 KiB sometimes, as O_DIRECT users do.
 */
static void shape_range(uint64_t *off, uint64_t *len)
{
	if (cfg.direct) {
		uint64_t a = chance(20) ? DIRECT_SMALL_ALIGN : DIRECT_ALIGN;

		*off &= ~(a - 1);
		*len = (*len + a - 1) & ~(a - 1);
	}
	if (*off + *len > cfg.max_size)
		*len = cfg.max_size - *off;
}

/* ---- the operations ---- */

static void model_write(int f, uint64_t off, const uint8_t *data, uint64_t len)
{
	memcpy(files[f].model + off, data, len);
	if (off + len > files[f].size)
		files[f].size = off + len;
}

static void do_write(int f)
{
	uint64_t off = pick_off(f), len = pick_len();
	unsigned r = rnd_below(100);
	const char *kind = "data";
	ssize_t n;

	shape_range(&off, &len);
	if (len == 0)
		return;
	fill_pattern(iobuf, off, len, cur_op);
	if (r < 8) {
		memset(iobuf, 0, len);
		kind = "zeros";
	} else if (r < 20) {
		uint64_t zo = rnd_below(len), zl = rnd_range(1, len - zo);

		if (chance(50) && len > cfg.block) {
			/* zero a whole block inside the write, so it may become a hole */
			uint64_t b = ((off + cfg.block - 1) / cfg.block) * cfg.block;

			if (b + cfg.block <= off + len) {
				zo = b - off;
				zl = cfg.block;
			}
		}
		memset(iobuf + zo, 0, zl);
		kind = "data+zeros";
	}
	log_op(f, off, len, "write  f%d [%" PRIu64 ", +%" PRIu64 ") %s, size %" PRIu64, f, off, len,
	       kind, files[f].size);
	n = pwrite(files[f].fd, iobuf, len, (off_t)off);
	if (n < 0)
		die_call(f, "pwrite(%" PRIu64 ", %" PRIu64 "): %s", off, len, strerror(errno));
	if ((uint64_t)n != len)
		die_call(f, "short pwrite(%" PRIu64 ", %" PRIu64 "): %zd", off, len, n);
	model_write(f, off, iobuf, len);
	if (rnd_below(4) == 0)
		check_size(f, "write");
}

static void do_read(int f)
{
	uint64_t off, len = pick_len();

	/* mostly inside the file, sometimes across or past EOF */
	if (files[f].size > 0 && chance(85))
		off = rnd_below(files[f].size);
	else
		off = pick_off(f);
	shape_range(&off, &len);
	if (len == 0)
		return;
	log_op(f, off, len, "read   f%d [%" PRIu64 ", +%" PRIu64 "), size %" PRIu64, f, off, len,
	       files[f].size);
	read_compare(f, off, len, "read");
}

static void model_resize(int f, uint64_t size)
{
	/* the model keeps zeros past EOF, so growing needs nothing */
	if (size < files[f].size)
		memset(files[f].model + size, 0, files[f].size - size);
	files[f].size = size;
}

static void do_truncate(int f)
{
	unsigned r = rnd_below(100);
	uint64_t size;

	if (r < 8) {
		size = 0;
	} else if (r < 50) {
		size = rnd_below(cfg.max_size + 1);
	} else {
		int64_t d = (int64_t)rnd_below(4 * MiB) - (int64_t)(2 * MiB);

		size = (int64_t)files[f].size + d < 0 ? 0 : files[f].size + d;
		if (size > cfg.max_size)
			size = cfg.max_size;
	}
	if (chance(30))
		size = (size / cfg.block) * cfg.block;
	log_op(f, size < files[f].size ? size : files[f].size,
	       size < files[f].size ? files[f].size - size : size - files[f].size,
	       "trunc  f%d %" PRIu64 " -> %" PRIu64, f, files[f].size, size);
	if (ftruncate(files[f].fd, (off_t)size) < 0)
		die_call(f, "ftruncate(%" PRIu64 "): %s", size, strerror(errno));
	model_resize(f, size);
	check_size(f, "truncate");
}

static void do_falloc(int f)
{
	uint64_t off = pick_off(f), len = pick_len();

	shape_range(&off, &len);
	if (len == 0)
		return;
	log_op(f, off, len, "falloc f%d [%" PRIu64 ", +%" PRIu64 "), size %" PRIu64, f, off, len,
	       files[f].size);
	if (fallocate(files[f].fd, 0, (off_t)off, (off_t)len) < 0)
		die_call(f, "fallocate(0, %" PRIu64 ", %" PRIu64 "): %s%s", off, len,
			 strerror(errno), errno == EOPNOTSUPP ? " (use --no-falloc)" : "");
	if (off + len > files[f].size)
		files[f].size = off + len;
	check_size(f, "fallocate");
}

static void do_punch(int f)
{
	uint64_t off, len = pick_len();

	if (files[f].size > 0 && chance(80))
		off = rnd_below(files[f].size);
	else
		off = pick_off(f);
	if (chance(30)) {
		/* whole blocks, the case a filesystem may free storage for */
		off = (off / cfg.block) * cfg.block;
		len = rnd_range(1, 3) * cfg.block;
	}
	shape_range(&off, &len);
	if (len == 0)
		return;
	log_op(f, off, len, "punch  f%d [%" PRIu64 ", +%" PRIu64 "), size %" PRIu64, f, off, len,
	       files[f].size);
	if (fallocate(files[f].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
		      (off_t)len) < 0)
		die_call(f, "fallocate(PUNCH_HOLE|KEEP_SIZE, %" PRIu64 ", %" PRIu64 "): %s%s", off,
			 len, strerror(errno), errno == EOPNOTSUPP ? " (use --no-punch)" : "");
	if (off < files[f].size) {
		uint64_t end = off + len > files[f].size ? files[f].size : off + len;

		memset(files[f].model + off, 0, end - off);
	}
	check_size(f, "punch");
}

static void do_copy(int f)
{
	int s = (int)rnd_below(cfg.nfiles);
	uint64_t soff, doff, len, want, done = 0;

	if (files[s].size == 0)
		return;
	soff = rnd_below(files[s].size);
	if (chance(30))
		soff = (soff / cfg.block) * cfg.block; /* block aligned: may share blocks */
	len = pick_len();
	if (chance(20))
		len = rnd_range(1, 4) * cfg.block;
	doff = chance(30) ? (pick_off(f) / cfg.block) * cfg.block : pick_off(f);
	if (cfg.direct) {
		soff &= ~(uint64_t)(DIRECT_ALIGN - 1);
		doff &= ~(uint64_t)(DIRECT_ALIGN - 1);
		len = (len + DIRECT_ALIGN - 1) & ~(uint64_t)(DIRECT_ALIGN - 1);
	}
	if (doff + len > cfg.max_size)
		len = cfg.max_size - doff;
	if (s == f && soff < doff + len && doff < soff + len) {
		/* the same file: keep the ranges apart */
		if (soff + len > doff)
			len = doff > soff ? doff - soff : soff - doff;
	}
	if (cfg.direct && soff + len > files[s].size) {
		/*
		 * An O_DIRECT copy that ends at an unaligned EOF may be split by
		 * the kernel into an aligned part and an unaligned rest, and the
		 * rest is refused with EINVAL on some filesystems. Buffered runs
		 * cover copies across EOF.
		 */
		len = (files[s].size - soff) & ~(uint64_t)(DIRECT_ALIGN - 1);
	}
	if (len == 0)
		return;
	want = soff + len > files[s].size ? files[s].size - soff : len;
	log_op(f, doff, want,
	       "copy   f%d [%" PRIu64 ", +%" PRIu64 ") -> f%d @%" PRIu64 ", sizes %" PRIu64
	       " %" PRIu64,
	       s, soff, len, f, doff, files[s].size, files[f].size);
	while (done < want) {
		loff_t in = (loff_t)(soff + done), out = (loff_t)(doff + done);
		/*
		 * The first call asks for len, past the source's EOF at times. A
		 * short copy is legal; later calls ask for exactly what is left,
		 * because a copy that extends this same file moves its EOF.
		 */
		uint64_t ask = done ? want - done : len;
		ssize_t n = copy_file_range(files[s].fd, &in, files[f].fd, &out, ask, 0);

		if (n < 0)
			die_call(f,
				 "copy_file_range(f%d @%" PRIu64 " -> f%d @%" PRIu64 ", %" PRIu64
				 "): %s",
				 s, soff + done, f, doff + done, ask, strerror(errno));
		if (n == 0)
			die_call(f,
				 "copy_file_range(f%d @%" PRIu64 " -> f%d @%" PRIu64 ", %" PRIu64
				 ") returned 0 after %" PRIu64 " of %" PRIu64 " bytes",
				 s, soff + done, f, doff + done, ask, done, want);
		if ((uint64_t)in != soff + done + (uint64_t)n ||
		    (uint64_t)out != doff + done + (uint64_t)n)
			die_call(f, "copy_file_range moved the offsets wrongly");
		if ((uint64_t)n > want - done)
			die_call(f, "copy_file_range copied %zd, past source EOF", n);
		if (done + (uint64_t)n < want)
			stat_short_copies++;
		done += (uint64_t)n;
	}
	/* copy through a second buffer: source and destination may be one model */
	memcpy(iobuf2, files[s].model + soff, want);
	model_write(f, doff, iobuf2, want);
	check_size(f, "copy_file_range");
	if (chance(50))
		read_compare(f, doff, want, "read after copy");
}

static void do_rename(int f)
{
	const char *from = fname(f);
	const char *to = files[f].name[!files[f].name_idx];
	struct stat st_fd, st_name;

	log_op(f, 0, 0, "rename f%d %s -> %s", f, from, to);
	if (renameat(cfg.dirfd, from, cfg.dirfd, to) < 0)
		die_call(f, "rename %s -> %s: %s", from, to, strerror(errno));
	files[f].name_idx = !files[f].name_idx;
	if (fstatat(cfg.dirfd, from, &st_name, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
		die_call(f, "after rename, old name %s still exists (or stat failed: %s)", from,
			 strerror(errno));
	if (fstatat(cfg.dirfd, to, &st_name, AT_SYMLINK_NOFOLLOW) < 0)
		die_call(f, "after rename, stat %s: %s", to, strerror(errno));
	if (fstat(files[f].fd, &st_fd) < 0)
		die_call(f, "fstat: %s", strerror(errno));
	if (st_fd.st_ino != st_name.st_ino || (uint64_t)st_name.st_size != files[f].size)
		die_call(
		    f,
		    "after rename, %s has inode %ju size %jd; the open file has %ju, size %" PRIu64,
		    to, (uintmax_t)st_name.st_ino, (intmax_t)st_name.st_size,
		    (uintmax_t)st_fd.st_ino, files[f].size);
}

static void do_fsync(int f)
{
	log_op(f, 0, 0, "fsync  f%d, size %" PRIu64, f, files[f].size);
	if (fsync(files[f].fd) < 0)
		die_call(f, "fsync: %s", strerror(errno));
}

static void do_reopen(int f)
{
	log_op(f, 0, 0, "reopen f%d, size %" PRIu64, f, files[f].size);
	close_file(f);
	open_file(f, false);
	check_size(f, "reopen");
}

static void do_remount(void)
{
	pid_t pid;
	int status;

	cur_op++;
	log_op(-1, 0, 0, "remount: %s", cfg.remount_cmd);
	for (int f = 0; f < cfg.nfiles; f++)
		close_file(f);
	if (close(cfg.dirfd) < 0)
		die_call(-1, "close folder: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		die_call(-1, "fork: %s", strerror(errno));
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cfg.remount_cmd, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0)
		die_call(-1, "waitpid: %s", strerror(errno));
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		die_call(-1, "remount command failed (status 0x%x): %s", status, cfg.remount_cmd);
	cfg.dirfd = open(cfg.dir, O_RDONLY | O_DIRECTORY);
	if (cfg.dirfd < 0)
		die_call(-1, "open %s after remount: %s", cfg.dir, strerror(errno));
	for (int f = 0; f < cfg.nfiles; f++) {
		struct stat st;

		if (fstatat(cfg.dirfd, files[f].name[!files[f].name_idx], &st, 0) == 0)
			die_call(f, "after remount, old name %s exists again",
				 files[f].name[!files[f].name_idx]);
		open_file(f, false);
		full_compare(f, "compare after remount");
	}
	stat_remounts++;
}

static enum op_kind pick_op(void)
{
	unsigned total = 0, r;
	int k;

	for (k = 0; k < OP_NKINDS; k++)
		total += op_weight[k];
	r = rnd_below(total);
	for (k = 0; k < OP_NKINDS; k++) {
		if (r < op_weight[k])
			break;
		r -= op_weight[k];
	}
	return (enum op_kind)k;
}

static void run_op(void)
{
	enum op_kind k = pick_op();
	int f = (int)rnd_below(cfg.nfiles);

	stat_ops[k]++;
	switch (k) {
	case OP_WRITE:
		do_write(f);
		break;
	case OP_READ:
		do_read(f);
		break;
	case OP_TRUNCATE:
		do_truncate(f);
		break;
	case OP_FALLOC:
		do_falloc(f);
		break;
	case OP_PUNCH:
		do_punch(f);
		break;
	case OP_COPY:
		do_copy(f);
		break;
	case OP_RENAME:
		do_rename(f);
		break;
	case OP_FSYNC:
		do_fsync(f);
		break;
	case OP_REOPEN:
		do_reopen(f);
		break;
	case OP_NKINDS:
		break;
	}
}

/* ---- set-up ---- */

static uint64_t parse_size(const char *s, const char *what)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		goto bad;
	switch (*end) {
	case 'k':
	case 'K':
		v *= KiB;
		end++;
		break;
	case 'm':
	case 'M':
		v *= MiB;
		end++;
		break;
	case 'g':
	case 'G':
		v *= 1024 * MiB;
		end++;
		break;
	default:
		break;
	}
	if (*end == '\0')
		return v;
bad:
	fprintf(stderr, "fsx: bad %s: %s\n", what, s);
	exit(2);
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: fsx [options] DIR\n"
	    "  --ops N             operations to run (default %d)\n"
	    "  --seed S            random seed (default: from the clock)\n"
	    "  --direct            open files with O_DIRECT; aligned buffers and I/O\n"
	    "  --max-size SIZE     largest file size (default 16M)\n"
	    "  --files N           number of files (default %d)\n"
	    "  --block SIZE        the filesystem's block size, to aim at its boundaries (default "
	    "1M)\n"
	    "  --remount-cmd CMD   run `sh -c CMD` every --remount-every ops, files closed\n"
	    "  --remount-every N   (default ops/4 when --remount-cmd is given)\n"
	    "  --check-every N     compare whole files every N ops (default %d, 0 = never)\n"
	    "  --log N             operations to show on failure (default %d)\n"
	    "  --no-truncate --no-falloc --no-punch --no-copy --no-rename --no-fsync --no-reopen\n"
	    "  --keep              leave the files in DIR at the end\n"
	    "  -v, --verbose       print every operation\n",
	    DEFAULT_OPS, DEFAULT_FILES, DEFAULT_CHECK_EVERY, DEFAULT_LOG);
}

enum {
	O_OPS = 256,
	O_SEED,
	O_DIRECT_,
	O_MAXSIZE,
	O_FILES,
	O_BLOCK,
	O_RCMD,
	O_REVERY,
	O_CHECK,
	O_LOG,
	O_KEEP,
	O_NO_BASE, /* O_NO_BASE + op kind */
};

static void parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"ops", required_argument, NULL, O_OPS},
	    {"seed", required_argument, NULL, O_SEED},
	    {"direct", no_argument, NULL, O_DIRECT_},
	    {"max-size", required_argument, NULL, O_MAXSIZE},
	    {"files", required_argument, NULL, O_FILES},
	    {"block", required_argument, NULL, O_BLOCK},
	    {"remount-cmd", required_argument, NULL, O_RCMD},
	    {"remount-every", required_argument, NULL, O_REVERY},
	    {"check-every", required_argument, NULL, O_CHECK},
	    {"log", required_argument, NULL, O_LOG},
	    {"keep", no_argument, NULL, O_KEEP},
	    {"no-truncate", no_argument, NULL, O_NO_BASE + OP_TRUNCATE},
	    {"no-falloc", no_argument, NULL, O_NO_BASE + OP_FALLOC},
	    {"no-punch", no_argument, NULL, O_NO_BASE + OP_PUNCH},
	    {"no-copy", no_argument, NULL, O_NO_BASE + OP_COPY},
	    {"no-rename", no_argument, NULL, O_NO_BASE + OP_RENAME},
	    {"no-fsync", no_argument, NULL, O_NO_BASE + OP_FSYNC},
	    {"no-reopen", no_argument, NULL, O_NO_BASE + OP_REOPEN},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bool have_seed = false, have_every = false;
	int c;

	cfg.nops = DEFAULT_OPS;
	cfg.max_size = DEFAULT_MAX_SIZE;
	cfg.nfiles = DEFAULT_FILES;
	cfg.block = DEFAULT_BLOCK;
	cfg.check_every = DEFAULT_CHECK_EVERY;
	cfg.log_len = DEFAULT_LOG;
	while ((c = getopt_long(argc, argv, "vh", longopts, NULL)) != -1) {
		switch (c) {
		case O_OPS:
			cfg.nops = parse_size(optarg, "--ops");
			break;
		case O_SEED:
			cfg.seed = parse_size(optarg, "--seed");
			have_seed = true;
			break;
		case O_DIRECT_:
			cfg.direct = true;
			break;
		case O_MAXSIZE:
			cfg.max_size = parse_size(optarg, "--max-size");
			break;
		case O_FILES:
			cfg.nfiles = (int)parse_size(optarg, "--files");
			break;
		case O_BLOCK:
			cfg.block = parse_size(optarg, "--block");
			break;
		case O_RCMD:
			cfg.remount_cmd = optarg;
			break;
		case O_REVERY:
			cfg.remount_every = parse_size(optarg, "--remount-every");
			have_every = true;
			break;
		case O_CHECK:
			cfg.check_every = parse_size(optarg, "--check-every");
			break;
		case O_LOG:
			cfg.log_len = (int)parse_size(optarg, "--log");
			break;
		case O_KEEP:
			cfg.keep = true;
			break;
		case 'v':
			cfg.verbose = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			if (c >= O_NO_BASE && c < O_NO_BASE + OP_NKINDS) {
				op_weight[c - O_NO_BASE] = 0;
				break;
			}
			usage(stderr);
			exit(2);
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		exit(2);
	}
	cfg.dir = argv[optind];
	if (!have_seed) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		cfg.seed = ((uint64_t)ts.tv_sec * 1000003ULL) ^ (uint64_t)ts.tv_nsec ^
			   ((uint64_t)getpid() << 32);
		cfg.seed %= 1000000000000ULL;
	}
	if (cfg.remount_cmd && !have_every)
		cfg.remount_every = cfg.nops / 4 ? cfg.nops / 4 : 1;
	if (cfg.nfiles < 1 || cfg.nfiles > 64 || cfg.log_len < 1 || cfg.block == 0 ||
	    (cfg.block & (cfg.block - 1)) || cfg.max_size < 64 * KiB ||
	    (cfg.direct && cfg.max_size % DIRECT_ALIGN)) {
		fprintf(stderr, "fsx: bad arguments: --files 1..64, --log >= 1, --block a power of "
				"two, --max-size >= 64K (a multiple of 4K with --direct)\n");
		exit(2);
	}
}

static void *alloc_aligned(uint64_t size)
{
	void *p;
	int e = posix_memalign(&p, DIRECT_ALIGN, size);

	if (e) {
		fprintf(stderr, "fsx: out of memory (%" PRIu64 " bytes): %s\n", size, strerror(e));
		exit(1);
	}
	memset(p, 0, size);
	return p;
}

static void setup(void)
{
	uint64_t x = cfg.seed;

	for (int i = 0; i < 4; i++)
		rng_s[i] = splitmix64(&x);
	cfg.dirfd = open(cfg.dir, O_RDONLY | O_DIRECTORY);
	if (cfg.dirfd < 0) {
		fprintf(stderr, "fsx: open %s: %s\n", cfg.dir, strerror(errno));
		exit(1);
	}
	iobuf = alloc_aligned(cfg.max_size > COMPARE_CHUNK ? cfg.max_size : COMPARE_CHUNK);
	iobuf2 = alloc_aligned(cfg.max_size);
	oplog = calloc((size_t)cfg.log_len, sizeof(*oplog));
	files = calloc((size_t)cfg.nfiles, sizeof(*files));
	if (!oplog || !files) {
		fprintf(stderr, "fsx: out of memory\n");
		exit(1);
	}
	for (int f = 0; f < cfg.nfiles; f++) {
		snprintf(files[f].name[0], sizeof(files[f].name[0]), "fsx.%d.a", f);
		snprintf(files[f].name[1], sizeof(files[f].name[1]), "fsx.%d.b", f);
		files[f].model = alloc_aligned(cfg.max_size);
		for (int i = 0; i < 2; i++)
			if (unlinkat(cfg.dirfd, files[f].name[i], 0) < 0 && errno != ENOENT)
				die_call(f, "unlink old %s: %s", files[f].name[i], strerror(errno));
		open_file(f, true);
	}
}

static void teardown(void)
{
	for (int f = 0; f < cfg.nfiles; f++) {
		close_file(f);
		if (!cfg.keep && unlinkat(cfg.dirfd, fname(f), 0) < 0)
			die_call(f, "unlink: %s", strerror(errno));
	}
	close(cfg.dirfd);
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	printf("fsx: seed %" PRIu64 " ops %" PRIu64 " files %d max-size %" PRIu64 " block %" PRIu64
	       "%s dir %s\n",
	       cfg.seed, cfg.nops, cfg.nfiles, cfg.max_size, cfg.block, cfg.direct ? " direct" : "",
	       cfg.dir);
	fflush(stdout);
	setup();
	for (uint64_t i = 0; i < cfg.nops; i++) {
		cur_op++;
		run_op();
		if (cfg.remount_cmd && cfg.remount_every && (i + 1) % cfg.remount_every == 0)
			do_remount();
		else if (cfg.check_every && (i + 1) % cfg.check_every == 0)
			full_compare_all("periodic full compare");
	}
	cur_op++;
	full_compare_all("final full compare");
	teardown();
	print_stats(stdout);
	printf("fsx: PASSED, seed %" PRIu64 "\n", cfg.seed);
	return 0;
}
