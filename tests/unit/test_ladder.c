/* test_ladder: placeholder until the module's tests land. */
#include "tests/unit/unit.h"

#include <check.h>

START_TEST(test_placeholder)
{
	ck_assert_int_eq(1, 1);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("ladder");

	tcase_add_test(tc, test_placeholder);
	return unit_run("ladder", tc, 0);
}
