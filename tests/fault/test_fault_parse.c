/*
 * test_fault_parse.c - the rule syntax of fault injection (tiers/fault.h):
 * what parses, how many rules it makes, and what is refused.
 */
#include "fault.h"
#include "test.h"

#include <errno.h>
#include <string.h>

static int parse(const char *spec)
{
	char err[256] = "";
	int n = fault_parse(spec, err, sizeof(err));

	if (n < 0 && !err[0]) {
		fprintf(stderr, "'%s' refused without a reason\n", spec);
		exit(1);
	}
	return n;
}

int main(void)
{
	/* one rule per ';' or line; comments and blank rules are nothing */
	CHECK_EQ(parse(""), 0);
	CHECK_EQ(parse("# nothing\n\n ; ;"), 0);
	CHECK_EQ(parse("err=EIO"), 1);
	CHECK_EQ(parse("dev=nvme0,op=write,err=EIO,rate=0.1,seed=7"), 1);
	CHECK_EQ(parse("dev=s3, op = read , err = ENOSPC ,rate=1;err=delay,ms=5"), 2);
	CHECK_EQ(parse("err=503 # s3 only\nop=sync,err=ETIMEDOUT,after=3,count=2\r\n"), 2);
	CHECK_EQ(parse("dev=*,op=any,err=eio,rate=0"), 1);
	CHECK_EQ(parse("dev=flusher,op=flusher,err=delay,ms=20,count=500"), 1);
	CHECK_EQ(parse("dev=prefetch,op=prefetch,err=delay,ms=100"), 1);

	/* refused: every key and value is checked */
	CHECK_EQ(parse("op=write"), -EINVAL);	      /* no err= */
	CHECK_EQ(parse("err=EPERM"), -EINVAL);	      /* not an injectable errno */
	CHECK_EQ(parse("err=EIO,rate=1.5"), -EINVAL); /* not a probability */
	CHECK_EQ(parse("err=EIO,rate=-0.1"), -EINVAL);
	CHECK_EQ(parse("err=EIO,rate=nan"), -EINVAL);
	CHECK_EQ(parse("err=EIO,rate="), -EINVAL);
	CHECK_EQ(parse("err=EIO,op=trim"), -EINVAL);
	CHECK_EQ(parse("err=EIO,count=-1"), -EINVAL);
	CHECK_EQ(parse("err=EIO,after=1x"), -EINVAL);
	CHECK_EQ(parse("err=delay,ms=60001"), -EINVAL);
	CHECK_EQ(parse("err=EIO,dev=a-device-name-too-long"), -EINVAL);
	CHECK_EQ(parse("err=EIO,colour=red"), -EINVAL); /* unknown key */
	CHECK_EQ(parse("err=EIO,rate"), -EINVAL);	/* not key=value */
	CHECK_EQ(parse("err=EIO;rate=0.5"), -EINVAL);	/* the second rule has no err= */

	/* at most 16 rules */
	char many[1024] = "";
	for (int i = 0; i < 16; i++)
		strcat(many, "err=EIO;");
	CHECK_EQ(parse(many), 16);
	strcat(many, "err=EIO");
	CHECK_EQ(parse(many), -EINVAL);
	return 0;
}
