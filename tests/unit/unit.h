/* unit: the one runner every Check unit test's main uses. */
#ifndef ACEMQ_UNIT_H
#define ACEMQ_UNIT_H

#include <check.h>
#include <event2/buffer.h>
#include <stdlib.h>

/* Run one suite made of one test case; exit status for main. */
static inline int unit_run(const char *name, TCase *tc, int fork)
{
	Suite *s = suite_create(name);
	SRunner *sr;
	int failed;

	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	if (!fork)
		srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* What b holds, as a C string in dst (it must fit); b is freed. */
static inline const char *unit_text(struct evbuffer *b, char *dst, size_t cap)
{
	size_t n = evbuffer_get_length(b);

	ck_assert_uint_lt(n, cap);
	evbuffer_remove(b, dst, n);
	dst[n] = '\0';
	evbuffer_free(b);
	return dst;
}

#endif
