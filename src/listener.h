/* listener: the client-facing sockets, handing accepted connections to
 * workers; max_connections decided at the accept; a spare descriptor kept
 * for the moments the process runs out of them. */
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

/* Whether host:port (or [v6]:port) resolves as a listening address; 0, or
 * -1 with the reason in err. */
int listener_check(const char *addr, char *err, int errlen);

/* From an accept error callback on the main thread, with the accept's
 * errno. Out of descriptors (EMFILE, ENFILE; Linux says so even when no
 * connection waits): the spare descriptor is given up to accept the
 * waiting connection and close it at once (a client sees a close, not a
 * hang), then taken again; "out of file descriptors" is logged once per
 * episode. LISTENER_SHED_CLOSED: a connection was closed so;
 * LISTENER_SHED_NONE: none was waiting; LISTENER_SHED_PAUSE: none could be
 * taken (the caller rests its listener a moment rather than spin);
 * LISTENER_SHED_OTHER: another error. */
enum listener_shed_result {
	LISTENER_SHED_OTHER,
	LISTENER_SHED_CLOSED,
	LISTENER_SHED_NONE,
	LISTENER_SHED_PAUSE
};
enum listener_shed_result listener_shed(int lfd, int err);
/* An accept returned fd (main thread): 0 to go on with it; -1 when the
 * spare descriptor was missing and could only be taken again by closing
 * fd (the connection is shed). An episode of running out ends at an
 * accept that leaves room for a few more descriptors. */
int listener_accepted(int fd);

#endif
