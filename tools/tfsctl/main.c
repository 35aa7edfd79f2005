/*
 * tfsctl - look at a tensorfs mount and steer it.
 *
 *   tfsctl [-m MOUNTPOINT] COMMAND [ARGS]
 *
 * Every command but fsck works on a live mount: the one named by -m, else
 * the one the command's PATH lies in, else the one the current folder lies
 * in. This file holds the command table, option parsing, and the commands
 * that are a single control-file access (the ctl commands, config, metrics,
 * fsck); stats and top are in stats.c, where in where.c, unmount in
 * unmount.c. It calls them, mount.c (finding the mount, its control
 * files), format.c and msg.c (messages); none of them calls back.
 */
#include "tfsctl.h"
#include "escape.h"
#include "fsck.h"
#include "help.h" /* help_texts[], made from help.txt */

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int cmd_ctl(int argc, char **argv, const struct tfs_args *a);
static int cmd_flush(int argc, char **argv, const struct tfs_args *a);
static int cmd_config(int argc, char **argv, const struct tfs_args *a);
static int cmd_metrics(int argc, char **argv, const struct tfs_args *a);
static int cmd_pins(int argc, char **argv, const struct tfs_args *a);
static int cmd_fsck(int argc, char **argv, const struct tfs_args *a);
static int cmd_scrub(int argc, char **argv, const struct tfs_args *a);

static const struct command {
	const char *name;
	int (*fn)(int argc, char **argv, const struct tfs_args *a);
	const char *args;
	const char *summary; /* its --help text: help.txt */
} commands[] = {
    {"stats", cmd_stats, "[--json]", "tiers, cache, prefetch, dedup and FUSE counters"},
    {"top", cmd_top, "[-n N | --once]", "live view, refreshed every second"},
    {"where", cmd_where, "[--json] PATH", "bytes of a file or folder per tier"},
    {"prefetch", cmd_ctl, "PATH...", "load files into DRAM ahead of use"},
    {"pin", cmd_ctl, "PATH...", "load files into DRAM and keep them there"},
    {"unpin", cmd_ctl, "PATH...", "let pinned files be evicted again"},
    {"evict", cmd_ctl, "PATH...", "write back files and drop them from DRAM"},
    {"pins", cmd_pins, "[--json]", "list the pinned files"},
    {"flush", cmd_flush, "", "write back everything dirty and make it durable"},
    {"scrub", cmd_scrub, "[--json]", "check every stored block against its hash"},
    {"config", cmd_config, "[--json]", "the effective configuration"},
    {"metrics", cmd_metrics, "", "the Prometheus metrics"},
    {"unmount", cmd_unmount, "MOUNTPOINT", "unmount, and wait until all is written back"},
    {"fsck", cmd_fsck, "[--repair] META_DIR", "check (and repair) a stopped store"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < N_COMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tfsctl [-m MOUNTPOINT] COMMAND [ARGS]\n"
		   "\n"
		   "Look at a tensorfs mount and steer it, through its .tensorfs control files.\n"
		   "The mount is -m's, else the one PATH lies in, else the current folder's.\n"
		   "\n"
		   "commands:\n");
	for (size_t i = 0; i < N_COMMANDS; i++) {
		char syn[64];

		snprintf(syn, sizeof(syn), "%s %s", commands[i].name, commands[i].args);
		fprintf(f, "  %-28s %s\n", syn, commands[i].summary);
	}
	fprintf(f,
		"\n"
		"options:\n"
		"  -m, --mount MOUNTPOINT   the mount to work on\n"
		"  -h, --help               this help; COMMAND --help for a command's\n"
		"  -V, --version            print the version\n"
		"\n"
		"Exit status: 0 done, 1 failed, 2 wrong usage (fsck: see tfsctl fsck --help).\n");
}

static void command_help(const struct command *c)
{
	const char *text = "";

	for (size_t i = 0; i < sizeof(help_texts) / sizeof(help_texts[0]); i++)
		if (strcmp(help_texts[i].name, c->name) == 0)
			text = help_texts[i].text;
	printf("usage: tfsctl [-m MOUNTPOINT] %s %s\n\n%s", c->name, c->args, text);
	if (c->fn != cmd_fsck)
		printf("\n  -m, --mount MOUNTPOINT   the mount to work on\n");
	printf("  -h, --help               this help\n");
}

static int bad_usage(const struct command *c, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nusage: tfsctl %s %s (tfsctl %s --help for more)\n", c->name, c->args,
		c->name);
	return EXIT_USAGE;
}

/*
 * Options every command takes (-m, -h) plus its own flags. Returns -1 to go
 * on, or an exit status (help printed, or wrong usage).
 */
static int parse_flags(const struct command *c, int *argc, char ***argv, struct tfs_args *fl)
{
	static const struct option opts[] = {
	    {"mount", required_argument, NULL, 'm'},
	    {"help", no_argument, NULL, 'h'},
	    {"json", no_argument, NULL, 'j'},
	    {"repair", no_argument, NULL, 'r'},
	    {"iterations", required_argument, NULL, 'n'},
	    {"once", no_argument, NULL, 'o'},
	    {NULL, 0, NULL, 0},
	};
	bool takes_json = c->fn == cmd_stats || c->fn == cmd_where || c->fn == cmd_config ||
			  c->fn == cmd_pins || c->fn == cmd_scrub;
	int ch;

	optind = 0; /* restart getopt on the command's own arguments */
	opterr = 0;
	while ((ch = getopt_long(*argc, *argv, "+m:hrn:", opts, NULL)) != -1) {
		switch (ch) {
		case 'm':
			if (c->fn == cmd_fsck)
				return bad_usage(c, "fsck works on a store folder, not a mount");
			fl->mopt = optarg;
			break;
		case 'h':
			command_help(c);
			return 0;
		case 'j':
			if (!takes_json)
				return bad_usage(c, "%s has no --json", c->name);
			fl->json = true;
			break;
		case 'r':
			if (c->fn != cmd_fsck)
				return bad_usage(c, "only fsck takes --repair");
			fl->repair = true;
			break;
		case 'n':
		case 'o': {
			char *end;

			if (c->fn != cmd_top)
				return bad_usage(c, "only top takes -n and --once");
			fl->iterations = ch == 'o' ? 1 : strtol(optarg, &end, 10);
			if (ch == 'n' && (*end || fl->iterations < 1))
				return bad_usage(c, "-n wants a count of refreshes, not '%s'",
						 optarg);
			break;
		}
		default:
			if (optopt)
				return bad_usage(c, "option -%c is unknown or lacks its argument",
						 optopt);
			return bad_usage(c, "option %s is unknown or lacks its argument",
					 (*argv)[optind - 1]);
		}
	}
	*argc -= optind;
	*argv += optind;
	return -1;
}

/* ---- prefetch, pin, unpin, evict, flush ---- */

/* Say what went wrong with verb on what (a path, or "" for flush). */
/*
 * A pin that did not fit: the mount's bound on pins (pin_limit_bytes in
 * its stats: its DRAM less a quarter that writers cycle through and the
 * readers' reserve), what is pinned already and what PATH holds.
 */
static void pin_error(const struct tfs_mount *m, const char *what, const char *lead)
{
	json_t *st = tfs_read_json(m, "stats"), *c = st ? json_object_get(st, "cache") : NULL;
	json_t *lim = c ? json_object_get(c, "pin_limit_bytes") : NULL;
	json_t *pinned = c ? json_object_get(c, "pinned_bytes") : NULL;
	struct stat sb;
	char size[64] = "";

	if (what[0] && stat(what, &sb) == 0 && S_ISREG(sb.st_mode))
		snprintf(size, sizeof(size), "its %.0f MiB ", (double)sb.st_size / (1 << 20));
	else if (what[0])
		snprintf(size, sizeof(size), "its files ");
	if (json_is_integer(lim) && json_is_integer(pinned))
		errmsg("%s%sdo not fit next to what is pinned: pins may hold %.0f MiB of this "
		       "mount's DRAM (pin_limit_bytes: dram= less a quarter kept for writers "
		       "and the readers' reserve), %.0f MiB are pinned already; unpin something "
		       "(tfsctl pins lists them), or mount with a larger dram=",
		       lead, size, (double)json_integer_value(lim) / (1 << 20),
		       (double)json_integer_value(pinned) / (1 << 20));
	else
		errmsg("%sdoes not fit in DRAM next to what is pinned already, or no space is "
		       "left to record it; unpin something, or mount with more dram= (tfsctl "
		       "stats shows pin_limit_bytes)",
		       lead);
	json_decref(st);
}

static void ctl_error(const struct tfs_mount *m, const char *verb, const char *what, int err,
		      bool opened)
{
	char lead[PATH_MAX + 8];

	if (!opened && err == -ENOENT) {
		errmsg("%s: this tensorfs has no .tensorfs/ctl; it is too old for %s", m->root,
		       verb);
		return;
	}
	/* errmsg's prefix names the command (tfsctl pin): the message starts at PATH */
	snprintf(lead, sizeof(lead), "%s%s", what, what[0] ? ": " : "");
	switch (-err) {
	case EACCES:
	case EPERM:
		errmsg("%spermission denied: only the mount's owner or root may send "
		       "commands",
		       lead);
		break;
	case ENOENT:
		errmsg("%sno such file or folder in the mount (removed meanwhile?)", lead);
		break;
	case ENOSPC:
		/* Only pin has a DRAM budget; the others write back, to devices that can fill. */
		if (strcmp(verb, "pin") == 0)
			pin_error(m, what, lead);
		else
			errmsg("%sno space left on the devices: write-back failed, and the "
			       "data waits in DRAM; free space on the full device or on the meta "
			       "folder's filesystem (tfsctl stats says which), then try again",
			       lead);
		break;
	case EIO:
		errmsg("%sI/O error on a device; tfsctl stats and the daemon's log say "
		       "which",
		       lead);
		break;
	case EINTR:
		errmsg("%sinterrupted; whatever it had not done stays as it was", lead);
		break;
	case EINVAL:
		errmsg("%sthe mount refused the command; its log says why", lead);
		break;
	default:
		errmsg("%s%s", lead, strerror(-err));
	}
}

static int cmd_ctl(int argc, char **argv, const struct tfs_args *a)
{
	const char *verb = a->cmd;
	int status = 0;

	if (argc < 1)
		return bad_usage(find_command(verb), "%s needs a PATH", verb);
	for (int i = 0; i < argc; i++) {
		struct tfs_mount m;
		char target[PATH_MAX + 32], cmd[PATH_MAX + 64];
		bool opened;

		if (tfs_find_mount(a->mopt, argv[i], &m) < 0 ||
		    tfs_ctl_target(&m, argv[i], target, sizeof(target)) < 0) {
			status = EXIT_RUNTIME;
			continue;
		}
		snprintf(cmd, sizeof(cmd), "%s %s\n", verb, target);
		int ret = tfs_ctl_write(&m, cmd, &opened);
		if (ret) {
			ctl_error(&m, verb, argv[i], ret, opened);
			status = EXIT_RUNTIME;
		}
	}
	return status;
}

/*
 * Write the control command NAME, which takes no argument, to the mount:
 * 0, or an exit status once said (wrong usage, no mount, or the write
 * failed; busy is the message for -EBUSY, NULL for the usual one).
 */
static int ctl_plain(const char *name, const char *busy, int argc, const struct tfs_args *a,
		     struct tfs_mount *m)
{
	char line[32];
	bool opened;
	int ret;

	if (argc > 0)
		return bad_usage(find_command(name), "%s takes no argument", name);
	if (tfs_find_mount(a->mopt, NULL, m) < 0)
		return EXIT_RUNTIME;
	snprintf(line, sizeof(line), "%s\n", name);
	ret = tfs_ctl_write(m, line, &opened);
	if (ret == -EBUSY && busy)
		errmsg("%s: %s", m->root, busy);
	else if (ret)
		ctl_error(m, name, "", ret, opened);
	return ret ? EXIT_RUNTIME : 0;
}

static int cmd_flush(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;

	(void)argv;
	return ctl_plain("flush", NULL, argc, a, &m);
}

/* ---- config, metrics ---- */

/* Keys whose values are secrets, should a daemon ever put one in its config. */
static bool secret_key(const char *key)
{
	static const char *const words[] = {"secret", "password", "token", "access_key",
					    "credential_value"};

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		if (strcasestr(key, words[i]))
			return true;
	return false;
}

static void print_flat(const char *prefix, json_t *v)
{
	const char *key;
	json_t *child;
	size_t i;

	if (json_is_object(v)) {
		if (json_object_size(v) == 0)
			printf("%s = {}\n", prefix);
		json_object_foreach(v, key, child) {
			char name[512];

			char ekey[ESC_SIZE(256)];

			snprintf(name, sizeof(name), "%s%s%s", prefix, prefix[0] ? "." : "",
				 esc_name(key, ekey, sizeof(ekey)));
			if (secret_key(key))
				printf("%s = (hidden)\n", name);
			else
				print_flat(name, child);
		}
		return;
	}
	printf("%s = ", prefix);
	if (json_is_array(v)) {
		json_array_foreach(v, i, child) {
			char *s = json_is_string(child) ? NULL : json_dumps(child, JSON_ENCODE_ANY);

			print_name(i ? "," : "", s ? s : json_string_value(child));
			free(s);
		}
	} else if (json_is_string(v)) {
		print_name("", json_string_value(v));
	} else {
		char *s = json_dumps(v, JSON_ENCODE_ANY);

		printf("%s", s ? s : "?");
		free(s);
	}
	putchar('\n');
}

/* Drop secrets from a config object before printing it as JSON. */
static void redact(json_t *v)
{
	const char *key;
	json_t *child;

	if (!json_is_object(v))
		return;
	json_object_foreach(v, key, child) {
		if (secret_key(key))
			json_object_set_new(v, key, json_string("(hidden)"));
		else
			redact(child);
	}
}

static int cmd_config(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;
	json_t *j;

	(void)argv;
	if (argc > 0)
		return bad_usage(find_command("config"), "config takes no argument");
	if (tfs_find_mount(a->mopt, NULL, &m) < 0 || !(j = tfs_read_json(&m, "config")))
		return EXIT_RUNTIME;
	redact(j);
	if (a->json) {
		json_dumpf(j, stdout, JSON_OUT);
		putchar('\n');
	} else {
		print_flat("", j);
	}
	json_decref(j);
	return 0;
}

static int cmd_metrics(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;
	size_t len;
	char *text;

	(void)argv;
	if (argc > 0)
		return bad_usage(find_command("metrics"), "metrics takes no argument");
	if (tfs_find_mount(a->mopt, NULL, &m) < 0)
		return EXIT_RUNTIME;
	text = tfs_read_ctl(&m, "metrics", &len);
	if (!text) {
		errmsg("%s/" CTL_DIR "/metrics: %s", m.root, strerror(errno));
		return EXIT_RUNTIME;
	}
	fwrite(text, 1, len, stdout);
	free(text);
	return 0;
}

/* ---- pins ---- */

static int cmd_pins(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;
	json_t *j, *list, *p;
	size_t i;

	(void)argv;
	if (argc > 0)
		return bad_usage(find_command("pins"), "pins takes no argument");
	if (tfs_find_mount(a->mopt, NULL, &m) < 0 || !(j = tfs_read_json(&m, "pins")))
		return EXIT_RUNTIME;
	if (a->json)
		return tfs_print_json(j);
	list = json_object_get(j, "pins");
	if (json_array_size(list) == 0)
		printf("no file is pinned\n");
	else
		printf("%-44s %9s %9s %9s\n", "PATH", "SIZE", "STORED", "RESIDENT");
	json_array_foreach(list, i, p) {
		const char *path = json_string_value(json_object_get(p, "path"));
		char size[16], stored[16], res[16], alt[32], epath[ESC_SIZE(PATH_MAX)];

		fmt_bytes(jint(p, "size"), size, sizeof(size));
		fmt_bytes(jint(p, "stored"), stored, sizeof(stored));
		fmt_bytes(jint(p, "resident"), res, sizeof(res));
		if (!path || !path[0]) { /* deleted while open */
			snprintf(alt, sizeof(alt), "ino:%llu", (unsigned long long)jint(p, "ino"));
			path = alt;
		}
		bool active = json_is_true(json_object_get(p, "active"));

		printf("%-44s %9s %9s %9s%s\n", esc_name(path, epath, sizeof(epath)), size, stored,
		       res, active ? "" : "  (did not fit at this mount)");
	}
	json_decref(j);
	return 0;
}

/* ---- scrub ---- */

/* One damaged block of the report: the file and block index, what, where. */
static void print_bad(json_t *b)
{
	const char *path = json_string_value(json_object_get(b, "path"));
	char alt[48], epath[ESC_SIZE(PATH_MAX)];

	if (!json_is_integer(json_object_get(b, "ino"))) {
		printf("block id %llu (mapped by no file): %s (%s slot %llu)\n",
		       (unsigned long long)jint(b, "block_id"),
		       json_string_value(json_object_get(b, "error")),
		       json_string_value(json_object_get(b, "tier")),
		       (unsigned long long)jint(b, "slot"));
		return;
	}
	if (!path) { /* no name: unlinked while open */
		snprintf(alt, sizeof(alt), "ino:%llu", (unsigned long long)jint(b, "ino"));
		path = alt;
	}
	printf("%s block %llu: %s (%s slot %llu)\n", esc_name(path, epath, sizeof(epath)),
	       (unsigned long long)jint(b, "index"), json_string_value(json_object_get(b, "error")),
	       json_string_value(json_object_get(b, "tier")), (unsigned long long)jint(b, "slot"));
}

static int cmd_scrub(int argc, char **argv, const struct tfs_args *a)
{
	struct tfs_mount m;
	json_t *j, *b;
	size_t i;
	int ret;

	(void)argv;
	ret = ctl_plain("scrub", "a scrub is running already", argc, a, &m);
	if (ret)
		return ret;
	j = tfs_read_json(&m, "scrub");
	if (!j)
		return EXIT_RUNTIME;
	if (a->json) {
		json_dumpf(j, stdout, JSON_OUT);
		putchar('\n');
	} else {
		json_array_foreach(json_object_get(j, "bad"), i, b) {
			print_bad(b);
		}
		if (!json_is_true(json_object_get(j, "listed_all")))
			printf("(more damaged blocks than the report lists: the daemon's log has "
			       "each)\n");
		printf("scrub: %llu blocks checked (%llu without a hash) in %.1f s, %llu damaged\n",
		       (unsigned long long)jint(j, "blocks"),
		       (unsigned long long)jint(j, "unverified"), jreal(j, "seconds"),
		       (unsigned long long)jint(j, "bad_blocks"));
	}
	ret = jint(j, "bad_blocks") ? EXIT_RUNTIME : 0;
	json_decref(j);
	return ret;
}

/* ---- fsck ---- */

static int cmd_fsck(int argc, char **argv, const struct tfs_args *a)
{
	const struct command *c = find_command("fsck");

	if (argc != 1)
		return bad_usage(c, argc ? "fsck takes one META_DIR" : "fsck needs a META_DIR");
	return fs_fsck(argv[0], a->repair, stdout, "tfsctl fsck");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"mount", required_argument, NULL, 'm'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	const struct command *c;
	struct tfs_args fl = {0};
	char progbuf[64];
	int ch, ret;

	opterr = 0;
	while ((ch = getopt_long(argc, argv, "+m:hV", opts, NULL)) != -1) {
		switch (ch) {
		case 'm':
			fl.mopt = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("tfsctl %s\n", TFS_VERSION);
			return 0;
		default:
			fprintf(stderr, "%s: unknown option or missing argument: %s\n", prog,
				argv[optind - 1]);
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "%s: no command given\n", prog);
		usage(stderr);
		return EXIT_USAGE;
	}
	c = find_command(argv[optind]);
	if (!c) {
		fprintf(stderr, "%s: unknown command '%s' (tfsctl --help lists them)\n", prog,
			argv[optind]);
		return EXIT_USAGE;
	}
	snprintf(progbuf, sizeof(progbuf), "tfsctl %s", c->name);
	prog = progbuf;
	argc -= optind;
	argv += optind;
	fl.cmd = c->name;
	ret = parse_flags(c, &argc, &argv, &fl);
	if (ret >= 0)
		return ret;
	return c->fn(argc, argv, &fl);
}
