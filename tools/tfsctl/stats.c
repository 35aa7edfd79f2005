/*
 * stats.c - tfsctl stats and tfsctl top: the counters of .tensorfs/stats
 * for people.
 *
 * stats prints one snapshot; its layout is documented in tfsctl(8) so that
 * scripts may rely on it (though --json is the better input). top redraws
 * a compact view every second, within 80 columns, with rates computed
 * between two snapshots; it puts the terminal in non-canonical mode to see
 * a q without Enter, and restores it on every way out.
 */
#include "tfsctl.h"
#include "escape.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define WIDTH 80 /* what top's lines fit, as a terminal's default */

static const char *jstr(json_t *obj, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(obj, key));

	return s ? s : dflt;
}

/* Rates come with newer daemons only: "-" where the field is missing. */
static void fmt_gbps(json_t *t, const char *key, char *buf, size_t len)
{
	json_t *v = json_object_get(t, key);

	if (json_is_number(v))
		snprintf(buf, len, "%.2f", json_number_value(v) / 1e9);
	else
		snprintf(buf, len, "-");
}

/*
 * "ok", or what is wrong now, as the daemon says it (devices down or full,
 * errors in its recent window). An older daemon says nothing: then what
 * was ever wrong, from the lifetime counts.
 */
static void health(json_t *st, char *buf, size_t len)
{
	json_t *tiers = json_object_get(st, "tiers"), *t;
	const char *name, *now = json_string_value(json_object_get(st, "health"));
	size_t n = 0;

	if (now) {
		snprintf(buf, len, "%s", now);
		return;
	}
	buf[0] = 0;
	json_object_foreach(tiers, name, t) {
		if (strcmp(jstr(t, "state", "up"), "up") != 0)
			n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s down",
					      n ? ", " : "", name);
		if (jint(t, "errors"))
			n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s: %llu errors",
					      n ? ", " : "", name,
					      (unsigned long long)jint(t, "errors"));
	}
	uint64_t wbe = jint(json_object_get(st, "cache"), "writeback_errors");
	if (wbe)
		n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%llu write-back errors",
				      n ? ", " : "", (unsigned long long)wbe);
	if (n == 0)
		snprintf(buf, len, "ok");
}

/* ---- stats ---- */

static void print_tiers(json_t *st)
{
	json_t *tiers = json_object_get(st, "tiers"), *t;
	const char *name;
	uint64_t cap = 0, used = 0, rb = 0, wb = 0, err = 0;
	double rbps = 0, wbps = 0;
	unsigned ndev = 0;
	char c[16], u[16], r[16], w[16], tr[16], tw[16];

	printf("%-7s %-5s %9s %9s %8s %8s %9s %9s %6s\n", "TIER", "STATE", "CAPACITY", "USED",
	       "RD GB/s", "WR GB/s", "READ", "WRITTEN", "ERRORS");
	json_object_foreach(tiers, name, t) {
		fmt_bytes(jint(t, "capacity"), c, sizeof(c));
		fmt_bytes(jint(t, "used"), u, sizeof(u));
		fmt_gbps(t, "read_bps", r, sizeof(r));
		fmt_gbps(t, "write_bps", w, sizeof(w));
		fmt_bytes(jint(t, "read_bytes"), tr, sizeof(tr));
		fmt_bytes(jint(t, "write_bytes"), tw, sizeof(tw));
		printf("%-7.7s %-5.5s %9s %9s %8s %8s %9s %9s %6llu\n", name,
		       jstr(t, "state", "up"), c, u, r, w, tr, tw,
		       (unsigned long long)jint(t, "errors"));
		if (strcmp(name, "dram") == 0)
			continue;
		/* The total is of the persistent tiers: what the drives do together. */
		ndev++;
		cap += jint(t, "capacity");
		used += jint(t, "used");
		rb += jint(t, "read_bytes");
		wb += jint(t, "write_bytes");
		err += jint(t, "errors");
		rbps += jreal(t, "read_bps");
		wbps += jreal(t, "write_bps");
	}
	if (ndev > 1) {
		fmt_bytes(cap, c, sizeof(c));
		fmt_bytes(used, u, sizeof(u));
		fmt_bytes(rb, tr, sizeof(tr));
		fmt_bytes(wb, tw, sizeof(tw));
		printf("%-7s %-5s %9s %9s %8.2f %8.2f %9s %9s %6llu\n", "total", "-", c, u,
		       rbps / 1e9, wbps / 1e9, tr, tw, (unsigned long long)err);
	}
}

static void print_queues(json_t *st)
{
	json_t *tiers = json_object_get(st, "tiers"), *t;
	const char *name;
	bool head = false;
	char bw[24], cap[24], share[16];
	double weights = 0;

	/* SHARE: of new blocks, what each device is sent now (its placement weight) */
	json_object_foreach(tiers, name, t)
		weights += jreal(t, "weight");
	json_object_foreach(tiers, name, t) {
		if (!json_object_get(t, "queued"))
			continue; /* dram has no queue */
		if (!head)
			printf("\n%-7s %6s %6s %8s %9s  %-8s %10s %10s %5s\n", "QUEUE", "QUEUED",
			       "DEMAND", "PREFETCH", "WRITEBACK", "ENGINE", "BW", "BW CAP", "SHARE");
		head = true;
		fmt_rate((double)jint(t, "bw_measured"), bw, sizeof(bw));
		if (jint(t, "bw_cap"))
			fmt_rate((double)jint(t, "bw_cap"), cap, sizeof(cap));
		else
			snprintf(cap, sizeof(cap), "-");
		if (weights > 0)
			snprintf(share, sizeof(share), "%.0f%%", 100 * jreal(t, "weight") / weights);
		else
			snprintf(share, sizeof(share), "-");
		printf("%-7.7s %6llu %6llu %8llu %9llu  %-8.8s %10s %10s %5s\n", name,
		       (unsigned long long)jint(t, "queued"),
		       (unsigned long long)jint(t, "inflight_demand"),
		       (unsigned long long)jint(t, "inflight_prefetch"),
		       (unsigned long long)jint(t, "inflight_writeback"), jstr(t, "engine", "-"),
		       bw, cap, share);
	}
}

/* "name value, name value, ..." wrapped at 80 columns under a 10-column label. */
static void print_counters(const char *label, json_t *obj)
{
	const char *key;
	json_t *v;
	int col = printf("%-9s ", label);

	json_object_foreach(obj, key, v) {
		char item[96], num[24];
		size_t klen = strlen(key);

		if (!json_is_number(v))
			continue;
		if (klen > 6 && strcmp(key + klen - 6, "_bytes") == 0)
			fmt_bytes(jint(obj, key), num, sizeof(num));
		else if (json_is_real(v))
			snprintf(num, sizeof(num), "%.3g", json_real_value(v));
		else
			snprintf(num, sizeof(num), "%llu", (unsigned long long)jint(obj, key));
		int n = snprintf(item, sizeof(item), "%s %s", key, num);
		if (col > 10 && col + 2 + n > WIDTH) {
			printf(",\n%-9s ", "");
			col = 10;
		} else if (col > 10) {
			printf(", ");
			col += 2;
		}
		col += printf("%s", item);
	}
	putchar('\n');
}

/* The metadata store: its file, what LMDB uses of it, and the live part. */
static void print_meta(json_t *m)
{
	char file[16], used[16], tree[16], fr[16];

	if (!json_object_get(m, "file_bytes"))
		return; /* an older daemon */
	fmt_bytes(jint(m, "file_bytes"), file, sizeof(file));
	fmt_bytes(jint(m, "used_bytes"), used, sizeof(used));
	fmt_bytes(jint(m, "tree_bytes"), tree, sizeof(tree));
	fmt_bytes(jint(m, "free_bytes"), fr, sizeof(fr));
	printf("meta      %llu inodes, data.mdb %s (used %s: live %s, free %s), "
	       "%llu commits unsynced\n",
	       (unsigned long long)jint(m, "inodes"), file, used, tree, fr,
	       (unsigned long long)jint(m, "unsynced_commits"));
}

static void print_summary(json_t *st)
{
	json_t *c = json_object_get(st, "cache"), *p = json_object_get(st, "prefetch");
	json_t *d = json_object_get(st, "dedup");
	char a[16], b[16], e[16], f[16], hl[512];

	fmt_pct(jreal(c, "hit_rate"), a, sizeof(a));
	printf("\ncache     hit rate %s (hits %llu, misses %llu), policy %s\n", a,
	       (unsigned long long)jint(c, "hits"), (unsigned long long)jint(c, "misses"),
	       jstr(c, "policy", "-"));
	fmt_bytes(jint(c, "dirty_bytes"), a, sizeof(a));
	fmt_bytes(jint(c, "pinned_bytes"), b, sizeof(b));
	fmt_bytes(jint(c, "writeback_bytes"), e, sizeof(e));
	printf("          dirty %s, pinned %s, evictions %llu, written back %s\n", a, b,
	       (unsigned long long)jint(c, "evictions"), e);
	fmt_pct(jreal(p, "accuracy"), a, sizeof(a));
	printf("prefetch  accuracy %s (issued %llu, used %llu, wasted %llu, late %llu), window %llu blocks\n",
	       a, (unsigned long long)jint(p, "issued"), (unsigned long long)jint(p, "used"),
	       (unsigned long long)jint(p, "wasted"), (unsigned long long)jint(p, "late"),
	       (unsigned long long)jint(p, "depth_blocks"));
	fmt_bytes(jint(d, "logical_bytes"), e, sizeof(e));
	fmt_bytes(jint(d, "physical_bytes"), f, sizeof(f));
	printf("dedup     ratio %.2f (logical %s, physical %s, hits %llu)\n", jreal(d, "ratio"), e,
	       f, (unsigned long long)jint(d, "hits"));
	print_counters("checksum", json_object_get(st, "checksum"));
	print_counters("fuse", json_object_get(st, "fuse"));
	health(st, hl, sizeof(hl));
	printf("health    %s\n", hl);
	print_meta(json_object_get(st, "meta"));
}

int cmd_stats(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;
	char bs[16];
	json_t *st;

	(void)argv;
	if (argc > 0) {
		errmsg("stats takes no argument");
		fprintf(stderr, "usage: tfsctl stats [--json]\n");
		return EXIT_USAGE;
	}
	if (tfs_find_mount(a->mopt, NULL, &m) < 0 || !(st = tfs_read_json(&m, "stats")))
		return EXIT_RUNTIME;
	if (a->json)
		return tfs_print_json(st);
	fmt_bytes(jint(st, "block_size"), bs, sizeof(bs));
	print_name("tensorfs ", jstr(st, "version", "?"));
	print_name(" at ", m.root);
	printf(", block size %s\n\n", bs);
	print_tiers(st);
	print_queues(st);
	print_summary(st);
	json_decref(st);
	return 0;
}

/* ---- top ---- */

static volatile sig_atomic_t top_stop;
static struct termios saved_tio;
static bool tio_saved, screen_taken;

static void on_signal(int sig)
{
	(void)sig;
	top_stop = 1;
}

static void restore_terminal(void)
{
	if (screen_taken) {
		/* cursor back, and the screen the user had before */
		fputs("\033[?25h\033[?1049l", stdout);
		fflush(stdout);
		screen_taken = false;
	}
	if (tio_saved) {
		tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
		tio_saved = false;
	}
}

static void take_terminal(void)
{
	struct sigaction sa = {.sa_handler = on_signal};

	/* No SA_RESTART: the signal must cut poll short. */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	atexit(restore_terminal);
	if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_tio) == 0) {
		struct termios raw = saved_tio;

		/* Keys without Enter and without echo; Ctrl-C still signals. */
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) == 0)
			tio_saved = true;
	}
	if (isatty(STDOUT_FILENO)) {
		fputs("\033[?1049h\033[?25l", stdout);
		screen_taken = true;
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Counter field of obj per second since prev's; -1 without a previous sample. */
static double per_s(json_t *cur, json_t *prev, const char *field, double dt)
{
	if (!prev || dt <= 0)
		return -1;
	uint64_t a = jint(cur, field), b = jint(prev, field);
	return a >= b ? (double)(a - b) / dt : 0;
}

static void fmt_per_s(double v, char *buf, size_t len)
{
	if (v < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.0f", v);
}

/* One line of at most WIDTH columns into the frame. */
static void line(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(FILE *f, const char *fmt, ...)
{
	char buf[WIDTH + 1];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	/* \033[K clears what a longer line of the last frame left. */
	fprintf(f, "%s%s\n", buf, screen_taken ? "\033[K" : "");
}

static void top_frame(FILE *f, const struct tfs_mount *m, json_t *st, json_t *prev, double dt)
{
	json_t *tiers = json_object_get(st, "tiers"), *t;
	json_t *c = json_object_get(st, "cache"), *p = json_object_get(st, "prefetch");
	json_t *pc = prev ? json_object_get(prev, "cache") : NULL;
	json_t *pp = prev ? json_object_get(prev, "prefetch") : NULL;
	json_t *fu = json_object_get(st, "fuse"), *pf = prev ? json_object_get(prev, "fuse") : NULL;
	const char *name;
	char a[24], b[24], e[24], g[24], q[24], clock[16], hl[256], root[ESC_SIZE(PATH_MAX)];
	time_t now = time(NULL);

	strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
	line(f, "tensorfs at %-45.45s %8s   q quits", esc_name(m->root, root, sizeof(root)),
	     clock);
	line(f, "%s", "");
	line(f, "%-7s %-5s %17s %10s %10s %13s %6s", "TIER", "STATE", "USED / CAPACITY", "READ/s",
	     "WRITE/s", "QUEUE q/d/p/w", "ERRORS");
	json_object_foreach(tiers, name, t) {
		char used[56];

		fmt_bytes(jint(t, "used"), a, sizeof(a));
		fmt_bytes(jint(t, "capacity"), b, sizeof(b));
		snprintf(used, sizeof(used), "%s / %s", a, b);
		fmt_rate(jreal(t, "read_bps"), e, sizeof(e));
		fmt_rate(jreal(t, "write_bps"), g, sizeof(g));
		if (json_object_get(t, "queued"))
			snprintf(q, sizeof(q), "%llu/%llu/%llu/%llu",
				 (unsigned long long)jint(t, "queued"),
				 (unsigned long long)jint(t, "inflight_demand"),
				 (unsigned long long)jint(t, "inflight_prefetch"),
				 (unsigned long long)jint(t, "inflight_writeback"));
		else
			snprintf(q, sizeof(q), "-");
		line(f, "%-7.7s %-5.5s %17s %10s %10s %13s %6llu", name, jstr(t, "state", "up"),
		     used, e, g, q, (unsigned long long)jint(t, "errors"));
	}
	line(f, "%s", "");

	/* Hit rate of the last interval where it had lookups, else since mount. */
	double dh = per_s(c, pc, "hits", dt), dm = per_s(c, pc, "misses", dt);
	fmt_pct(jreal(c, "hit_rate"), a, sizeof(a));
	if (dh + dm > 0)
		fmt_pct(dh / (dh + dm), b, sizeof(b));
	else
		snprintf(b, sizeof(b), "-");
	fmt_bytes(jint(c, "dirty_bytes"), e, sizeof(e));
	fmt_bytes(jint(c, "pinned_bytes"), g, sizeof(g));
	fmt_per_s(per_s(c, pc, "evictions", dt), q, sizeof(q));
	line(f, "cache     hit %s now, %s total   dirty %s   pinned %s   evict/s %s", b, a, e, g,
	     q);
	fmt_pct(jreal(p, "accuracy"), a, sizeof(a));
	fmt_per_s(per_s(p, pp, "issued", dt), b, sizeof(b));
	fmt_per_s(per_s(p, pp, "used", dt), e, sizeof(e));
	line(f, "prefetch  accuracy %s   issued/s %s   used/s %s   late %llu   window %llu", a, b, e,
	     (unsigned long long)jint(p, "late"), (unsigned long long)jint(p, "depth_blocks"));
	json_t *d = json_object_get(st, "dedup");
	fmt_bytes(jint(d, "logical_bytes"), a, sizeof(a));
	fmt_bytes(jint(d, "physical_bytes"), b, sizeof(b));
	line(f, "dedup     ratio %.2f   logical %s   physical %s", jreal(d, "ratio"), a, b);

	char r[16], w[16], o[16], l[16], ga[16];
	fmt_per_s(per_s(fu, pf, "read", dt), r, sizeof(r));
	fmt_per_s(per_s(fu, pf, "write", dt), w, sizeof(w));
	fmt_per_s(per_s(fu, pf, "open", dt), o, sizeof(o));
	fmt_per_s(per_s(fu, pf, "lookup", dt), l, sizeof(l));
	fmt_per_s(per_s(fu, pf, "getattr", dt), ga, sizeof(ga));
	line(f, "fuse/s    read %s   write %s   open %s   lookup %s   getattr %s", r, w, o, l, ga);
	double rb = per_s(fu, pf, "read_bytes", dt), wb = per_s(fu, pf, "write_bytes", dt);
	fmt_rate(rb < 0 ? 0 : rb, a, sizeof(a));
	fmt_rate(wb < 0 ? 0 : wb, b, sizeof(b));
	line(f, "fuse      read %s   write %s   errors %llu", rb < 0 ? "-" : a, wb < 0 ? "-" : b,
	     (unsigned long long)jint(fu, "errors"));
	health(st, hl, sizeof(hl));
	line(f, "health    %s", hl);
}

/* A snapshot, reporting nothing: NULL with errno set, or 0 for bad JSON. */
static json_t *read_stats(const struct tfs_mount *m)
{
	size_t len;
	char *text = tfs_read_ctl(m, "stats", &len);
	json_t *j;

	if (!text)
		return NULL;
	j = json_loadb(text, len, 0, NULL);
	free(text);
	if (!json_is_object(j)) {
		json_decref(j);
		errno = 0;
		return NULL;
	}
	return j;
}

/* Wait up to ms for a key; true when it asks to quit. */
static bool wait_key(int ms, bool *watch_stdin)
{
	double end = now_s() + ms / 1000.0;

	while (!top_stop) {
		double left = end - now_s();
		struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
		char ch;

		if (left <= 0)
			return false;
		int n = poll(&pfd, *watch_stdin ? 1 : 0, (int)(left * 1000) + 1);
		if (n <= 0)
			continue; /* timeout, or a signal: the loop checks both */
		ssize_t r = read(STDIN_FILENO, &ch, 1);
		if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
			*watch_stdin = false; /* stdin closed: only a signal stops us now */
			continue;
		}
		if (r == 1 && (ch == 'q' || ch == 'Q' || ch == 3 /* Ctrl-C without ISIG */))
			return true;
	}
	return true;
}

int cmd_top(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;
	json_t *prev = NULL;
	double prev_t = 0;
	bool watch = true;
	int status = 0;

	(void)argv;
	if (argc > 0) {
		errmsg("top takes no argument");
		fprintf(stderr, "usage: tfsctl top [-n N | --once]\n");
		return EXIT_USAGE;
	}
	if (tfs_find_mount(a->mopt, NULL, &m) < 0)
		return EXIT_RUNTIME;
	take_terminal();
	for (long frame = 0; !top_stop; frame++) {
		json_t *st = read_stats(&m);
		char *text = NULL;
		size_t len = 0;
		double t = now_s();

		if (!st) {
			/* Say why on the user's screen, not the one top drew on. */
			int err = errno;
			restore_terminal();
			errmsg("%s/" CTL_DIR "/stats: %s", m.root,
			       err ? strerror(err) : "not the JSON expected");
			status = EXIT_RUNTIME;
			break;
		}
		FILE *f = open_memstream(&text, &len);
		if (!f) {
			json_decref(st);
			status = EXIT_RUNTIME;
			break;
		}
		top_frame(f, &m, st, prev, t - prev_t);
		fclose(f);
		/* One write per frame, from the top left: no flicker. */
		if (screen_taken)
			fputs("\033[H", stdout);
		else if (frame)
			putchar('\n');
		fwrite(text, 1, len, stdout);
		if (screen_taken)
			fputs("\033[J", stdout);
		fflush(stdout);
		free(text);
		json_decref(prev);
		prev = st;
		prev_t = t;
		if (a->iterations && frame + 1 >= a->iterations)
			break;
		if (wait_key(1000, &watch))
			break;
	}
	json_decref(prev);
	restore_terminal();
	return status;
}
