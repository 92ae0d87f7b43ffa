/* listener: the client-facing sockets, handing accepted connections to
 * workers; max_connections decided at the accept; a spare descriptor kept
 * for the moments the process runs out of them. */
#include "listener.h"

#include "limits.h"

#include "config.h"
#include "log.h"
#include "worker.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define LISTENER_MAX CONFIG_MAX_LISTEN
/* Listeners that cannot take a connection at all rest this long. */
#define LISTENER_PAUSE_MS 100

static struct evconnlistener *listener_socks[LISTENER_MAX];
static int listener_count;
static struct worker *listener_workers;
static int listener_nworkers;
static int listener_next;
static long listener_max_connections;
static struct event *listener_pause;
/* Main thread only: the spare descriptor and whether an episode of running
 * out of descriptors is on. */
static int listener_spare = -1;
static int listener_starved;

/* Descriptors that must be free besides the spare for an episode of
 * running out to be over (no flapping at the last one). */
#define LISTENER_HEADROOM 8

static void listener_spare_take(void)
{
	if (listener_spare < 0)
		listener_spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void listener_starving(int err)
{
	if (!listener_starved)
		log_warning("out of file descriptors (%s): new connections are closed at once "
			    "until some are free",
			    strerror(err));
	listener_starved = 1;
}

enum listener_shed_result listener_shed(int lfd, int err)
{
	struct pollfd pfd = {.fd = lfd, .events = POLLIN};
	int fd, e;

	if (err != EMFILE && err != ENFILE)
		return LISTENER_SHED_OTHER;
	listener_starving(err);
	/* Linux takes the new descriptor before it looks at the queue: at
	 * the limit, the accept that finds no client waiting fails with
	 * EMFILE too. The spare is given up only for a client that is
	 * there: in the moment it is closed a worker may take its number
	 * (a broker socket), and then no client could be shed at all. */
	if (poll(&pfd, 1, 0) == 0)
		return LISTENER_SHED_NONE;
	if (listener_spare < 0) {
		listener_spare_take();
		return LISTENER_SHED_PAUSE;
	}
	close(listener_spare);
	listener_spare = -1;
	fd = accept(lfd, NULL, NULL);
	e = errno;
	if (fd >= 0)
		close(fd);
	listener_spare_take();
	if (fd >= 0)
		return LISTENER_SHED_CLOSED;
	return e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED
		   ? LISTENER_SHED_NONE
		   : LISTENER_SHED_PAUSE;
}

/* Whether LISTENER_HEADROOM more descriptors could be opened now. */
static int listener_headroom(void)
{
	int fds[LISTENER_HEADROOM], n, ok = 1;

	for (n = 0; n < LISTENER_HEADROOM; n++)
		if ((fds[n] = dup(listener_spare)) < 0) {
			ok = 0;
			break;
		}
	while (n > 0)
		close(fds[--n]);
	return ok;
}

int listener_accepted(int fd)
{
	if (listener_spare < 0) {
		listener_spare_take();
		if (listener_spare < 0) {
			/* Another thread took the descriptor the spare gave up:
			 * the spare comes first. */
			close(fd);
			listener_spare_take();
			listener_starving(EMFILE);
			return -1;
		}
	}
	if (listener_starved && listener_headroom()) {
		log_info("file descriptors are free again: accepting connections");
		listener_starved = 0;
	}
	return 0;
}

static void listener_accept_cb(struct evconnlistener *l, evutil_socket_t fd,
			       struct sockaddr *sa, int salen, void *arg)
{
	struct worker *w;

	if (listener_accepted(fd) != 0) {
		__atomic_add_fetch(&listener_workers[0].stats.refused_no_descriptors, 1,
				   __ATOMIC_RELAXED);
		return;
	}
	/* Counted here, where the accept is decided, and given back when the
	 * session ends: a burst cannot overshoot. Before a word of AMQP: the
	 * socket is closed, as the broker does when it is out of
	 * connections. */
	if (limits_connection_enter(listener_max_connections) != 0) {
		char what[96];

		snprintf(what, sizeof(what), "%ld connections open", listener_max_connections);
		limits_refused(LIMITS_MAX_CONNECTIONS, what);
		__atomic_add_fetch(&listener_workers[0].stats.refused_max_connections, 1,
				   __ATOMIC_RELAXED);
		close(fd);
		return;
	}
	limits_admitted(LIMITS_MAX_CONNECTIONS);
	w = &listener_workers[listener_next];
	listener_next = (listener_next + 1) % listener_nworkers;
	if (worker_assign(w, fd, sa, salen, arg != NULL) != 0) {
		close(fd);
		limits_connection_leave();
	}
}

static void listener_resume_cb(evutil_socket_t fd, short what, void *arg)
{
	int i;

	for (i = 0; i < listener_count; i++)
		evconnlistener_enable(listener_socks[i]);
}

static void listener_error_cb(struct evconnlistener *l, void *arg)
{
	int err = EVUTIL_SOCKET_ERROR();
	enum listener_shed_result rc = listener_shed(evconnlistener_get_fd(l), err);

	if (rc == LISTENER_SHED_CLOSED)
		__atomic_add_fetch(&listener_workers[0].stats.refused_no_descriptors, 1,
				   __ATOMIC_RELAXED);
	if (rc == LISTENER_SHED_CLOSED || rc == LISTENER_SHED_NONE)
		return;
	if (rc == LISTENER_SHED_OTHER)
		log_warning("accept failed: %s", evutil_socket_error_to_string(err));
	/* Rather than spin on a connection none can take: rest a moment. */
	if (listener_pause) {
		struct timeval tv = {0, LISTENER_PAUSE_MS * 1000};
		int i;

		for (i = 0; i < listener_count; i++)
			evconnlistener_disable(listener_socks[i]);
		evtimer_add(listener_pause, &tv);
	}
}

static int listener_resolve(const char *addr, struct addrinfo **res, char *err, int errlen)
{
	struct addrinfo hints;
	char host[256], port[16];
	int p, rc;

	if (config_addr_split(addr, host, sizeof(host), &p) != 0) {
		snprintf(err, (size_t)errlen, "listen %s: not HOST:PORT", addr);
		return -1;
	}
	snprintf(port, sizeof(port), "%d", p);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	*res = NULL;
	if ((rc = getaddrinfo(host, port, &hints, res)) != 0 || *res == NULL) {
		snprintf(err, (size_t)errlen, "listen %s: cannot resolve: %s", addr,
			 rc ? gai_strerror(rc) : "no address");
		return -1;
	}
	return 0;
}

int listener_check(const char *addr, char *err, int errlen)
{
	struct addrinfo *res;

	if (listener_resolve(addr, &res, err, errlen) != 0)
		return -1;
	freeaddrinfo(res);
	return 0;
}

int listener_open(struct event_base *base, char *const *addrs, int naddrs, int tls,
		  struct worker *workers, int nworkers, long max_connections)
{
	int i;

	listener_workers = workers;
	listener_nworkers = nworkers;
	listener_max_connections = max_connections;
	listener_spare_take();
	if (listener_pause == NULL &&
	    (listener_pause = evtimer_new(base, listener_resume_cb, NULL)) == NULL)
		return -1;
	for (i = 0; i < naddrs && listener_count < LISTENER_MAX; i++) {
		struct addrinfo *res = NULL;
		char err[512];

		if (listener_resolve(addrs[i], &res, err, sizeof(err)) != 0) {
			log_error("%s", err);
			return -1;
		}
		listener_socks[listener_count] = evconnlistener_new_bind(
		    base, listener_accept_cb, tls ? (void *)listener_socks : NULL,
		    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC, 1024,
		    res->ai_addr, (int)res->ai_addrlen);
		freeaddrinfo(res);
		if (listener_socks[listener_count] == NULL) {
			int e = EVUTIL_SOCKET_ERROR();

			log_error("listen %s: %s", addrs[i], evutil_socket_error_to_string(e));
			return -1;
		}
		evconnlistener_set_error_cb(listener_socks[listener_count], listener_error_cb);
		log_info("listening on %s%s", addrs[i], tls ? " (TLS)" : "");
		listener_count++;
	}
	return 0;
}

void listener_close(void)
{
	int i;

	for (i = 0; i < listener_count; i++)
		evconnlistener_free(listener_socks[i]);
	listener_count = 0;
	if (listener_pause)
		event_free(listener_pause);
	listener_pause = NULL;
}
