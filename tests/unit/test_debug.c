/* test_debug: ACEMQ_ASSERT aborts with file, line and expression in the
 * builds that define ACEMQ_DEBUG, and evaluates nothing in the others. */
#include "src/debug.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int debug_one = 1;

#ifdef ACEMQ_DEBUG

START_TEST(false_assertion_aborts)
{
	ACEMQ_ASSERT(debug_one == 2);
}
END_TEST

START_TEST(true_assertion_passes)
{
	ACEMQ_ASSERT(debug_one == 1);
	ck_assert_int_eq(debug_one, 1);
}
END_TEST

/* The assertion the next test fires, three lines below its line number. */
enum { DEBUG_FIRE_LINE = __LINE__ + 3 };
static void debug_fire(void)
{
	ACEMQ_ASSERT(debug_one + 1 == 3);
}

/* The child's stderr names this file, the line and the expression. */
START_TEST(failure_is_reported)
{
	char text[512];
	size_t got = 0;
	ssize_t n;
	int fds[2], status;
	pid_t pid;

	ck_assert_int_eq(pipe(fds), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(fds[1], 2);
		debug_fire();
		_exit(0);
	}
	close(fds[1]);
	while (got < sizeof(text) - 1 &&
	       (n = read(fds[0], text + got, sizeof(text) - 1 - got)) > 0)
		got += (size_t)n;
	text[got] = 0;
	close(fds[0]);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFSIGNALED(status));
	ck_assert_int_eq(WTERMSIG(status), SIGABRT);
	{
		char want[128];

		snprintf(want, sizeof(want),
			 "test_debug.c:%d: assertion failed: debug_one + 1 == 3\n",
			 DEBUG_FIRE_LINE);
		ck_assert_msg(strstr(text, want) != NULL, "stderr was: %s", text);
	}
}
END_TEST

#else

/* Off: the condition is compiled but never evaluated. */
START_TEST(off_evaluates_nothing)
{
	int n = 0;

	ACEMQ_ASSERT(++n == 5);
	ACEMQ_ASSERT(debug_one == 2);
	ck_assert_int_eq(n, 0);
	ck_assert_int_eq(debug_one, 1);
}
END_TEST

#endif

int main(void)
{
	TCase *tc = tcase_create("core");

#ifdef ACEMQ_DEBUG
	tcase_add_test_raise_signal(tc, false_assertion_aborts, SIGABRT);
	tcase_add_test(tc, true_assertion_passes);
	tcase_add_test(tc, failure_is_reported);
#else
	tcase_add_test(tc, off_evaluates_nothing);
#endif
	return unit_run("debug", tc, 1);
}
