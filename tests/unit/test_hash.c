/*
 * Unit test of dedup's key (tb_hash): the store hashes through libxxhash's
 * vector dispatcher where it has one, and the keys it writes to the dedup
 * index must stay what XXH3-128 gives, or blocks stored before would no
 * longer dedup. Compared with the library's plain entry point over every
 * length of each of XXH3's code paths, at every alignment, and with values
 * pinned here, from the empty input's in xxHash's specification on.
 */
#include "tb.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#define BIG (1u << 20)

static unsigned char buf[BIG + 64];

/* The pinned inputs: byte i of the pattern below, first len bytes. */
static const struct {
	size_t len;
	uint64_t low, high;
} pinned[] = {
	{0, 0x6001c324468d497fULL, 0x99aa06d3014798d8ULL},
	{1, 0xc44bdff4074eecdbULL, 0xa6cd5e9392000f6aULL},
	{3, 0xa1c4a8259b827291ULL, 0x95c705060a313bf8ULL},
	{16, 0xaafffcec5df2cb27ULL, 0x29be75b0bbbb5284ULL},
	{17, 0x878751509ecfdb8bULL, 0xdb7e8f77961e47fdULL},
	{128, 0xbbe087d879edcc78ULL, 0xba44fd018231af4cULL},
	{129, 0xb8075934107218e5ULL, 0x522c922743fd67f1ULL},
	{240, 0x407883ea5ef95b9aULL, 0x4f49ccc8526aa7adULL},
	{241, 0xbc424a2c480dd281ULL, 0x50b62ee1ee6455a7ULL},
	{4096, 0x84d9e7ce664c8217ULL, 0x0c263f4351254510ULL},
	{65536, 0x32152aa15c5ff65aULL, 0x463ae68f708ee101ULL},
	{BIG, 0xe2786b358eab4a67ULL, 0x490d2e4880066606ULL},
};

static void check_plain(const unsigned char *p, size_t len)
{
	uint8_t got[TB_HASH_LEN], want[TB_HASH_LEN];
	XXH128_hash_t h = XXH3_128bits(p, len);

	memcpy(want, &h.low64, 8);
	memcpy(want + 8, &h.high64, 8);
	tb_hash(p, len, got);
	if (memcmp(got, want, TB_HASH_LEN) != 0) {
		fprintf(stderr, "tb_hash differs from XXH3_128bits at length %zu, offset %zu\n",
			len, (size_t)(p - buf));
		exit(1);
	}
}

int main(void)
{
	for (uint32_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 2654435761u >> 13);

	for (size_t i = 0; i < sizeof(pinned) / sizeof(pinned[0]); i++) {
		uint8_t got[TB_HASH_LEN];
		uint64_t low, high;

		tb_hash(buf, pinned[i].len, got);
		memcpy(&low, got, 8);
		memcpy(&high, got + 8, 8);
		CHECK_EQ(low, pinned[i].low);
		CHECK_EQ(high, pinned[i].high);
	}
	/* Each of XXH3's paths (0-16, 17-128, 129-240, longer) and the stripe edges. */
	for (size_t len = 0; len <= 4096 + 64; len++)
		check_plain(buf, len);
	for (size_t off = 1; off < 64; off++) {
		check_plain(buf + off, 1000 + off);
		check_plain(buf + off, BIG - 64);
	}
	for (size_t len = BIG - 300; len <= BIG; len += 17)
		check_plain(buf, len);
	check_plain(buf, BIG);
	printf("tb_hash: the plain XXH3-128 at every length checked\n");
	return 0;
}
