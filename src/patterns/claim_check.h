/* claim_check: large bodies offloaded to a per-vhost store on publish and
 * rehydrated on delivery; the framing is a contract with the AceMQ
 * libraries (0xAC 0x01 0x00 inline, 0xAC 0x01 0x01 KEY a claim check). */
#ifndef ACEMQ_CLAIM_CHECK_H
#define ACEMQ_CLAIM_CHECK_H

void claim_check_register(void);

#endif
