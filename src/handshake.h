/* handshake: a session's protocol header (and a load balancer's PROXY
 * header before it), connection negotiation (start-ok, tune, open) read on
 * the way through, and the greeting, where the proxy answers the client
 * itself and replays its handshake to the broker it chose. */
#ifndef ACEMQ_HANDSHAKE_H
#define ACEMQ_HANDSHAKE_H

#include <amqp.h>
#include <stdint.h>

struct session;
struct leg;
struct frame_info;

/* The client's protocol header. 0 to go on, 1 to wait for more input, -1
 * when the session is gone. */
int handshake_header(struct session *s);
/* A decoded connection method (channel 0) read from leg from. Returns as
 * relay_method's parts do (RELAY_*). */
int handshake_method(struct session *s, struct leg *from, const struct frame_info *fi,
		     amqp_method_number_t id, void *m);
/* A greeted client's broker went away or refused: the client is told. */
void handshake_failed(struct session *s, uint16_t code, const char *text);

#endif
