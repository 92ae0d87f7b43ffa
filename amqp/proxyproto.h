/* proxyproto: the PROXY protocol header (v1 text, v2 binary) that a load
 * balancer puts before a connection's first byte: read it, or write v2 for
 * the broker. Parsers return OK / AGAIN / ERROR and never allocate. */
#ifndef ACEMQ_PROXYPROTO_H
#define ACEMQ_PROXYPROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define PROXYPROTO_V1_MAX 107 /* the longest v1 line, CRLF included */
#define PROXYPROTO_V2_MAX 52  /* what proxyproto_write_v2 writes at most */

enum { PROXYPROTO_OK = 0, PROXYPROTO_AGAIN = 1, PROXYPROTO_ERROR = -1 };

struct proxyproto_addr {
	int local; /* LOCAL (v2) or UNKNOWN (v1): no addresses; keep the socket's */
	struct sockaddr_storage src, dst;
	socklen_t srclen, dstlen;
};

/* Read a header from the first len bytes of a connection. OK: the header
 * is *used bytes long and out is filled; AGAIN: not all of it is there yet;
 * ERROR: not a PROXY protocol header (or a malformed one). TLVs of v2 are
 * skipped. */
int proxyproto_parse(const uint8_t *p, size_t len, size_t *used, struct proxyproto_addr *out);

/* Write a v2 PROXY header for a TCP connection from src to dst (both IPv4
 * or both IPv6; anything else is written as LOCAL) into out, which holds
 * PROXYPROTO_V2_MAX bytes. Returns its length. */
size_t proxyproto_write_v2(uint8_t *out, const struct sockaddr *src,
			   const struct sockaddr *dst);

#endif
