/* transport: one non-blocking TCP socket with an input and an output
 * evbuffer: large reads until the socket is dry, writes tried at once and
 * batched per loop turn, and the socket watched for writing only while
 * output is stuck; TLS (OpenSSL, non-blocking) when given an SSL. */
#include "transport.h"

#include "debug.h"
#include "stats.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define TRANSPORT_READ_CHUNK  65536      /* space reserved per read */
#define TRANSPORT_READ_BUDGET (1u << 20) /* bytes read per wake-up, for fairness */

struct transport {
	evutil_socket_t fd;
	struct event *rev, *wev;
	struct evbuffer *in, *out;
	transport_cb read_cb, drained_cb;
	transport_event_cb event_cb;
	void *arg;
	size_t read_high, write_low;
	struct timeval read_timeout;
	unsigned reading : 1;       /* the owner wants input */
	unsigned full : 1;          /* input reached read_high */
	unsigned write_waiting : 1; /* wev added: the socket was full */
	unsigned write_queued : 1;  /* wev made active to write this turn */
	unsigned connecting : 1;
	unsigned timeout_set : 1;
	unsigned dead : 1;             /* EOF or error seen: no more I/O */
	unsigned handshaking : 1;      /* TLS: the handshake is not done */
	unsigned write_wants_read : 1; /* TLS: a write waits for input */
	uint64_t bytes_in, bytes_out;
	uint64_t *sent_counter; /* the owner's, bumped by what is written (or NULL) */
	SSL *ssl;               /* NULL: plain TCP */
	char tls_err[160];      /* why the TLS session failed */
	/* A pipe (no socket): its peer is code in this process. */
	const struct transport_pipe_ops *pipe;
	void *pipe_arg;
	int pipe_end; /* the peer ended it: TRANSPORT_EOF or _ERROR */
	int pipe_end_err;
	unsigned pipe_gave : 1; /* input was handed over after the end */
};

/* n bytes were written: counted for transport_bytes and the owner (a
 * worker's statistic: this thread is its one writer). */
static void transport_sent(struct transport *t, uint64_t n)
{
	t->bytes_out += n;
	if (t->sent_counter)
		stats_add(t->sent_counter, n);
}

static void transport_ready(struct transport *t);
static void transport_write(struct transport *t);

static void transport_arm_read(struct transport *t)
{
	int want = (t->reading || t->handshaking) && !t->full && !t->connecting && !t->dead;

	if (t->pipe) {
		/* Nothing to watch: the read event runs when there is input
		 * or an end to report. */
		if ((want && evbuffer_get_length(t->in)) || (t->pipe_end && !t->dead))
			event_active(t->rev, EV_READ, 1);
		return;
	}

	if (want)
		event_add(t->rev, t->timeout_set ? &t->read_timeout : NULL);
	else
		event_del(t->rev);
	/* TLS may hold decrypted input the socket no longer signals. */
	if (want && t->ssl && !t->handshaking && SSL_has_pending(t->ssl))
		event_active(t->rev, EV_READ, 1);
}

static void transport_fail(struct transport *t, int what, int err)
{
	ACEMQ_ASSERT(!t->dead); /* an end is reported once */
	t->dead = 1;
	event_del(t->rev);
	event_del(t->wev);
	t->write_waiting = 0;
	if (t->event_cb)
		t->event_cb(t, what, err, t->arg);
}

/* Why OpenSSL failed, kept for the owner's log line. */
static void transport_tls_note(struct transport *t, int ssl_err)
{
	unsigned long e = ERR_get_error(), last = 0;
	long verify;

	while (e != 0) {
		last = e;
		e = ERR_get_error();
	}
	verify = SSL_get_verify_result(t->ssl);
	if (verify != X509_V_OK)
		snprintf(t->tls_err, sizeof(t->tls_err), "TLS: certificate verify failed: %s",
			 X509_verify_cert_error_string(verify));
	else if (last)
		ERR_error_string_n(last, t->tls_err, sizeof(t->tls_err));
	else
		snprintf(t->tls_err, sizeof(t->tls_err), "TLS error %d", ssl_err);
}

/* Advance the handshake: 1 done, 0 waiting for the socket, -1 failed
 * (the owner was told). */
static int transport_handshake(struct transport *t)
{
	int rc, e;

	ERR_clear_error();
	rc = SSL_do_handshake(t->ssl);
	if (rc == 1) {
		t->handshaking = 0;
		if (t->write_waiting) {
			t->write_waiting = 0;
			event_del(t->wev);
		}
		transport_arm_read(t);
		transport_ready(t); /* may free t */
		return 1;
	}
	e = SSL_get_error(t->ssl, rc);
	if (e == SSL_ERROR_WANT_READ) {
		transport_arm_read(t);
		return 0;
	}
	if (e == SSL_ERROR_ZERO_RETURN ||
	    (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && t->bytes_in == 0)) {
		/* The peer closed before a word: an end, not a TLS failure. */
		ERR_clear_error();
		transport_fail(t, TRANSPORT_EOF, 0);
		return -1;
	}
	if (e == SSL_ERROR_WANT_WRITE) {
		if (!t->write_waiting) {
			t->write_waiting = 1;
			event_add(t->wev, NULL);
		}
		return 0;
	}
	transport_tls_note(t, e);
	transport_fail(t, TRANSPORT_ERROR, EPROTO);
	return -1;
}

/* TLS: decrypt what the socket has, into the input. */
static void transport_read_tls(struct transport *t)
{
	size_t total = 0;
	int eof = 0, err = 0;

	while (total < TRANSPORT_READ_BUDGET) {
		struct evbuffer_iovec v;
		int n, e;

		if (evbuffer_reserve_space(t->in, TRANSPORT_READ_CHUNK, &v, 1) < 1)
			break;
		ERR_clear_error();
		n = SSL_read(t->ssl, v.iov_base,
			     v.iov_len > INT_MAX ? INT_MAX : (int)v.iov_len);
		if (n > 0) {
			v.iov_len = (size_t)n;
			evbuffer_commit_space(t->in, &v, 1);
			total += (size_t)n;
			if (t->read_high && evbuffer_get_length(t->in) >= t->read_high) {
				t->full = 1;
				transport_arm_read(t);
				break;
			}
			continue;
		}
		evbuffer_commit_space(t->in, &v, 0);
		e = SSL_get_error(t->ssl, n);
		if (e == SSL_ERROR_WANT_READ)
			break;
		if (e == SSL_ERROR_WANT_WRITE) {
			if (!t->write_waiting) {
				t->write_waiting = 1;
				event_add(t->wev, NULL);
			}
			break;
		}
		if (e == SSL_ERROR_ZERO_RETURN ||
		    (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 &&
		     (n == 0 || errno == 0 || errno == ECONNRESET))) {
			eof = 1;
			break;
		}
		transport_tls_note(t, e);
		err = EPROTO;
		break;
	}
	t->bytes_in += total;
	if (!eof && !err && !t->full && SSL_has_pending(t->ssl))
		event_active(t->rev, EV_READ, 1); /* the budget ran out first */
	/* A write that waited for input goes on at the end of this turn (the
	 * owner's callbacks may free t: nothing runs here after them). */
	if (t->write_wants_read && !eof && !err) {
		t->write_wants_read = 0;
		if (!t->write_queued) {
			t->write_queued = 1;
			event_active(t->wev, EV_WRITE, 1);
		}
	}
	if (total && t->read_cb)
		t->read_cb(t, t->arg); /* may free t */
	else if (eof)
		transport_fail(t, TRANSPORT_EOF, 0);
	else if (err)
		transport_fail(t, TRANSPORT_ERROR, err);
}

/* Read until the socket is dry, the input is full or the budget is spent. */
static void transport_read(struct transport *t)
{
	size_t total = 0;
	int eof = 0, err = 0;

	while (total < TRANSPORT_READ_BUDGET) {
		struct evbuffer_iovec v[2];
		struct iovec iov[2];
		int n = evbuffer_reserve_space(t->in, TRANSPORT_READ_CHUNK, v, 2), i;
		ssize_t got;

		if (n <= 0) {
			err = ENOMEM;
			break;
		}
		ACEMQ_ASSERT(n <= 2);
		for (i = 0; i < n; i++) {
			iov[i].iov_base = v[i].iov_base;
			iov[i].iov_len = v[i].iov_len;
		}
		got = readv(t->fd, iov, n);
		if (got <= 0) {
			evbuffer_commit_space(t->in, v, 0);
			if (got == 0)
				eof = 1;
			else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				err = errno;
			break;
		}
		total += (size_t)got;
		for (i = 0; i < n; i++) {
			size_t take = (size_t)got < v[i].iov_len ? (size_t)got : v[i].iov_len;

			v[i].iov_len = take;
			got -= (ssize_t)take;
		}
		evbuffer_commit_space(t->in, v, n);
		if (t->read_high && evbuffer_get_length(t->in) >= t->read_high) {
			t->full = 1;
			transport_arm_read(t);
			break;
		}
		/* A short read means the socket is dry. */
		if (v[0].iov_len + (n > 1 ? v[1].iov_len : 0) < TRANSPORT_READ_CHUNK)
			break;
	}
	t->bytes_in += total;
	if (total && t->read_cb)
		t->read_cb(t, t->arg); /* may free t when eof or err is 0 */
	else if (eof)
		transport_fail(t, TRANSPORT_EOF, 0);
	else if (err)
		transport_fail(t, TRANSPORT_ERROR, err);
	/* An end after data is seen on the next wake-up, which reads 0. */
}

/* A pipe's input (added by its peer) goes to the owner; its end is
 * reported after the input that came before it was offered once. */
static void transport_read_pipe(struct transport *t)
{
	size_t len = evbuffer_get_length(t->in);

	/* As on a socket, nothing (not even the end) is seen while the
	 * owner does not read. */
	if (t->dead || !t->reading || t->full)
		return;
	if (len && !(t->pipe_end && t->pipe_gave)) {
		if (t->read_high && len >= t->read_high)
			t->full = 1;
		if (t->pipe_end) {
			t->pipe_gave = 1;
			event_active(t->rev, EV_READ, 1);
		}
		t->read_cb(t, t->arg); /* may free t */
		return;
	}
	if (t->pipe_end)
		transport_fail(t, t->pipe_end, t->pipe_end_err);
}

static void transport_read_ev(evutil_socket_t fd, short what, void *arg)
{
	struct transport *t = arg;

	if (t->pipe) {
		transport_read_pipe(t);
		return;
	}

	if (what & EV_TIMEOUT) {
		if (t->event_cb)
			t->event_cb(t, TRANSPORT_TIMEOUT, 0, t->arg);
		return;
	}
	if (t->ssl && t->handshaking) {
		/* An outgoing connection's owner is told (and may free t); an
		 * accepted one reads what came with the handshake. */
		int server = SSL_is_server(t->ssl);

		if (transport_handshake(t) <= 0 || !server)
			return;
	}
	if (t->ssl)
		transport_read_tls(t);
	else
		transport_read(t);
}

/* TLS: encrypt and send what is queued. 0, or -1 when t failed. */
static int transport_write_tls(struct transport *t)
{
	while (evbuffer_get_length(t->out) > 0) {
		struct evbuffer_iovec v;
		int n, e;

		if (evbuffer_peek(t->out, -1, NULL, &v, 1) < 1)
			break;
		ERR_clear_error();
		n = SSL_write(t->ssl, v.iov_base,
			      v.iov_len > INT_MAX ? INT_MAX : (int)v.iov_len);
		if (n > 0) {
			ACEMQ_ASSERT((size_t)n <= v.iov_len);
			evbuffer_drain(t->out, (size_t)n);
			transport_sent(t, (uint64_t)n);
			continue;
		}
		e = SSL_get_error(t->ssl, n);
		if (e == SSL_ERROR_WANT_WRITE)
			break;
		if (e == SSL_ERROR_WANT_READ) {
			t->write_wants_read = 1;
			break;
		}
		transport_tls_note(t, e);
		transport_fail(t, TRANSPORT_ERROR, EPROTO);
		return -1;
	}
	return 0;
}

/* Write what is queued; wait for the socket only if it is full. */
static void transport_write(struct transport *t)
{
	size_t before = evbuffer_get_length(t->out);

	if (t->ssl) {
		if (t->handshaking || transport_write_tls(t) != 0)
			return;
	}
	while (!t->ssl && evbuffer_get_length(t->out) > 0) {
		int n = evbuffer_write(t->out, t->fd);

		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
				break;
			transport_fail(t, TRANSPORT_ERROR, errno);
			return;
		}
		if (n == 0)
			break;
		transport_sent(t, (uint64_t)n);
	}
	if (evbuffer_get_length(t->out) > 0 && !t->write_wants_read) {
		if (!t->write_waiting) {
			t->write_waiting = 1;
			event_add(t->wev, NULL);
		}
	} else if (t->write_waiting) {
		t->write_waiting = 0;
		event_del(t->wev);
	}
	if (evbuffer_get_length(t->out) <= t->write_low && before > t->write_low &&
	    t->drained_cb)
		t->drained_cb(t, t->arg); /* may free t */
}

void transport_connect_done(struct transport *t, int err)
{
	if (!t->connecting || t->dead)
		return;
	t->connecting = 0;
	if (err) {
		transport_fail(t, TRANSPORT_ERROR, err);
		return;
	}
	event_del(t->wev);
	t->write_waiting = 0;
	if (t->ssl) {
		/* Connected once the TLS handshake is done. */
		t->handshaking = 1;
		transport_handshake(t);
		return;
	}
	transport_arm_read(t);
	transport_ready(t);
}

/* The connection can carry data: what was queued goes out this turn, and
 * an outgoing connection reports itself connected. */
static void transport_ready(struct transport *t)
{
	int outgoing = t->ssl == NULL || !SSL_is_server(t->ssl);

	ACEMQ_ASSERT(!t->connecting && !t->handshaking && !t->dead);
	if (evbuffer_get_length(t->out) > 0 && !t->write_queued) {
		t->write_queued = 1;
		event_active(t->wev, EV_WRITE, 1);
	}
	if (outgoing && t->event_cb)
		t->event_cb(t, TRANSPORT_CONNECTED, 0, t->arg); /* may free t */
}

static void transport_connected(struct transport *t)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		err = errno;
	if (err == EINPROGRESS)
		return;
	transport_connect_done(t, err);
}

static void transport_write_ev(evutil_socket_t fd, short what, void *arg)
{
	struct transport *t = arg;

	t->write_queued = 0;
	if (t->dead)
		return;
	if (t->pipe) {
		size_t before = evbuffer_get_length(t->out);

		if (t->connecting) {
			transport_connect_done(t, 0); /* may free t */
			return;
		}
		if (before == 0)
			return;
		if (t->pipe_end) /* its peer is gone: dropped */
			evbuffer_drain(t->out, before);
		else
			t->pipe->output(t->pipe_arg); /* takes what its peer can */
		if (evbuffer_get_length(t->out) <= t->write_low && before > t->write_low &&
		    t->drained_cb)
			t->drained_cb(t, t->arg); /* may free t */
		return;
	}
	if (t->connecting) {
		transport_connected(t);
		return;
	}
	if (t->ssl && t->handshaking) {
		transport_handshake(t);
		return;
	}
	transport_write(t);
}

/* Output was added: write it at the end of this loop turn, in one go. */
static void transport_out_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info,
			     void *arg)
{
	struct transport *t = arg;

	if (info->n_added == 0 || t->write_queued || t->write_waiting || t->connecting ||
	    t->dead || t->handshaking || t->write_wants_read)
		return;
	t->write_queued = 1;
	event_active(t->wev, EV_WRITE, 1);
}

static struct transport *transport_make(struct event_base *base, evutil_socket_t fd)
{
	struct transport *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return NULL;
	t->fd = fd;
	t->in = evbuffer_new();
	t->out = evbuffer_new();
	t->rev = event_new(base, fd, EV_READ | EV_PERSIST, transport_read_ev, t);
	t->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, transport_write_ev, t);
	if (t->in == NULL || t->out == NULL || t->rev == NULL || t->wev == NULL ||
	    evbuffer_add_cb(t->out, transport_out_cb, t) == NULL) {
		transport_free(t);
		return NULL;
	}
	return t;
}

struct transport *transport_new(struct event_base *base, evutil_socket_t fd)
{
	if (evutil_make_socket_nonblocking(fd) != 0)
		return NULL;
	return transport_make(base, fd);
}

struct transport *transport_connect(struct event_base *base, const struct sockaddr *sa,
				    int salen)
{
	evutil_socket_t fd =
	    socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct transport *t;

	if (fd < 0)
		return NULL;
	t = transport_make(base, fd);
	if (t == NULL) {
		close(fd);
		return NULL;
	}
	t->connecting = 1;
	if (connect(fd, sa, (socklen_t)salen) != 0 && errno != EINPROGRESS) {
		int err = errno;

		transport_free(t);
		errno = err;
		return NULL;
	}
	t->write_waiting = 1;
	event_add(t->wev, NULL);
	return t;
}

struct transport *transport_pending(struct event_base *base, evutil_socket_t fd)
{
	struct transport *t;

	if (evutil_make_socket_nonblocking(fd) != 0)
		return NULL;
	t = transport_make(base, fd);
	if (t)
		t->connecting = 1;
	return t;
}

struct transport *transport_connecting_fd(struct event_base *base, evutil_socket_t fd)
{
	struct transport *t = transport_pending(base, fd);

	if (t) {
		t->write_waiting = 1;
		event_add(t->wev, NULL);
	}
	return t;
}

int transport_connecting(const struct transport *t)
{
	return t->connecting;
}

void transport_inject(struct transport *t, int what, int err)
{
	if (what == TRANSPORT_TIMEOUT) {
		if (t->event_cb && t->timeout_set && !t->dead)
			t->event_cb(t, TRANSPORT_TIMEOUT, 0, t->arg);
	} else if (!t->dead) {
		transport_fail(t, what, err);
	}
}

void transport_free(struct transport *t)
{
	if (t == NULL)
		return;
	if (t->pipe && t->pipe->gone)
		t->pipe->gone(t->pipe_arg);
	if (t->ssl) {
		/* A close_notify if the socket takes it now; never waits. */
		if (!t->dead && !t->handshaking)
			SSL_shutdown(t->ssl);
		SSL_free(t->ssl);
		ERR_clear_error();
	}
	if (t->rev)
		event_free(t->rev);
	if (t->wev)
		event_free(t->wev);
	if (t->in)
		evbuffer_free(t->in);
	if (t->out)
		evbuffer_free(t->out);
	if (t->fd >= 0)
		close(t->fd);
	free(t);
}

void transport_setcb(struct transport *t, transport_cb read, transport_cb drained,
		     transport_event_cb event, void *arg)
{
	t->read_cb = read;
	t->drained_cb = drained;
	t->event_cb = event;
	t->arg = arg;
}

int transport_tls(struct transport *t, void *ssl)
{
	ACEMQ_ASSERT(t->ssl == NULL && !t->dead);
	if (SSL_set_fd((SSL *)ssl, t->fd) != 1)
		return -1;
	t->ssl = ssl;
	if (SSL_is_server(t->ssl)) {
		t->handshaking = 1;
		transport_arm_read(t);
	}
	return 0;
}

const char *transport_error(const struct transport *t, int err)
{
	return t->tls_err[0] ? t->tls_err : strerror(err);
}

void transport_count_sent(struct transport *t, uint64_t *counter)
{
	t->sent_counter = counter;
}

void transport_bytes(const struct transport *t, uint64_t *in, uint64_t *out)
{
	*in = t->bytes_in;
	*out = t->bytes_out;
}

struct evbuffer *transport_input(struct transport *t)
{
	return t->in;
}

struct evbuffer *transport_output(struct transport *t)
{
	return t->out;
}

evutil_socket_t transport_fd(struct transport *t)
{
	return t->fd;
}

void transport_read_enable(struct transport *t)
{
	/* Input and its end go somewhere: the owner set its callbacks first. */
	ACEMQ_ASSERT(t->read_cb != NULL && t->event_cb != NULL);
	t->reading = 1;
	transport_arm_read(t);
}

void transport_read_disable(struct transport *t)
{
	t->reading = 0;
	transport_arm_read(t);
}

void transport_set_read_high(struct transport *t, size_t high)
{
	t->read_high = high;
	transport_input_consumed(t);
}

void transport_set_write_low(struct transport *t, size_t low)
{
	t->write_low = low;
}

void transport_set_read_timeout(struct transport *t, long ms)
{
	ACEMQ_ASSERT(ms >= 0);
	t->timeout_set = ms > 0;
	t->read_timeout.tv_sec = ms / 1000;
	t->read_timeout.tv_usec = (ms % 1000) * 1000;
	transport_arm_read(t);
}

void transport_input_consumed(struct transport *t)
{
	if (t->full && (!t->read_high || evbuffer_get_length(t->in) < t->read_high)) {
		t->full = 0;
		transport_arm_read(t);
		if (t->pipe && !t->pipe_end && t->pipe->consumed)
			t->pipe->consumed(t->pipe_arg);
	}
}

/* ---- pipes -------------------------------------------------------------- */

struct transport *transport_pipe(struct event_base *base, const struct transport_pipe_ops *ops,
				 void *arg)
{
	struct transport *t = transport_make(base, -1);

	if (t == NULL)
		return NULL;
	t->pipe = ops;
	t->pipe_arg = arg;
	/* Connected at once, reported later in this loop turn. */
	t->connecting = 1;
	t->write_queued = 1;
	event_active(t->wev, EV_WRITE, 1);
	return t;
}

void transport_pipe_fed(struct transport *t)
{
	ACEMQ_ASSERT(t->pipe != NULL);
	if (t->read_high && evbuffer_get_length(t->in) >= t->read_high)
		t->full = 1;
	transport_arm_read(t);
}

int transport_pipe_full(const struct transport *t)
{
	return t->read_high && evbuffer_get_length(t->in) >= t->read_high;
}

void transport_pipe_kick(struct transport *t)
{
	ACEMQ_ASSERT(t->pipe != NULL);
	if (!t->write_queued && !t->dead && evbuffer_get_length(t->out)) {
		t->write_queued = 1;
		event_active(t->wev, EV_WRITE, 1);
	}
}

void transport_pipe_end(struct transport *t, int what, int err)
{
	ACEMQ_ASSERT(t->pipe != NULL);
	if (t->pipe_end || t->dead)
		return;
	t->pipe_end = what;
	t->pipe_end_err = err;
	event_active(t->rev, EV_READ, 1);
}

void *transport_pipe_peer(const struct transport *t, const struct transport_pipe_ops *ops)
{
	return t->pipe == ops ? t->pipe_arg : NULL;
}

void transport_pipe_count(struct transport *t, uint64_t in, uint64_t out)
{
	t->bytes_in += in;
	transport_sent(t, out);
}
