/* test_claim_check: the claim-check framing shared with the AceMQ
 * libraries, read from a body's bytes, and keys shown safely in logs. */
#include "tests/unit/unit.h"

#include "src/patterns/claim_check.h"

#include <check.h>
#include <string.h>

#define B(s) (const uint8_t *)(s), sizeof(s) - 1

START_TEST(test_forms)
{
	static uint8_t long_ref[3 + 256];

	ck_assert_int_eq(claim_check_form(B("")), CLAIM_CHECK_PLAIN);
	ck_assert_int_eq(claim_check_form(B("\xac\x01")), CLAIM_CHECK_PLAIN);
	ck_assert_int_eq(claim_check_form(B("hello")), CLAIM_CHECK_PLAIN);
	ck_assert_int_eq(claim_check_form(B("\xac\x02\x01key")), CLAIM_CHECK_PLAIN);
	ck_assert_int_eq(claim_check_form(B("\xac\x01\x02key")), CLAIM_CHECK_PLAIN);
	ck_assert_int_eq(claim_check_form(B("\xac\x01\x00")), CLAIM_CHECK_INLINED);
	ck_assert_int_eq(claim_check_form(B("\xac\x01\x00payload")), CLAIM_CHECK_INLINED);
	ck_assert_int_eq(claim_check_form(B("\xac\x01\x01")), CLAIM_CHECK_REFERENCE);
	ck_assert_int_eq(claim_check_form(B("\xac\x01\x01"
					    "0123456789abcdef0123456789abcdef")),
			 CLAIM_CHECK_REFERENCE);
	ck_assert_int_eq(claim_check_form(B("\xac\x01\x01../../etc/passwd")),
			 CLAIM_CHECK_REFERENCE);
	/* Longer than any key: an ordinary body that happens to start so. */
	memcpy(long_ref, "\xac\x01\x01", 3);
	memset(long_ref + 3, 'a', 256);
	ck_assert_int_eq(claim_check_form(long_ref, sizeof(long_ref)), CLAIM_CHECK_PLAIN);
	ck_assert_int_eq(claim_check_form(long_ref, sizeof(long_ref) - 1),
			 CLAIM_CHECK_REFERENCE);
}
END_TEST

START_TEST(test_printable)
{
	char out[16];

	claim_check_printable(out, sizeof(out), B("ab\ncd\x01\xff"));
	ck_assert_str_eq(out, "ab?cd??");
	claim_check_printable(out, 4, B("abcdef"));
	ck_assert_str_eq(out, "abc");
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("claim_check");

	tcase_add_test(tc, test_forms);
	tcase_add_test(tc, test_printable);
	return unit_run("claim_check", tc, 1);
}
