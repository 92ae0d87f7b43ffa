/* listener: the client-facing sockets, handing accepted connections to workers. */
#include "listener.h"

#include "limits.h"

#include "config.h"
#include "log.h"
#include "worker.h"

#include <event2/listener.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LISTENER_MAX CONFIG_MAX_LISTEN

static struct evconnlistener *listener_socks[LISTENER_MAX];
static int listener_count;
static struct worker *listener_workers;
static int listener_nworkers;
static int listener_next;
static long listener_max_connections;

static unsigned long listener_open_connections(void)
{
	unsigned long n = 0;
	int i;

	for (i = 0; i < listener_nworkers; i++)
		n += __atomic_load_n(&listener_workers[i].nsessions, __ATOMIC_RELAXED);
	return n;
}

static void listener_accept_cb(struct evconnlistener *l, evutil_socket_t fd,
			       struct sockaddr *sa, int salen, void *arg)
{
	struct worker *w;

	/* Before a word of AMQP: the socket is closed, as the broker does
	 * when it is out of connections. */
	if (listener_open_connections() >= (unsigned long)listener_max_connections) {
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
	if (worker_assign(w, fd, sa, salen, arg != NULL) != 0)
		close(fd);
}

static void listener_error_cb(struct evconnlistener *l, void *arg)
{
	int err = EVUTIL_SOCKET_ERROR();

	log_warning("accept failed: %s", evutil_socket_error_to_string(err));
}

int listener_open(struct event_base *base, char *const *addrs, int naddrs, int tls,
		  struct worker *workers, int nworkers, long max_connections)
{
	int i;

	listener_workers = workers;
	listener_nworkers = nworkers;
	listener_max_connections = max_connections;
	for (i = 0; i < naddrs && listener_count < LISTENER_MAX; i++) {
		struct addrinfo hints, *res = NULL;
		char host[256], port[16];
		int p;

		if (config_addr_split(addrs[i], host, sizeof(host), &p) != 0) {
			log_error("listen %s: not HOST:PORT", addrs[i]);
			return -1;
		}
		snprintf(port, sizeof(port), "%d", p);
		memset(&hints, 0, sizeof(hints));
		hints.ai_socktype = SOCK_STREAM;
		hints.ai_flags = AI_PASSIVE;
		if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL) {
			log_error("listen %s: cannot resolve", addrs[i]);
			return -1;
		}
		listener_socks[listener_count] = evconnlistener_new_bind(
		    base, listener_accept_cb, tls ? (void *)listener_socks : NULL,
		    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC, 1024,
		    res->ai_addr, (int)res->ai_addrlen);
		freeaddrinfo(res);
		if (listener_socks[listener_count] == NULL) {
			int err = EVUTIL_SOCKET_ERROR();

			log_error("listen %s: %s", addrs[i],
				  evutil_socket_error_to_string(err));
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
}
