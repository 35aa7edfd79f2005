/*
 * format.c - numbers and names for people, and reading numbers out of the
 * stats.
 *
 * Sizes use binary units (K = 1024) as df -h does; rates use decimal ones
 * (GB/s = 10^9 bytes a second) as device data sheets do. Names are
 * whatever bytes their users chose, and are printed escaped (escape.h):
 * a newline in a file name must not forge a row, nor an escape sequence
 * act on the terminal.
 */
#include "tfsctl.h"
#include "escape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fmt_bytes(uint64_t v, char *buf, size_t len)
{
	static const char units[] = "KMGTPE";
	double d = (double)v;
	int u = -1;

	if (v < 1024) {
		snprintf(buf, len, "%llu", (unsigned long long)v);
		return;
	}
	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f%c", d, units[u]);
}

void fmt_rate(double bps, char *buf, size_t len)
{
	if (bps >= 1e9)
		snprintf(buf, len, "%.2f GB/s", bps / 1e9);
	else if (bps >= 1e6)
		snprintf(buf, len, "%.1f MB/s", bps / 1e6);
	else if (bps >= 1e3)
		snprintf(buf, len, "%.1f kB/s", bps / 1e3);
	else
		snprintf(buf, len, "%.0f B/s", bps < 0 ? 0 : bps);
}

void fmt_pct(double frac, char *buf, size_t len)
{
	snprintf(buf, len, "%.1f%%", frac * 100.0);
}

uint64_t jint(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	if (json_is_integer(v))
		return json_integer_value(v) < 0 ? 0 : (uint64_t)json_integer_value(v);
	if (json_is_real(v))
		return json_real_value(v) < 0 ? 0 : (uint64_t)json_real_value(v);
	return 0;
}

double jreal(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	return json_is_number(v) ? json_number_value(v) : 0.0;
}

void print_name(const char *before, const char *name)
{
	size_t n = name ? strlen(name) : 0;
	char *buf = malloc(ESC_SIZE(n));

	if (!buf) {
		printf("%s?", before);
		return;
	}
	esc_bytes(name ? name : "", n, buf, ESC_SIZE(n));
	printf("%s%s", before, buf);
	free(buf);
}
