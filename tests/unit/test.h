/*
 * test.h - the few macros the unit tests share.
 *
 * A test is a plain program: exit 0 on pass, 1 on the first failed check
 * (naming the file, line and expression), 77 to skip.
 */
#ifndef TENSORFS_TEST_H
#define TENSORFS_TEST_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,   \
				#cond);                                                    \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

#define CHECK_EQ(a, b)                                                                     \
	do {                                                                               \
		long long va_ = (long long)(a), vb_ = (long long)(b);                      \
		if (va_ != vb_) {                                                          \
			fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n",        \
				__FILE__, __LINE__, #a, va_, #b, vb_);                     \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

#endif
