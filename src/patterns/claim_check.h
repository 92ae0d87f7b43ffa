/* claim_check: large bodies offloaded to a per-vhost store on publish and
 * rehydrated on delivery; the framing is a contract with the AceMQ
 * libraries (0xAC 0x01 0x00 inline, 0xAC 0x01 0x01 KEY a claim check). */
#ifndef ACEMQ_CLAIM_CHECK_H
#define ACEMQ_CLAIM_CHECK_H

#include <stddef.h>
#include <stdint.h>

enum claim_check_form {
	CLAIM_CHECK_PLAIN,     /* an ordinary body */
	CLAIM_CHECK_INLINED,   /* 0xAC 0x01 0x00 payload */
	CLAIM_CHECK_REFERENCE, /* 0xAC 0x01 0x01 key (key at most 255 bytes) */
};

/* What a body says it is, from its whole bytes (len: the body's size). */
enum claim_check_form claim_check_form(const uint8_t *body, size_t len);
/* key printed safely into out (non-printable bytes as '?'). */
void claim_check_printable(char *out, size_t outlen, const uint8_t *key, size_t len);

void claim_check_register(void);

#endif
