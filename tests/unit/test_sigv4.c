/* test_sigv4: the signer against AWS's published Signature Version 4
 * examples for S3 (GET with Range, PUT, a parameter without a value, a
 * listing with parameters) and the encoding rules they rest on. */
#include "src/store/sigv4.h"
#include "unit.h"

#include <stdio.h>
#include <string.h>

static const struct sigv4_key aws_key = {
    "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1", "s3"};
#define EMPTY_HASH "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define DATE       "20130524T000000Z"
#define HOST       "examplebucket.s3.amazonaws.com"

static void signature_is(const struct sigv4_request *req, const char *headers, const char *sig)
{
	char auth[1024], want[1024];

	ck_assert_int_eq(sigv4_authorization(auth, sizeof(auth), &aws_key, DATE, req), 0);
	snprintf(want, sizeof(want),
		 "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
		 "aws4_request, SignedHeaders=%s, Signature=%s",
		 headers, sig);
	ck_assert_str_eq(auth, want);
}

START_TEST(get_object_with_range)
{
	const struct sigv4_header h[] = {{"Range", "bytes=0-9"},
					 {"x-amz-date", DATE},
					 {"Host", HOST},
					 {"x-amz-content-sha256", EMPTY_HASH}};
	struct sigv4_request req = {"GET", "/test.txt", NULL, 0, h, 4, EMPTY_HASH};
	char *c = sigv4_canonical_request(&req);

	ck_assert_str_eq(c, "GET\n/test.txt\n\nhost:" HOST "\nrange:bytes=0-9\n"
			    "x-amz-content-sha256:" EMPTY_HASH "\nx-amz-date:" DATE "\n\n"
			    "host;range;x-amz-content-sha256;x-amz-date\n" EMPTY_HASH);
	free(c);
	signature_is(&req, "host;range;x-amz-content-sha256;x-amz-date",
		     "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}
END_TEST

START_TEST(put_object)
{
	const char *body = "Welcome to Amazon S3.";
	char hash[SIGV4_HASH_LEN + 1], path[64];
	struct sigv4_header h[5];
	struct sigv4_request req;

	sigv4_sha256_hex(hash, body, strlen(body));
	ck_assert_str_eq(hash,
			 "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
	h[0] = (struct sigv4_header){"Host", HOST};
	h[1] = (struct sigv4_header){"Date", "Fri, 24 May 2013 00:00:00 GMT"};
	h[2] = (struct sigv4_header){"x-amz-date", DATE};
	h[3] = (struct sigv4_header){"x-amz-storage-class", "REDUCED_REDUNDANCY"};
	h[4] = (struct sigv4_header){"x-amz-content-sha256", hash};
	/* The key "test$file.text": '$' is encoded in the path. */
	path[0] = '/';
	sigv4_encode(path + 1, sizeof(path) - 1, "test$file.text", 14, 1);
	ck_assert_str_eq(path, "/test%24file.text");
	req = (struct sigv4_request){"PUT", path, NULL, 0, h, 5, hash};
	signature_is(&req, "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
		     "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}
END_TEST

START_TEST(parameter_without_value)
{
	const struct sigv4_header h[] = {
	    {"host", HOST}, {"x-amz-date", DATE}, {"x-amz-content-sha256", EMPTY_HASH}};
	const struct sigv4_param q[] = {{"lifecycle", NULL}};
	struct sigv4_request req = {"GET", "/", q, 1, h, 3, EMPTY_HASH};
	char *sent = sigv4_query_string(q, 1, 0), *canonical = sigv4_query_string(q, 1, 1);

	ck_assert_str_eq(sent, "lifecycle");
	ck_assert_str_eq(canonical, "lifecycle=");
	free(sent);
	free(canonical);
	signature_is(&req, "host;x-amz-content-sha256;x-amz-date",
		     "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}
END_TEST

START_TEST(list_with_unsorted_parameters)
{
	const struct sigv4_header h[] = {
	    {"host", HOST}, {"x-amz-date", DATE}, {"x-amz-content-sha256", EMPTY_HASH}};
	const struct sigv4_param q[] = {{"prefix", "J"}, {"max-keys", "2"}};
	struct sigv4_request req = {"GET", "/", q, 2, h, 3, EMPTY_HASH};
	char *sent = sigv4_query_string(q, 2, 0);

	ck_assert_str_eq(sent, "max-keys=2&prefix=J");
	free(sent);
	signature_is(&req, "host;x-amz-content-sha256;x-amz-date",
		     "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}
END_TEST

START_TEST(encoding)
{
	char out[128];
	const struct sigv4_param q[] = {
	    {"continuation-token", "1/a+b=c d"}, {"uploads", NULL}, {"prefix", "claims/"}};
	const struct sigv4_header h[] = {{"X-Amz-Date", "  a   b  "}};
	struct sigv4_request req = {"GET", "/b", NULL, 0, h, 1, "UNSIGNED-PAYLOAD"};
	char *s;

	ck_assert_uint_eq(sigv4_encode(out, sizeof(out), "a b/c~-_.*", 10, 1), 14);
	ck_assert_str_eq(out, "a%20b/c~-_.%2A");
	sigv4_encode(out, sizeof(out), "a/b\xc3\xa9", 5, 0);
	ck_assert_str_eq(out, "a%2Fb%C3%A9");
	/* Asked with no room first, the length is still told. */
	ck_assert_uint_eq(sigv4_encode(NULL, 0, "a b", 3, 0), 5);
	s = sigv4_query_string(q, 3, 1);
	ck_assert_str_eq(s, "continuation-token=1%2Fa%2Bb%3Dc%20d&prefix=claims%2F&uploads=");
	free(s);
	s = sigv4_canonical_request(&req);
	ck_assert_str_eq(s, "GET\n/b\n\nx-amz-date:a b\n\nx-amz-date\nUNSIGNED-PAYLOAD");
	free(s);
	sigv4_date(out, 1369353600);
	ck_assert_str_eq(out, DATE);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, get_object_with_range);
	tcase_add_test(tc, put_object);
	tcase_add_test(tc, parameter_without_value);
	tcase_add_test(tc, list_with_unsorted_parameters);
	tcase_add_test(tc, encoding);
	return unit_run("sigv4", tc, 1);
}
