/* transport: one non-blocking TCP socket with an input and an output
 * evbuffer: large reads until the socket is dry, writes tried at once and
 * batched per loop turn, and the socket watched for writing only while
 * output is stuck. */
#ifndef ACEMQ_TRANSPORT_H
#define ACEMQ_TRANSPORT_H

#include <event2/util.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct evbuffer;
struct transport;

enum {
	TRANSPORT_EOF = 0x01,       /* the peer closed */
	TRANSPORT_ERROR = 0x02,     /* a socket error (errno says) */
	TRANSPORT_TIMEOUT = 0x04,   /* nothing read within the read timeout */
	TRANSPORT_CONNECTED = 0x08, /* an outgoing connect finished */
};

typedef void (*transport_cb)(struct transport *t, void *arg);
typedef void (*transport_event_cb)(struct transport *t, int what, int err, void *arg);

struct transport *transport_new(struct event_base *base, evutil_socket_t fd);
/* Connect a new transport to sa; the output may be filled at once and is
 * sent when connected. NULL on failure (errno). */
struct transport *transport_connect(struct event_base *base, const struct sockaddr *sa,
				    int salen);
/* A transport whose connect completes when transport_connect_done says so
 * (err 0: connected); a seam for tests that script the broker leg. */
struct transport *transport_pending(struct event_base *base, evutil_socket_t fd);
void transport_connect_done(struct transport *t, int err);
/* A transport on a socket whose connect is under way or done: connected
 * once the socket is writable, as with transport_connect (a seam for
 * tests whose broker is a socketpair). */
struct transport *transport_connecting_fd(struct event_base *base, evutil_socket_t fd);
int transport_connecting(const struct transport *t);
/* For tests: deliver a read timeout (TRANSPORT_TIMEOUT, if one is set) or a
 * failure (TRANSPORT_EOF / TRANSPORT_ERROR with err) as if it happened. */
void transport_inject(struct transport *t, int what, int err);
void transport_free(struct transport *t);
/* Speak TLS over the socket (ssl: an OpenSSL SSL, which t now owns): an
 * accepted socket's handshake starts at once; an outgoing connection
 * reports TRANSPORT_CONNECTED once its handshake is done. 0 or -1. */
int transport_tls(struct transport *t, void *ssl);
/* The reason for an error the event callback reported (err): TLS's own
 * when it was TLS that failed. */
const char *transport_error(const struct transport *t, int err);

/* read: new input; drained: output fell to the low mark; event: see above. */
void transport_setcb(struct transport *t, transport_cb read, transport_cb drained,
		     transport_event_cb event, void *arg);
struct evbuffer *transport_input(struct transport *t);
/* Bytes read from and written to the socket so far. */
void transport_bytes(const struct transport *t, uint64_t *in, uint64_t *out);
/* Add every byte written from now on to *counter too (a statistic of the
 * owner's, on this thread; NULL: none). */
void transport_count_sent(struct transport *t, uint64_t *counter);
struct evbuffer *transport_output(struct transport *t);
evutil_socket_t transport_fd(struct transport *t);

void transport_read_enable(struct transport *t);
void transport_read_disable(struct transport *t);
/* Stop reading while the input holds high bytes or more (0: no limit). */
void transport_set_read_high(struct transport *t, size_t high);
/* Call drained when the output falls to low bytes or fewer. */
void transport_set_write_low(struct transport *t, size_t low);
/* No input for ms milliseconds is a TRANSPORT_TIMEOUT (0: none). */
void transport_set_read_timeout(struct transport *t, long ms);
/* The input was consumed: resume reading if it had reached the high mark. */
void transport_input_consumed(struct transport *t);

/* ---- pipes: a transport with no socket, whose peer is code in this
 * process (a pooled broker connection). The owner uses it as any other
 * transport; the peer reads its output and writes its input. */
struct transport_pipe_ops {
	/* Output is waiting (called from the loop, once per turn): take
	 * what fits; transport_pipe_kick asks again later. */
	void (*output)(void *arg);
	/* The owner consumed input after the pipe had been full. */
	void (*consumed)(void *arg);
	/* The owner freed the pipe (the last call for arg). */
	void (*gone)(void *arg);
};
/* A pipe, connected at once (TRANSPORT_CONNECTED later in this turn). */
struct transport *transport_pipe(struct event_base *base, const struct transport_pipe_ops *ops,
				 void *arg);
/* The peer added to the input: the owner reads it later in this turn. */
void transport_pipe_fed(struct transport *t);
/* The input holds the read high mark or more: the peer should wait. */
int transport_pipe_full(const struct transport *t);
/* The peer can take output again. */
void transport_pipe_kick(struct transport *t);
/* The peer has gone: the owner reads what is left, then hears the end
 * (TRANSPORT_EOF, or TRANSPORT_ERROR with err); output is dropped from
 * here on, and of the ops only gone is still called. */
void transport_pipe_end(struct transport *t, int what, int err);
/* The peer's arg when t is a pipe with these ops, else NULL. */
void *transport_pipe_peer(const struct transport *t, const struct transport_pipe_ops *ops);
/* Bytes moved through the pipe, for transport_bytes. */
void transport_pipe_count(struct transport *t, uint64_t in, uint64_t out);

#endif
