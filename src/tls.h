/* tls: the TLS contexts of the client listener (amqps) and of the broker
 * connections, built from the settings and rebuilt on reload; connections
 * already open keep the context they started with. */
#ifndef ACEMQ_TLS_H
#define ACEMQ_TLS_H

#include <openssl/ssl.h>
#include <stddef.h>

struct config;

/* Build the contexts the settings ask for. 0, or -1 with why in err. */
int tls_configure(const struct config *cfg, char *err, size_t errlen);
/* Read the certificates and keys again (SIGHUP); on any error the
 * contexts in force are kept. 0, or -1 with why in err. */
int tls_reload(char *err, size_t errlen);
void tls_free(void);

/* A server-side SSL for an accepted client socket; NULL when no TLS
 * listener is configured or out of memory. */
SSL *tls_server_new(void);
/* Whether the broker connections use TLS, and a client-side SSL for one
 * to host (SNI and the name its certificate must carry). */
int tls_upstream(void);
SSL *tls_client_new(const char *host);
/* The broker name to verify (upstream_tls_name), or NULL: the address's. */
const char *tls_upstream_name(void);
/* The settings the engine's rabbitmq-c connections need. */
const char *tls_upstream_ca(void);
const char *tls_upstream_cert(void);
const char *tls_upstream_key(void);

/* The last OpenSSL error of this thread as text (into buf). */
const char *tls_error_text(char *buf, size_t len);

#endif
