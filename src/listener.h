/* listener: the client-facing sockets, handing accepted connections to workers. */
#ifndef ACEMQ_LISTENER_H
#define ACEMQ_LISTENER_H

struct event_base;
struct worker;

/* Bind every address (tls: its clients speak TLS); 0, or -1 with the
 * reason logged. Called once for plain addresses and once for TLS ones. */
int listener_open(struct event_base *base, char *const *addrs, int naddrs, int tls,
		  struct worker *workers, int nworkers, long max_connections);
/* Stop accepting (sockets are closed). */
void listener_close(void);

#endif
