/* Unit test of the slab slot allocator: fill, free, reuse, marks, bounds. */
#include "alloc.h"
#include "test.h"

#include <errno.h>

int main(void)
{
	struct slot_alloc a;
	const uint64_t n = 200; /* not a multiple of 64: the last word is partial */

	CHECK_EQ(slot_alloc_init(&a, n), 0);
	CHECK_EQ(slot_alloc_high(&a), 0);
	for (uint64_t i = 0; i < n; i++)
		CHECK_EQ(slot_alloc_get(&a), (int64_t)i); /* first fit, in order */
	CHECK_EQ(slot_alloc_get(&a), -ENOSPC);
	CHECK_EQ(a.used, n);
	CHECK_EQ(slot_alloc_high(&a), n);

	CHECK_EQ(slot_alloc_put(&a, 70), 0);
	CHECK_EQ(slot_alloc_put(&a, 70), -EINVAL); /* double free is caught */
	CHECK_EQ(slot_alloc_put(&a, 5), 0);
	CHECK_EQ(slot_alloc_get(&a), 5); /* the hint moved back to the lowest */
	CHECK_EQ(slot_alloc_get(&a), 70);
	CHECK_EQ(slot_alloc_get(&a), -ENOSPC);
	CHECK_EQ(slot_alloc_put(&a, n), -EINVAL);
	CHECK_EQ(slot_alloc_put(&a, n - 1), 0);
	CHECK_EQ(slot_alloc_high(&a), n - 1);
	slot_alloc_free_all(&a);

	/* Rebuild from marks, as at mount: marked slots are skipped. */
	CHECK_EQ(slot_alloc_init(&a, 130), 0);
	CHECK_EQ(slot_alloc_mark(&a, 0), 0);
	CHECK_EQ(slot_alloc_mark(&a, 2), 0);
	CHECK_EQ(slot_alloc_mark(&a, 129), 0);
	CHECK_EQ(slot_alloc_mark(&a, 2), -EEXIST);
	CHECK_EQ(slot_alloc_mark(&a, 130), -ERANGE);
	CHECK_EQ(slot_alloc_get(&a), 1);
	CHECK_EQ(slot_alloc_get(&a), 3);
	CHECK_EQ(a.used, 5);
	CHECK_EQ(slot_alloc_high(&a), 130);
	slot_alloc_free_all(&a);

	/* An empty allocator refuses. */
	CHECK_EQ(slot_alloc_init(&a, 0), 0);
	CHECK_EQ(slot_alloc_get(&a), -ENOSPC);
	slot_alloc_free_all(&a);
	return 0;
}
