/* test_log: log lines escaped so that no string a client sent can forge a
 * line or reach a terminal raw, and readable text left as it is. */
#include "src/log.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char out[4096];

static const char *esc(const char *in, size_t len)
{
	log_escape(out, sizeof(out), in, len);
	return out;
}

#define ESC(s) esc(s, sizeof(s) - 1)

START_TEST(printable_and_utf8_pass)
{
	ck_assert_str_eq(ESC("guest user=a vhost=/ {x}"), "guest user=a vhost=/ {x}");
	ck_assert_str_eq(ESC("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x90\x87"),
			 "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x90\x87");
	/* The largest code point, U+00A0 and U+FFFD pass too. */
	ck_assert_str_eq(ESC("\xf4\x8f\xbf\xbf\xc2\xa0\xef\xbf\xbd"),
			 "\xf4\x8f\xbf\xbf\xc2\xa0\xef\xbf\xbd");
}
END_TEST

START_TEST(controls_escaped)
{
	ck_assert_str_eq(ESC("a\nb"), "a\\x0ab");
	ck_assert_str_eq(ESC("a\r\n2024-01-01T00:00:00.000Z error forged"),
			 "a\\x0d\\x0a2024-01-01T00:00:00.000Z error forged");
	ck_assert_str_eq(ESC("\x1b[2J\x1b]0;pwned\x07"), "\\x1b[2J\\x1b]0;pwned\\x07");
	ck_assert_str_eq(ESC("\t\x7f"), "\\x09\\x7f");
	ck_assert_str_eq(esc("a\0b", 3), "a\\x00b");
	/* C1 controls (CSI, NEL) and the Unicode line and paragraph separators. */
	ck_assert_str_eq(ESC("\xc2\x9b"
			     "2J\xc2\x85"),
			 "\\xc2\\x9b2J\\xc2\\x85");
	ck_assert_str_eq(ESC("x\xe2\x80\xa8y\xe2\x80\xa9"), "x\\xe2\\x80\\xa8y\\xe2\\x80\\xa9");
	/* A backslash doubles, so that an escape is never ambiguous. */
	ck_assert_str_eq(ESC("a\\x0a"), "a\\\\x0a");
}
END_TEST

START_TEST(invalid_utf8_escaped)
{
	ck_assert_str_eq(ESC("\xff\xfe"), "\\xff\\xfe");
	ck_assert_str_eq(ESC("\xc0\xaf"), "\\xc0\\xaf");                   /* overlong */
	ck_assert_str_eq(ESC("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");          /* overlong */
	ck_assert_str_eq(ESC("\xed\xa0\x80"), "\\xed\\xa0\\x80");          /* a surrogate */
	ck_assert_str_eq(ESC("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80"); /* > U+10FFFF */
	ck_assert_str_eq(ESC("a\xe6\x97"), "a\\xe6\\x97");                 /* cut short */
	ck_assert_str_eq(ESC("\x80z"), "\\x80z"); /* a lone continuation */
	ck_assert_str_eq(ESC("\xc3"
			     "a"),
			 "\\xc3a");
}
END_TEST

/* Out of room: what does not fit whole is left out, never half an escape
 * or half a character, and the text ends in a NUL. */
START_TEST(bounded)
{
	char small[8];

	ck_assert_uint_eq(log_escape(small, 5, "\n\n", 2), 4);
	ck_assert_str_eq(small, "\\x0a");
	ck_assert_uint_eq(log_escape(small, 4, "\n", 1), 0);
	ck_assert_str_eq(small, "");
	ck_assert_uint_eq(log_escape(small, 3, "a\xc3\xa9", 3), 1);
	ck_assert_str_eq(small, "a");
	ck_assert_uint_eq(log_escape(small, 8, "abcdefghij", 10), 7);
	ck_assert_str_eq(small, "abcdefg");
	ck_assert_uint_eq(log_escape(small, 0, "a", 1), 0);
}
END_TEST

/* What log_msg writes for arguments a client chose: one line, no raw
 * control byte, whatever the message holds. */
static char *logged(void (*emit)(void))
{
	FILE *f = tmpfile();
	int saved = dup(2);
	static char text[16384];
	size_t n;

	ck_assert_ptr_nonnull(f);
	fflush(stderr);
	ck_assert_int_ge(dup2(fileno(f), 2), 0);
	emit();
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	return text;
}

static void emit_forged(void)
{
	log_msg(LOG_WARNING, "c=1 client=127.0.0.1:1 vhost=%s user=%s refused", "/",
		"x\n2024-01-01T00:00:00.000Z info c=2 user=admin open\x1b[2J");
}

static void emit_long(void)
{
	char big[3000];

	memset(big, '\n', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	log_msg(LOG_ERROR, "%s", big);
}

START_TEST(log_lines_are_whole)
{
	const char *t = logged(emit_forged);

	ck_assert_ptr_eq(strchr(t, '\n'), t + strlen(t) - 1);
	ck_assert_ptr_null(strchr(t, '\x1b'));
	ck_assert_ptr_nonnull(strstr(
	    t, " warning c=1 client=127.0.0.1:1 vhost=/ user=x\\x0a2024-01-01T00:00:00.000Z "
	       "info c=2 user=admin open\\x1b[2J refused\n"));
	/* A message of newlines: still one line, within one pipe write. */
	t = logged(emit_long);
	ck_assert_ptr_eq(strchr(t, '\n'), t + strlen(t) - 1);
	ck_assert_uint_le(strlen(t), 4096);
	ck_assert_ptr_nonnull(strstr(t, " error \\x0a\\x0a"));
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, printable_and_utf8_pass);
	tcase_add_test(tc, controls_escaped);
	tcase_add_test(tc, invalid_utf8_escaped);
	tcase_add_test(tc, bounded);
	tcase_add_test(tc, log_lines_are_whole);
	return unit_run("log", tc, 0);
}
