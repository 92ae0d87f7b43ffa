/* limits: connection and channel limits the workers share: client
 * connections open, open connections per vhost, channels per connection,
 * and refusals logged once per episode. */
#ifndef ACEMQ_LIMITS_H
#define ACEMQ_LIMITS_H

enum limits_reason {
	LIMITS_MAX_CONNECTIONS,
	LIMITS_MAX_CONNECTIONS_PER_VHOST,
	LIMITS_MAX_CHANNELS,
	LIMITS_CONNECTION_RATE, /* a vhost's rules' limits.connections_per_s */
	LIMITS_REASONS
};

/* 0: no limit. */
void limits_init(long max_connections_per_vhost, long max_channels);
long limits_max_channels(void);
long limits_max_per_vhost(void);
/* The listener admits a client connection: 0 when fewer than max are
 * open (it is counted at once), -1 at max. Exact under any burst: counted
 * where the accept is decided, not where a worker takes the socket. */
int limits_connection_enter(long max);
/* A counted connection ended (its session went, or it never got one). */
void limits_connection_leave(void);
long limits_connections_open(void);
/* A connection opens vhost: 0, or -1 when the vhost is at its limit (the
 * refusal is logged once per episode). */
int limits_vhost_enter(const char *vhost);
void limits_vhost_leave(const char *vhost);
/* Vhosts with a connection counted against max_connections_per_vhost
 * (an entry goes with its vhost's last connection). */
long limits_vhosts_tracked(void);
/* A refusal (logged at the start of an episode) or an admission (ends
 * the episode of that reason). */
void limits_refused(enum limits_reason r, const char *what);
void limits_admitted(enum limits_reason r);

#endif
