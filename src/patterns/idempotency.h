/* idempotency: deliveries deduplicated by key with claim, confirm and forget
 * under a lease (the three answers are a contract with the AceMQ
 * libraries). */
#ifndef ACEMQ_IDEMPOTENCY_H
#define ACEMQ_IDEMPOTENCY_H

struct state;

/* The state layer the keys live in (NULL: every delivery passes). */
void idempotency_init(struct state *st);
void idempotency_register(void);

#endif
