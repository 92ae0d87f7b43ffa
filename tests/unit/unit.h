/* unit: the one runner every Check unit test's main uses. */
#ifndef ACEMQ_UNIT_H
#define ACEMQ_UNIT_H

#include <check.h>
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

#endif
