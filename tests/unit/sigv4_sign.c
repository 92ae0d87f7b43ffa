/* sigv4_sign: sign one request described on the command line and print the
 * path, the query string and the Authorization header the S3 store would
 * send, then the canonical request, so that the tests can hold the signer
 * against an independent one (botocore).
 *   sigv4-sign ACCESS SECRET REGION DATE METHOD BUCKET KEY PAYLOAD_HASH
 *              [q NAME VALUE | q0 NAME | h NAME VALUE]...
 * KEY "-": a request on the bucket itself; the path is path style. */
#include "src/store/s3.h"
#include "src/store/sigv4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	struct sigv4_param q[32];
	struct sigv4_header h[32];
	struct sigv4_key key;
	struct sigv4_request req;
	char auth[2048], *canonical, *query, *path;
	int i, nq = 0, nh = 0;

	if (argc < 9) {
		fprintf(stderr,
			"usage: sigv4-sign ACCESS SECRET REGION DATE METHOD BUCKET KEY HASH "
			"[q NAME VALUE | q0 NAME | h NAME VALUE]...\n");
		return 2;
	}
	key = (struct sigv4_key){argv[1], argv[2], argv[3], "s3"};
	for (i = 9; i < argc; i++) {
		if (strcmp(argv[i], "q") == 0 && i + 2 < argc && nq < 32) {
			q[nq++] = (struct sigv4_param){argv[i + 1], argv[i + 2]};
			i += 2;
		} else if (strcmp(argv[i], "q0") == 0 && i + 1 < argc && nq < 32) {
			q[nq++] = (struct sigv4_param){argv[i + 1], NULL};
			i += 1;
		} else if (strcmp(argv[i], "h") == 0 && i + 2 < argc && nh < 32) {
			h[nh++] = (struct sigv4_header){argv[i + 1], argv[i + 2]};
			i += 2;
		} else {
			fprintf(stderr, "sigv4-sign: bad argument %s\n", argv[i]);
			return 2;
		}
	}
	path = s3_request_path(argv[6], strcmp(argv[7], "-") == 0 ? NULL : argv[7], 1);
	if (path == NULL)
		return 1;
	req = (struct sigv4_request){argv[5], path, q, nq, h, nh, argv[8]};
	canonical = sigv4_canonical_request(&req);
	query = sigv4_query_string(q, nq, 0);
	if (canonical == NULL || query == NULL ||
	    sigv4_authorization(auth, sizeof(auth), &key, argv[4], &req) != 0)
		return 1;
	printf("%s\n%s\n%s\n%s\n", path, query, auth, canonical);
	free(path);
	free(canonical);
	free(query);
	return 0;
}
