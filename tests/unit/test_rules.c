/* test_rules: loading rules directories, every refusal with its file, key
 * and reason, and compiled topic matching. */
#include "src/rules.h"
#include "src/topic.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];
static char errbuf[8192];

static void fresh_dir(void)
{
	char cmd[128];

	if (dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		ck_assert_int_eq(system(cmd), 0);
	}
	strcpy(dir, "/tmp/acemq-rules-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void put(const char *name, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
}

static struct rules *load(int *nerr)
{
	FILE *err = fmemopen(errbuf, sizeof(errbuf), "w");
	struct rules *r;

	memset(errbuf, 0, sizeof(errbuf));
	r = rules_load(dir, err, nerr);
	fclose(err);
	return r;
}

/* One bad file: refused, and the message names file, key and reason. */
static void refused(const char *text, const char *key, const char *why)
{
	struct rules *r;
	char want[512];
	int n;

	fresh_dir();
	put("v.json", text);
	r = load(&n);
	ck_assert_msg(r == NULL, "accepted: %s", text);
	ck_assert_int_ge(n, 1);
	snprintf(want, sizeof(want), "%s/v.json: %s: %s", dir, key, why);
	ck_assert_msg(strstr(errbuf, want) != NULL, "want '%s' in '%s'", want, errbuf);
}

static const char *design_example =
    "{ \"vhost\": \"orders\", \"reply_to\": { \"enabled\": true },"
    "  \"claim_check\": { \"match\": [ { \"exchange\": \"documents\", \"routing_key\": "
    "\"document.#\" } ],"
    "     \"threshold\": 65536, \"store\": { \"type\": \"lmdb\" }, \"retention_s\": 2592000,"
    "     \"on_missing\": \"dead-letter\" },"
    "  \"schedule\": { \"match\": [ { \"exchange\": \"billing\" } ], \"header\": \"x-delay\", "
    "\"engine\": true },"
    "  \"idempotency\": [ { \"queue\": \"orders.new\", \"key\": \"message-id\","
    "     \"lease_s\": 30, \"retention_s\": 21600, \"in_progress_delay_s\": 5 } ] }";

START_TEST(design_example_loads)
{
	const struct rules_vhost *v;
	struct rules *r;
	int n;

	fresh_dir();
	put("orders.json", design_example);
	put("README.txt", "not a rules file");
	put("other.json", "{\"vhost\": \"/\"}");
	r = load(&n);
	ck_assert_msg(r != NULL, "%s", errbuf);
	ck_assert_int_eq(n, 0);
	ck_assert_int_eq(r->n, 2);
	v = rules_vhost(r, "orders");
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(v->reply_to, 1);
	ck_assert_int_eq(v->claim_check.enabled, 1);
	ck_assert_int_eq(v->claim_check.threshold, 65536);
	ck_assert_int_eq(v->claim_check.on_missing, RULES_MISSING_DEAD_LETTER);
	ck_assert_int_eq(v->schedule.engine, 1);
	ck_assert_str_eq(v->schedule.header, "x-delay");
	ck_assert_int_eq(v->nidempotency, 1);
	ck_assert_str_eq(v->idempotency[0].queue, "orders.new");
	ck_assert_int_eq(v->idempotency[0].key, RULES_KEY_MESSAGE_ID);
	ck_assert_int_eq(v->idempotency[0].prefetch_ahead, -1); /* surplus_auto */
	ck_assert(rules_matches(&v->claim_check.match, "documents", 9, "document.pdf.big", 16));
	ck_assert(!rules_matches(&v->claim_check.match, "documents", 9, "invoice.pdf", 11));
	ck_assert(!rules_matches(&v->claim_check.match, "other", 5, "document.x", 10));
	ck_assert(rules_matches(&v->schedule.match, "billing", 7, "anything.at.all", 15));
	v = rules_vhost(r, "/");
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(v->reply_to, 0);
	ck_assert_int_eq(v->claim_check.enabled, 0);
	ck_assert_ptr_null(rules_vhost(r, "nope"));
	rules_unref(r);
}
END_TEST

START_TEST(refusals)
{
	refused("{ \"vhost\": ", "(file)", "not valid JSON");
	refused("[1, 2]", "(file)", "must be a JSON object");
	refused("{}", "vhost", "is required");
	refused("{\"vhost\": 3}", "vhost", "must be a string");
	refused("{\"vhost\": \"a\", \"replyto\": {}}", "replyto", "unknown key");
	refused("{\"vhost\": \"a\", \"reply_to\": {\"enabled\": \"yes\"}}", "reply_to.enabled",
		"must be true or false");
	refused("{\"vhost\": \"a\", \"reply_to\": {\"on\": true}}", "reply_to.on",
		"unknown key");
	refused("{\"vhost\": \"a\", \"reply_to\": true}", "reply_to", "must be an object");
	refused("{\"vhost\": \"a\", \"claim_check\": {}}", "claim_check.match", "is required");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": {}}}", "claim_check.match",
		"must be a list");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [{\"exchange\": 1}]}}",
		"claim_check.match[0].exchange", "must be a string");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [{\"queue\": \"q\"}]}}",
		"claim_check.match[0].queue", "unknown key");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"threshold\": -1}}",
		"claim_check.threshold", "-1 is out of range");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"threshold\": 1.5}}",
		"claim_check.threshold", "must be a whole number");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"threshold\": \"big\"}}",
		"claim_check.threshold", "must be a number");
	refused(
	    "{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"on_missing\": \"drop\"}}",
	    "claim_check.on_missing", "'drop' is not dead-letter or pass");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"store\": {\"type\": "
		"\"gcs\"}}}",
		"claim_check.store.type", "'gcs' is not lmdb, filesystem or s3");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"store\": {\"type\": "
		"\"s3\"}}}",
		"claim_check.store.bucket", "is required");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"store\": {\"type\": "
		"\"s3\", \"bucket\": \"Not_A_Bucket\"}}}",
		"claim_check.store.bucket", "'Not_A_Bucket' is not a bucket name");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"store\": {\"type\": "
		"\"lmdb\", \"bucket\": \"claims\"}}}",
		"claim_check.store", "bucket and prefix are only for type s3");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"store\": {\"type\": "
		"\"filesystem\"}}}",
		"claim_check.store.path", "is required");
	refused("{\"vhost\": \"a\", \"claim_check\": {\"match\": [], \"store\": {\"type\": "
		"\"filesystem\", \"path\": \"rel\"}}}",
		"claim_check.store.path", "must be an absolute path");
	refused("{\"vhost\": \"a\", \"schedule\": {\"match\": [], \"header\": \"\"}}",
		"schedule.header", "must not be empty");
	refused("{\"vhost\": \"a\", \"schedule\": {\"match\": [], \"engine\": 1}}",
		"schedule.engine", "must be true or false");
	refused("{\"vhost\": \"a\", \"idempotency\": [{\"queue\": \"q\", "
		"\"prefetch_ahead\": 1001}]}",
		"idempotency[0].prefetch_ahead", "1001 is out of range");
	refused("{\"vhost\": \"a\", \"idempotency\": [{\"queue\": \"q\", "
		"\"prefetch_ahead\": -1}]}",
		"idempotency[0].prefetch_ahead", "-1 is out of range");
	refused("{\"vhost\": \"a\", \"dedup_publish\": true}", "dedup_publish",
		"must be an object");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {}}", "dedup_publish.match",
		"is required");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"ttl\": 5}}",
		"dedup_publish.ttl", "unknown key");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [{\"exchange\": \"x\", "
		"\"queue\": \"q\"}]}}",
		"dedup_publish.match[0].queue", "unknown key");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"window_s\": 0}}",
		"dedup_publish.window_s", "0 is out of range 1..31536000");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"window_s\": "
		"31536001}}",
		"dedup_publish.window_s", "31536001 is out of range");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"window_s\": \"1h\"}}",
		"dedup_publish.window_s", "must be a number");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"header\": \"\"}}",
		"dedup_publish.header", "must not be empty");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"header\": 7}}",
		"dedup_publish.header", "must be a string");
	{
		char text[600], name[300];

		memset(name, 'h', 256);
		name[256] = 0;
		snprintf(text, sizeof(text),
			 "{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"header\": "
			 "\"%s\"}}",
			 name);
		refused(text, "dedup_publish.header", "is longer than 255 bytes");
	}
	refused("{\"vhost\": \"a\", \"idempotency\": {}}", "idempotency", "must be a list");
	refused("{\"vhost\": \"a\", \"idempotency\": [{}]}", "idempotency[0].queue",
		"is required");
	refused("{\"vhost\": \"a\", \"idempotency\": [{\"queue\": \"q\", \"key\": \"body\"}]}",
		"idempotency[0].key", "'body' is not message-id, header:NAME or json:FIELD");
	refused("{\"vhost\": \"a\", \"idempotency\": [{\"queue\": \"q\", \"lease_s\": 0}]}",
		"idempotency[0].lease_s", "0 is out of range");
}
END_TEST

START_TEST(dedup_publish_keys)
{
	const struct rules_vhost *v;
	struct rules *r;
	int n;

	fresh_dir();
	put("d.json", "{\"vhost\": \"d\", \"dedup_publish\": {\"match\": ["
		      "{\"exchange\": \"orders\"}, {\"exchange\": \"*\", \"routing_key\": "
		      "\"dedup.#\"}]}}");
	put("e.json", "{\"vhost\": \"e\", \"dedup_publish\": {\"match\": [], "
		      "\"header\": \"x-request-id\", \"window_s\": 31536000}}");
	r = load(&n);
	ck_assert_msg(r != NULL, "%s", errbuf);
	v = rules_vhost(r, "d");
	ck_assert_int_eq(v->dedup_publish.enabled, 1);
	ck_assert_str_eq(v->dedup_publish.header, "x-deduplication-header");
	ck_assert_int_eq(v->dedup_publish.window_s, 3600);
	ck_assert(rules_matches(&v->dedup_publish.match, "orders", 6, "any", 3));
	ck_assert(rules_matches(&v->dedup_publish.match, "x", 1, "dedup.a.b", 9));
	ck_assert(!rules_matches(&v->dedup_publish.match, "x", 1, "other", 5));
	ck_assert_int_eq(v->claim_check.enabled, 0);
	v = rules_vhost(r, "e");
	ck_assert_str_eq(v->dedup_publish.header, "x-request-id");
	ck_assert_int_eq(v->dedup_publish.window_s, 31536000);
	ck_assert(!rules_matches(&v->dedup_publish.match, "orders", 6, "any", 3));
	ck_assert_int_eq(rules_vhost(r, "d")->schedule.enabled, 0);
	rules_unref(r);
	/* Without the key the pattern is off. */
	fresh_dir();
	put("o.json", "{\"vhost\": \"o\"}");
	r = load(&n);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(rules_vhost(r, "o")->dedup_publish.enabled, 0);
	rules_unref(r);
}
END_TEST

START_TEST(s3_store)
{
	const struct rules_vhost *v;
	struct rules *r;
	int n;

	fresh_dir();
	put("s.json", "{\"vhost\": \"s\", \"claim_check\": {\"match\": [], \"store\": "
		      "{\"type\": \"s3\", \"bucket\": \"acemq-claims\", \"prefix\": "
		      "\"claims/\"}}}");
	put("t.json", "{\"vhost\": \"t\", \"claim_check\": {\"match\": [], \"store\": "
		      "{\"type\": \"s3\", \"bucket\": \"b.c-d\"}}}");
	r = load(&n);
	ck_assert_msg(r != NULL, "%s", errbuf);
	v = rules_vhost(r, "s");
	ck_assert_int_eq(v->claim_check.store, RULES_STORE_S3);
	ck_assert_str_eq(v->claim_check.store_bucket, "acemq-claims");
	ck_assert_str_eq(v->claim_check.store_prefix, "claims/");
	ck_assert_str_eq(rules_store_name(v->claim_check.store), "s3");
	v = rules_vhost(r, "t");
	ck_assert_str_eq(v->claim_check.store_prefix, "");
	rules_unref(r);
}
END_TEST

/* "store": {"type": "postgresql"} for idempotency and dedup_publish:
 * only with postgres_url set; lmdb by default. */
START_TEST(keys_store)
{
	static const char *const both =
	    "{\"vhost\": \"p\", \"dedup_publish\": {\"match\": [], \"store\": {\"type\": "
	    "\"postgresql\"}}, \"idempotency\": [{\"queue\": \"a\"}, {\"queue\": \"b\", "
	    "\"store\": {\"type\": \"postgresql\"}}, {\"queue\": \"c\", \"store\": "
	    "{\"type\": \"lmdb\"}}]}";
	const struct rules_vhost *v;
	struct rules *r;
	int n;

	rules_set_postgresql(0);
	refused(both, "dedup_publish.store.type",
		"postgresql needs the setting postgres_url (or ACEMQ_PROXY_POSTGRES_URL), "
		"which is empty");
	ck_assert_ptr_nonnull(strstr(errbuf, "idempotency[1].store.type: postgresql needs"));
	rules_set_postgresql(1);
	refused("{\"vhost\": \"a\", \"idempotency\": [{\"queue\": \"q\", \"store\": "
		"{\"type\": \"redis\"}}]}",
		"idempotency[0].store.type", "'redis' is not lmdb or postgresql");
	refused("{\"vhost\": \"a\", \"dedup_publish\": {\"match\": [], \"store\": "
		"{\"type\": \"postgresql\", \"url\": \"x\"}}}",
		"dedup_publish.store.url", "unknown key");
	fresh_dir();
	put("p.json", both);
	put("q.json", "{\"vhost\": \"q\", \"idempotency\": [{\"queue\": \"a\"}]}");
	r = load(&n);
	ck_assert_msg(r != NULL, "%s", errbuf);
	ck_assert_int_eq(r->any_postgresql, 1);
	v = rules_vhost(r, "p");
	ck_assert_int_eq(v->dedup_publish.store, RULES_KEYS_POSTGRESQL);
	ck_assert_int_eq(v->idempotency[0].store, RULES_KEYS_LMDB);
	ck_assert_int_eq(v->idempotency[1].store, RULES_KEYS_POSTGRESQL);
	ck_assert_int_eq(v->idempotency[2].store, RULES_KEYS_LMDB);
	rules_unref(r);
	fresh_dir();
	put("q.json", "{\"vhost\": \"q\", \"idempotency\": [{\"queue\": \"a\"}]}");
	r = load(&n);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->any_postgresql, 0);
	rules_unref(r);
	rules_set_postgresql(0);
}
END_TEST

START_TEST(duplicate_vhost_refused)
{
	struct rules *r;
	int n;

	fresh_dir();
	put("a.json", "{\"vhost\": \"shared\"}");
	put("b.json", "{\"vhost\": \"shared\", \"reply_to\": {\"enabled\": true}}");
	r = load(&n);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(n, 1);
	ck_assert_ptr_nonnull(strstr(errbuf, "b.json: vhost: 'shared' is already named by"));
	ck_assert_ptr_nonnull(strstr(errbuf, "a.json"));
}
END_TEST

START_TEST(every_error_reported)
{
	struct rules *r;
	int n;

	fresh_dir();
	put("a.json", "{\"vhost\": \"a\", \"bogus\": 1, \"reply_to\": {\"enabled\": 2}}");
	put("b.json", "nonsense");
	put("c.json", "{\"vhost\": \"c\"}");
	r = load(&n);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(n, 3);
}
END_TEST

START_TEST(missing_directory)
{
	struct rules *r;
	int n;

	strcpy(dir, "/nonexistent/acemq-rules");
	r = load(&n);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(n, 1);
	ck_assert_ptr_nonnull(strstr(errbuf, "(directory): cannot open"));
	dir[0] = '\0';
}
END_TEST

START_TEST(no_directory_is_empty_set)
{
	int n;
	struct rules *r = rules_load("", stderr, &n);

	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->n, 0);
	ck_assert_int_eq(n, 0);
	rules_unref(r);
}
END_TEST

/* rules_load in a child that has 10 s: a load that waits (on a FIFO,
 * for a writer that never comes) fails the test instead of hanging the
 * run. The child sends whether it loaded, the error count and the error
 * text through a pipe; errbuf holds the text afterwards. */
static int load_bounded(int *nerr)
{
	struct pollfd pfd;
	struct {
		int loaded, nerr;
	} res = {0, 0};
	size_t got = 0;
	ssize_t r;
	pid_t pid;
	int fds[2], status;

	ck_assert_int_eq(pipe(fds), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct rules *loaded;

		close(fds[0]);
		loaded = load(&res.nerr);
		res.loaded = loaded != NULL;
		if (write(fds[1], &res, sizeof(res)) != (ssize_t)sizeof(res) ||
		    write(fds[1], errbuf, strlen(errbuf)) < 0)
			_exit(1);
		_exit(0);
	}
	close(fds[1]);
	pfd.fd = fds[0];
	pfd.events = POLLIN;
	if (poll(&pfd, 1, 10000) != 1) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		close(fds[0]);
		ck_abort_msg("rules_load did not return within 10 s");
	}
	ck_assert_int_eq(read(fds[0], &res, sizeof(res)), (ssize_t)sizeof(res));
	memset(errbuf, 0, sizeof(errbuf));
	while (got < sizeof(errbuf) - 1 &&
	       (r = read(fds[0], errbuf + got, sizeof(errbuf) - 1 - got)) > 0)
		got += (size_t)r;
	close(fds[0]);
	waitpid(pid, &status, 0);
	*nerr = res.nerr;
	return res.loaded;
}

/* A FIFO and a directory named *.json are refused at once, by name, and
 * the load never waits on the FIFO. */
START_TEST(only_regular_files)
{
	char path[256];
	int n;

	fresh_dir();
	put("a.json", "{\"vhost\": \"a\"}");
	snprintf(path, sizeof(path), "%s/fifo.json", dir);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	snprintf(path, sizeof(path), "%s/d.json", dir);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(load_bounded(&n), 0);
	ck_assert_int_eq(n, 2);
	snprintf(path, sizeof(path), "%s/fifo.json: (file): not a regular file (a FIFO)", dir);
	ck_assert_msg(strstr(errbuf, path) != NULL, "want '%s' in '%s'", path, errbuf);
	snprintf(path, sizeof(path), "%s/d.json: (file): not a regular file (a directory)",
		 dir);
	ck_assert_msg(strstr(errbuf, path) != NULL, "want '%s' in '%s'", path, errbuf);
	ck_assert_ptr_null(strstr(errbuf, "not valid JSON"));
}
END_TEST

/* A symbolic link to a regular file is read (a ConfigMap's files are
 * links); one to a FIFO is refused like the FIFO. */
START_TEST(symlinks_followed)
{
	char target[256], link[256];
	struct rules *r;
	int n;

	fresh_dir();
	put("..data", "{\"vhost\": \"linked\"}");
	snprintf(target, sizeof(target), "%s/..data", dir);
	snprintf(link, sizeof(link), "%s/linked.json", dir);
	ck_assert_int_eq(symlink(target, link), 0);
	r = load(&n);
	ck_assert_ptr_nonnull(r);
	ck_assert_ptr_nonnull(rules_vhost(r, "linked"));
	rules_unref(r);
	snprintf(target, sizeof(target), "%s/fifo", dir);
	ck_assert_int_eq(mkfifo(target, 0600), 0);
	snprintf(link, sizeof(link), "%s/f.json", dir);
	ck_assert_int_eq(symlink(target, link), 0);
	ck_assert_int_eq(load_bounded(&n), 0);
	ck_assert_ptr_nonnull(strstr(errbuf, "f.json: (file): not a regular file (a FIFO)"));
}
END_TEST

/* More than 1 MiB is refused with the size, without being parsed. */
START_TEST(size_capped)
{
	char path[256];
	struct rules *r;
	FILE *f;
	int n;

	fresh_dir();
	snprintf(path, sizeof(path), "%s/big.json", dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("{\"vhost\": \"big\", \"x\": \"", f);
	for (n = 0; n < 1024 * 1024; n++)
		fputc('a', f);
	fputs("\"}", f);
	fclose(f);
	r = load(&n);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(n, 1);
	ck_assert_msg(strstr(errbuf, "big.json: (file): 1048601 bytes: a rules file is at most "
				     "1 MiB (1048576 bytes)") != NULL,
		      "%s", errbuf);
	/* Exactly the cap is read. */
	fresh_dir();
	snprintf(path, sizeof(path), "%s/big.json", dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("{\"vhost\": \"big\"}", f);
	for (n = (int)strlen("{\"vhost\": \"big\"}"); n < 1024 * 1024; n++)
		fputc(' ', f);
	fclose(f);
	r = load(&n);
	ck_assert_ptr_nonnull(r);
	rules_unref(r);
}
END_TEST

/* cJSON would end "v\u0000x" at the NUL: refused with the key, wherever
 * it is; control characters in a vhost name too. */
START_TEST(nul_and_control_characters)
{
	refused("{\"vhost\": \"v\\u0000x\"}", "vhost",
		"the string holds an escaped NUL (\\u0000), which would cut it short");
	ck_assert_int_eq(strstr(errbuf, "is already named") == NULL, 1);
	refused("{\"vhost\": \"v\", \"claim_check\": {\"match\": [{\"exchange\": \"x\"}, "
		"{\"exchange\": \"a\\u0000\"}]}}",
		"claim_check.match[1].exchange",
		"the string holds an escaped NUL (\\u0000), which would cut it short");
	refused("{\"vhost\": \"v\", \"idempotency\": [{\"queue\": \"q\", "
		"\"key\": \"header:k\\u0000\"}]}",
		"idempotency[0].key", "the string holds an escaped NUL");
	refused("{\"vh\\u0000ost\": \"v\"}", "vh\\u0000ost",
		"the key holds an escaped NUL (\\u0000)");
	refused("{\"vhost\": \"a\\nb\"}", "vhost", "holds a control character (\\x0a)");
	refused("{\"vhost\": \"\\u001b[2J\"}", "vhost", "holds a control character (\\x1b)");
	refused("{\"vhost\": \"a\\u007f\"}", "vhost", "holds a control character (\\x7f)");
	/* An escaped backslash before u0000 is no NUL. */
	{
		struct rules *r;
		int n;

		fresh_dir();
		put("v.json", "{\"vhost\": \"v\\\\u0000\"}");
		r = load(&n);
		ck_assert_ptr_nonnull(r);
		ck_assert_ptr_nonnull(rules_vhost(r, "v\\u0000"));
		rules_unref(r);
	}
}
END_TEST

static int tm(const char *pattern, const char *key)
{
	struct topic *t = topic_compile(pattern);
	int m = topic_match(t, key, strlen(key));

	topic_free(t);
	return m;
}

START_TEST(topic_semantics)
{
	ck_assert(tm("a.b", "a.b"));
	ck_assert(!tm("a.b", "a.b.c"));
	ck_assert(tm("a.*", "a.b"));
	ck_assert(!tm("a.*", "a"));
	ck_assert(!tm("a.*", "a.b.c"));
	ck_assert(tm("a.#", "a"));
	ck_assert(tm("a.#", "a.b.c"));
	ck_assert(tm("#", "anything.at.all"));
	ck_assert(tm("#.z", "z"));
	ck_assert(tm("#.z", "x.y.z"));
	ck_assert(!tm("#.z", "x.y"));
	ck_assert(tm("*.#.*", "a.b"));
	ck_assert(!tm("*.#.*", "a"));
	ck_assert(tm("a.#.b.#.c", "a.x.b.y.y.c"));
	ck_assert(!tm("doc", "docs"));
}
END_TEST

START_TEST(exchange_forms)
{
	struct rules *r;
	const struct rules_vhost *v;
	int n;

	fresh_dir();
	put("v.json",
	    "{\"vhost\": \"v\", \"schedule\": {\"match\": ["
	    "{\"exchange\": \"\"}, {\"exchange\": \"*\", \"routing_key\": \"late.*\"}]}}");
	r = load(&n);
	ck_assert_ptr_nonnull(r);
	v = rules_vhost(r, "v");
	ck_assert(rules_matches(&v->schedule.match, "", 0, "q", 1)); /* default exchange */
	ck_assert(!rules_matches(&v->schedule.match, "x", 1, "q", 1));
	ck_assert(rules_matches(&v->schedule.match, "x", 1, "late.q", 6));
	rules_unref(r);
}
END_TEST

START_TEST(upstream_lists)
{
	const struct rules_vhost *a, *b, *c;
	struct rules *r;
	int n;

	fresh_dir();
	put("a.json",
	    "{\"vhost\": \"a\", \"upstream\": [\"127.0.0.1:5701\", \"localhost:5702\"]}");
	put("b.json",
	    "{\"vhost\": \"b\", \"upstream\": [\"127.0.0.1:5702\", \"127.0.0.1:5701\"]}");
	put("c.json", "{\"vhost\": \"c\"}");
	r = load(&n);
	ck_assert_msg(r != NULL, "%s", errbuf);
	ck_assert_int_eq(r->greets, 1);
	a = rules_vhost(r, "a");
	b = rules_vhost(r, "b");
	c = rules_vhost(r, "c");
	ck_assert_int_eq(a->upstream.n, 2);
	ck_assert_str_eq(upstream_node(a->upstream.at[0])->name, "127.0.0.1:5701");
	ck_assert_str_eq(upstream_node(a->upstream.at[1])->name, "localhost:5702");
	/* One table entry per address, shared by the lists; the order is
	 * each list's own. */
	ck_assert_int_eq(b->upstream.n, 2);
	ck_assert_int_eq(b->upstream.at[1], a->upstream.at[0]);
	ck_assert_str_eq(upstream_node(b->upstream.at[0])->name, "127.0.0.1:5702");
	ck_assert_int_eq(c->upstream.n, 0);
	/* The pick follows the list, skipping what was tried. */
	ck_assert_int_eq(upstream_pick(&b->upstream, 0), b->upstream.at[0]);
	ck_assert_int_eq(upstream_pick(&b->upstream, 1u << b->upstream.at[0]),
			 a->upstream.at[0]);
	ck_assert_int_eq(
	    upstream_pick(&b->upstream, (1u << b->upstream.at[0]) | (1u << b->upstream.at[1])),
	    -1);
	rules_unref(r);
	/* Without the key anywhere the proxy does not greet. */
	fresh_dir();
	put("c.json", "{\"vhost\": \"c\"}");
	r = load(&n);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->greets, 0);
	rules_unref(r);
	refused("{\"vhost\": \"v\", \"upstream\": []}", "upstream",
		"must be a non-empty array");
	refused("{\"vhost\": \"v\", \"upstream\": \"127.0.0.1:5672\"}", "upstream",
		"must be a non-empty array");
	refused("{\"vhost\": \"v\", \"upstream\": [5672]}", "upstream",
		"must be a non-empty array");
	refused("{\"vhost\": \"v\", \"upstream\": [\"nohost\"]}", "upstream",
		"nohost is not HOST:PORT");
	refused("{\"vhost\": \"v\", \"upstream\": [\"no.such.host.invalid:5672\"]}", "upstream",
		"cannot resolve no.such.host.invalid:5672");
	refused("{\"vhost\": \"v\", \"upstream\": [\"127.0.0.1:5701\", \"127.0.0.1:5701\"]}",
		"upstream", "127.0.0.1:5701 is named twice");
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, design_example_loads);
	tcase_add_test(tc, refusals);
	tcase_add_test(tc, dedup_publish_keys);
	tcase_add_test(tc, s3_store);
	tcase_add_test(tc, duplicate_vhost_refused);
	tcase_add_test(tc, every_error_reported);
	tcase_add_test(tc, missing_directory);
	tcase_add_test(tc, no_directory_is_empty_set);
	tcase_add_test(tc, topic_semantics);
	tcase_add_test(tc, exchange_forms);
	tcase_add_test(tc, upstream_lists);
	tcase_add_test(tc, only_regular_files);
	tcase_add_test(tc, symlinks_followed);
	tcase_add_test(tc, size_capped);
	tcase_add_test(tc, nul_and_control_characters);
	tcase_add_test(tc, keys_store);
	return unit_run("rules", tc, 0);
}
