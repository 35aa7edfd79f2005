/*
 * escape.c - names made safe to print (see escape.h for what is escaped).
 *
 * The input is read as UTF-8, one character at a time: a valid sequence of
 * a printable character is copied whole; a control, a bidirectional
 * override or a line separator is written as the \xHH of each of its bytes;
 * a byte that starts no valid sequence (a lone continuation, an overlong
 * form, a surrogate, a cut sequence) is written as \xHH and the next byte
 * read afresh. Output that does not fit is cut between characters, never
 * inside an escape.
 */
#include "escape.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s (n bytes left) and its code point; 0 if none. */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
	size_t len;
	uint32_t c, min;

	if (s[0] < 0x80) {
		*cp = s[0];
		return 1;
	}
	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		len = 2, c = s[0] & 0x1f, min = 0x80;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		len = 3, c = s[0] & 0x0f, min = 0x800;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		len = 4, c = s[0] & 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (s[i] & 0x3f);
	}
	if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return len;
}

/* Characters a terminal or a text viewer acts on rather than shows. */
static bool acts(uint32_t cp)
{
	return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f) || cp == 0x061c ||
	       cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) ||
	       (cp >= 0x2066 && cp <= 0x2069);
}

size_t esc_bytes(const char *s, size_t n, char *buf, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t o = 0, i = 0;

	if (len == 0)
		return 0;
	while (i < n) {
		uint32_t cp = 0;
		size_t k = utf8_next(u + i, n - i, &cp);
		bool hex = k == 0 || acts(cp);
		size_t take = k ? k : 1;
		bool backslash = !hex && u[i] == '\\';
		size_t need = hex ? 4 * take : backslash ? 2 : take;

		if (o + need >= len)
			break;
		if (hex) {
			for (size_t j = 0; j < take; j++, o += 4)
				snprintf(buf + o, 5, "\\x%02x", u[i + j]);
		} else if (backslash) {
			buf[o++] = '\\';
			buf[o++] = '\\';
		} else {
			memcpy(buf + o, u + i, take);
			o += take;
		}
		i += take;
	}
	buf[o] = 0;
	return o;
}

const char *esc_name(const char *s, char *buf, size_t len)
{
	if (!s)
		s = "";
	esc_bytes(s, strlen(s), buf, len);
	return buf;
}
