/* test_limits: the per-vhost connection counts: exact, and an entry gone
 * with its vhost's last connection, so made-up names do not pile up. */
#include "src/limits.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <stdio.h>

START_TEST(per_vhost_limit_and_entries_freed)
{
	char name[64];
	int i;

	limits_init(2, 0);
	ck_assert_int_eq(limits_vhost_enter("a"), 0);
	ck_assert_int_eq(limits_vhost_enter("a"), 0);
	ck_assert_int_eq(limits_vhost_enter("a"), -1);
	ck_assert_int_eq(limits_vhost_enter("b"), 0);
	ck_assert_int_eq(limits_vhosts_tracked(), 2);
	limits_vhost_leave("a");
	ck_assert_int_eq(limits_vhost_enter("a"), 0);
	limits_vhost_leave("a");
	limits_vhost_leave("a");
	limits_vhost_leave("b");
	ck_assert_int_eq(limits_vhosts_tracked(), 0);
	/* A leave without an enter changes nothing. */
	limits_vhost_leave("never");
	ck_assert_int_eq(limits_vhosts_tracked(), 0);
	/* 5000 names a client made up, one after the other: none stays. */
	for (i = 0; i < 5000; i++) {
		snprintf(name, sizeof(name), "bogus-%d", i);
		ck_assert_int_eq(limits_vhost_enter(name), 0);
		limits_vhost_leave(name);
	}
	ck_assert_int_eq(limits_vhosts_tracked(), 0);
	/* 5000 at once (the table grows), each still limited, then none. */
	for (i = 0; i < 5000; i++) {
		snprintf(name, sizeof(name), "live-%d", i);
		ck_assert_int_eq(limits_vhost_enter(name), 0);
		ck_assert_int_eq(limits_vhost_enter(name), 0);
	}
	ck_assert_int_eq(limits_vhosts_tracked(), 5000);
	for (i = 0; i < 5000; i++) {
		snprintf(name, sizeof(name), "live-%d", i);
		ck_assert_int_eq(limits_vhost_enter(name), -1);
		limits_vhost_leave(name);
		limits_vhost_leave(name);
	}
	ck_assert_int_eq(limits_vhosts_tracked(), 0);
}
END_TEST

START_TEST(no_limit_tracks_nothing)
{
	limits_init(0, 0);
	ck_assert_int_eq(limits_vhost_enter("a"), 0);
	ck_assert_int_eq(limits_vhosts_tracked(), 0);
	limits_vhost_leave("a");
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, per_vhost_limit_and_entries_freed);
	tcase_add_test(tc, no_limit_tracks_nothing);
	return unit_run("limits", tc, 0);
}
