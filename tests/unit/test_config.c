/* test_config: defaults, file, environment and command line, in that order
 * of precedence, and errors that say where they are. */
#include "src/config.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

static void write_file(const char *text)
{
	FILE *f;

	strcpy(path, "/tmp/acemq-test-config-XXXXXX");
	close(mkstemp(path));
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
}

static void clear_env(void)
{
	unsetenv("ACEMQ_PROXY_UPSTREAM");
	unsetenv("ACEMQ_PROXY_WORKERS");
	unsetenv("ACEMQ_PROXY_LISTEN");
	unsetenv("ACEMQ_PROXY_LOG_LEVEL");
}

static int load(struct config *cfg, char **argv, int argc, char *errbuf, size_t errlen)
{
	FILE *err = fmemopen(errbuf, errlen, "w");
	int n = config_load(cfg, argc, argv, err);

	fclose(err);
	return n;
}

START_TEST(defaults)
{
	struct config cfg;
	char *argv[] = {"acemq-proxy", NULL};
	char err[1024] = "";

	clear_env();
	ck_assert_int_eq(load(&cfg, argv, 1, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.v[CFG_UPSTREAM].list[0], "127.0.0.1:5672");
	ck_assert_int_eq(cfg.v[CFG_LISTEN].nlist, 1);
	ck_assert_str_eq(cfg.v[CFG_LISTEN].list[0], "127.0.0.1:5673");
	ck_assert_int_eq(config_num(&cfg, CFG_WORKERS), 0);
	config_free(&cfg);
}
END_TEST

START_TEST(precedence)
{
	struct config cfg;
	char err[1024] = "";

	clear_env();
	write_file("# example\nupstream = 10.0.0.1:5672\nworkers = 3\nlog_level = debug\n"
		   "listen = 127.0.0.1:6000\nlisten = [::1]:6001\n");
	{
		char *argv[] = {"acemq-proxy", "-c", path, NULL};

		ck_assert_int_eq(load(&cfg, argv, 3, err, sizeof(err)), 0);
		ck_assert_str_eq(cfg.v[CFG_UPSTREAM].list[0], "10.0.0.1:5672");
		ck_assert_int_eq(config_num(&cfg, CFG_WORKERS), 3);
		ck_assert_int_eq(cfg.v[CFG_LISTEN].nlist, 2);
		ck_assert_str_eq(cfg.v[CFG_LISTEN].list[1], "[::1]:6001");
		config_free(&cfg);
	}
	setenv("ACEMQ_PROXY_WORKERS", "5", 1);
	setenv("ACEMQ_PROXY_UPSTREAM", "broker:5672", 1);
	{
		char *argv[] = {"acemq-proxy", "-c", path, "--workers", "7", NULL};

		ck_assert_int_eq(load(&cfg, argv, 5, err, sizeof(err)), 0);
		ck_assert_int_eq(config_num(&cfg, CFG_WORKERS), 7);           /* cli */
		ck_assert_str_eq(cfg.v[CFG_UPSTREAM].list[0], "broker:5672"); /* env */
		ck_assert_int_eq(config_num(&cfg, CFG_LOG_LEVEL), 3);         /* file */
		ck_assert_str_eq(cfg.v[CFG_WORKERS].source, "command line");
		ck_assert_str_eq(cfg.v[CFG_UPSTREAM].source, "environment");
		config_free(&cfg);
	}
	{
		char *argv[] = {"acemq-proxy", "--listen",   "127.0.0.1:7000",
				"--listen",    "[::1]:7001", NULL};

		ck_assert_int_eq(load(&cfg, argv, 5, err, sizeof(err)), 0);
		ck_assert_int_eq(cfg.v[CFG_LISTEN].nlist, 2);
		ck_assert_str_eq(cfg.v[CFG_LISTEN].list[0], "127.0.0.1:7000");
		config_free(&cfg);
	}
	clear_env();
	unlink(path);
}
END_TEST

START_TEST(every_error_reported_with_where)
{
	struct config cfg;
	char err[4096] = "";

	clear_env();
	write_file("workers = many\nnope = 1\nupstream = nohost\nlisten = 127.0.0.1:99999\n");
	setenv("ACEMQ_PROXY_LOG_LEVEL", "loud", 1);
	{
		char *argv[] = {"acemq-proxy", "-c", path, "--buffer-limit", "12", NULL};

		ck_assert_int_eq(load(&cfg, argv, 5, err, sizeof(err)), 6);
	}
	ck_assert_ptr_nonnull(strstr(err, ":1: workers: 'many' is not a number"));
	ck_assert_ptr_nonnull(strstr(err, ":2: nope: unknown setting"));
	ck_assert_ptr_nonnull(strstr(err, ":3: upstream: 'nohost' is not HOST:PORT"));
	ck_assert_ptr_nonnull(strstr(err, ":4: listen:"));
	ck_assert_ptr_nonnull(strstr(err, "ACEMQ_PROXY_LOG_LEVEL: log_level: 'loud'"));
	ck_assert_ptr_nonnull(
	    strstr(err, "command line --buffer-limit: buffer_limit: 12 is out of range"));
	config_free(&cfg);
	clear_env();
	unlink(path);
}
END_TEST

START_TEST(addresses)
{
	char host[64];
	int port;

	ck_assert_int_eq(config_addr_split("127.0.0.1:5673", host, sizeof(host), &port), 0);
	ck_assert_str_eq(host, "127.0.0.1");
	ck_assert_int_eq(port, 5673);
	ck_assert_int_eq(config_addr_split("[::1]:5673", host, sizeof(host), &port), 0);
	ck_assert_str_eq(host, "::1");
	ck_assert_int_eq(config_addr_split("::1:5673", host, sizeof(host), &port), -1);
	ck_assert_int_eq(config_addr_split("host:", host, sizeof(host), &port), -1);
	ck_assert_int_eq(config_addr_split(":5672", host, sizeof(host), &port), -1);
	ck_assert_int_eq(config_addr_split("h:0", host, sizeof(host), &port), -1);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, defaults);
	tcase_add_test(tc, precedence);
	tcase_add_test(tc, every_error_reported_with_where);
	tcase_add_test(tc, addresses);
	return unit_run("config", tc, 0);
}
