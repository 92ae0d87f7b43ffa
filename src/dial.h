/* dial: connecting a session's broker leg: the next broker address of the
 * vhost's list (a failed node last), TLS to the broker, the PROXY header. */
#ifndef ACEMQ_DIAL_H
#define ACEMQ_DIAL_H

struct session;
struct leg;
struct transport;
struct upstream_node;

/* Connect to the next address not tried yet, queueing the client's
 * protocol header (after a PROXY header when configured). 0, or -1 when no
 * address is left. */
int dial_upstream(struct session *s);
/* The address being tried failed: the next one. 0, or -1 as above. */
int dial_next(struct session *s);
/* The connect finished. */
void dial_connected(struct session *s, struct leg *l);
/* TLS on a transport to broker address n: SNI and the name verified are
 * upstream_tls_name, or the host of the address (the sessions' broker
 * legs and the greeting's probe alike). 0 or -1. */
int dial_tls(struct transport *tr, const struct upstream_node *n);
/* No broker address answered: a greeted client is told why; otherwise the
 * session ends, as if the broker had not answered. */
void dial_unreachable(struct session *s);

#endif
