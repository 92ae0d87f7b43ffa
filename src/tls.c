/* tls: the TLS contexts of the client listener (amqps) and of the broker
 * connections, built from the settings and rebuilt on reload; connections
 * already open keep the context they started with. */
#include "tls.h"

#include "config.h"
#include "log.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TLS 1.2 ciphers: forward secrecy and AEAD only (1.3's are all fine). */
#define TLS_CIPHERS "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20"

enum tls_verify { TLS_VERIFY_NONE, TLS_VERIFY_OPTIONAL, TLS_VERIFY_REQUIRED };

static struct {
	char *cert, *key, *ca;
	enum tls_verify verify;
	int server; /* a TLS listener is configured */
	int upstream;
	char *up_ca, *up_cert, *up_key, *up_name;
} tls_set;

static pthread_mutex_t tls_lock = PTHREAD_MUTEX_INITIALIZER;
static SSL_CTX *tls_server_ctx, *tls_client_ctx; /* under tls_lock */

const char *tls_error_text(char *buf, size_t len)
{
	unsigned long e = ERR_get_error(), last = e;

	while (e != 0) {
		last = e;
		e = ERR_get_error();
	}
	if (last == 0)
		snprintf(buf, len, "no detail");
	else
		ERR_error_string_n(last, buf, len);
	return buf;
}

static char *tls_dup(const struct config *cfg, enum config_id id)
{
	const char *v = config_str(cfg, id);

	return v && v[0] ? strdup(v) : NULL;
}

/* A context with what both sides share: TLS 1.2 at least, the ciphers,
 * writes that may be partial and move between retries. */
static SSL_CTX *tls_ctx_new(const SSL_METHOD *method, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(method);
	char why[256];

	if (ctx == NULL) {
		snprintf(err, errlen, "TLS: %s", tls_error_text(why, sizeof(why)));
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_cipher_list(ctx, TLS_CIPHERS);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
				  SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
				  SSL_MODE_RELEASE_BUFFERS);
	return ctx;
}

static SSL_CTX *tls_server_build(char *err, size_t errlen)
{
	SSL_CTX *ctx = tls_ctx_new(TLS_server_method(), err, errlen);
	char why[256];

	if (ctx == NULL)
		return NULL;
	/* A peer that closes without close_notify is an end, not an error:
	 * AMQP's own framing shows a cut message. */
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
				     SSL_OP_IGNORE_UNEXPECTED_EOF);
	if (SSL_CTX_use_certificate_chain_file(ctx, tls_set.cert) != 1) {
		snprintf(err, errlen, "tls_cert %s: %s", tls_set.cert,
			 tls_error_text(why, sizeof(why)));
		goto fail;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, tls_set.key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1) {
		snprintf(err, errlen, "tls_key %s: %s", tls_set.key,
			 tls_error_text(why, sizeof(why)));
		goto fail;
	}
	if (tls_set.verify != TLS_VERIFY_NONE) {
		STACK_OF(X509_NAME) * names;

		if (tls_set.ca == NULL ||
		    SSL_CTX_load_verify_locations(ctx, tls_set.ca, NULL) != 1) {
			snprintf(err, errlen, "tls_ca %s: %s",
				 tls_set.ca ? tls_set.ca : "(not set)",
				 tls_set.ca ? tls_error_text(why, sizeof(why))
					    : "tls_verify_client needs it");
			goto fail;
		}
		if ((names = SSL_load_client_CA_file(tls_set.ca)) != NULL)
			SSL_CTX_set_client_CA_list(ctx, names);
		SSL_CTX_set_verify(ctx,
				   SSL_VERIFY_PEER | (tls_set.verify == TLS_VERIFY_REQUIRED
							  ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT
							  : 0),
				   NULL);
	}
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

static SSL_CTX *tls_client_build(char *err, size_t errlen)
{
	SSL_CTX *ctx = tls_ctx_new(TLS_client_method(), err, errlen);
	char why[256];

	if (ctx == NULL)
		return NULL;
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	if ((tls_set.up_ca ? SSL_CTX_load_verify_locations(ctx, tls_set.up_ca, NULL)
			   : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
		snprintf(err, errlen, "upstream_tls_ca %s: %s",
			 tls_set.up_ca ? tls_set.up_ca : "(system)",
			 tls_error_text(why, sizeof(why)));
		goto fail;
	}
	if (tls_set.up_cert &&
	    (SSL_CTX_use_certificate_chain_file(ctx, tls_set.up_cert) != 1 ||
	     SSL_CTX_use_PrivateKey_file(ctx, tls_set.up_key ? tls_set.up_key : tls_set.up_cert,
					 SSL_FILETYPE_PEM) != 1 ||
	     SSL_CTX_check_private_key(ctx) != 1)) {
		snprintf(err, errlen, "upstream_tls_cert %s: %s", tls_set.up_cert,
			 tls_error_text(why, sizeof(why)));
		goto fail;
	}
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

/* Build both contexts; swap them in only when both could be built. */
static int tls_build(char *err, size_t errlen)
{
	SSL_CTX *server = NULL, *client = NULL, *old_server, *old_client;

	if (tls_set.server && (server = tls_server_build(err, errlen)) == NULL)
		return -1;
	if (tls_set.upstream && (client = tls_client_build(err, errlen)) == NULL) {
		SSL_CTX_free(server);
		return -1;
	}
	pthread_mutex_lock(&tls_lock);
	old_server = tls_server_ctx;
	old_client = tls_client_ctx;
	tls_server_ctx = server;
	tls_client_ctx = client;
	pthread_mutex_unlock(&tls_lock);
	/* Open connections hold their own references. */
	SSL_CTX_free(old_server);
	SSL_CTX_free(old_client);
	return 0;
}

int tls_configure(const struct config *cfg, char *err, size_t errlen)
{
	const char *verify = config_str(cfg, CFG_TLS_VERIFY_CLIENT);

	tls_set.server = cfg->v[CFG_LISTEN_TLS].nlist > 0;
	tls_set.cert = tls_dup(cfg, CFG_TLS_CERT);
	tls_set.key = tls_dup(cfg, CFG_TLS_KEY);
	tls_set.ca = tls_dup(cfg, CFG_TLS_CA);
	tls_set.upstream = (int)config_num(cfg, CFG_UPSTREAM_TLS);
	tls_set.up_ca = tls_dup(cfg, CFG_UPSTREAM_TLS_CA);
	tls_set.up_cert = tls_dup(cfg, CFG_UPSTREAM_TLS_CERT);
	tls_set.up_key = tls_dup(cfg, CFG_UPSTREAM_TLS_KEY);
	tls_set.up_name = tls_dup(cfg, CFG_UPSTREAM_TLS_NAME);
	if (strcmp(verify, "none") == 0) {
		tls_set.verify = TLS_VERIFY_NONE;
	} else if (strcmp(verify, "optional") == 0) {
		tls_set.verify = TLS_VERIFY_OPTIONAL;
	} else if (strcmp(verify, "required") == 0) {
		tls_set.verify = TLS_VERIFY_REQUIRED;
	} else {
		snprintf(err, errlen,
			 "tls_verify_client: '%s' is not none, optional or required", verify);
		return -1;
	}
	if (tls_set.server && (tls_set.cert == NULL || tls_set.key == NULL)) {
		snprintf(err, errlen, "listen_tls needs tls_cert and tls_key");
		return -1;
	}
	return tls_build(err, errlen);
}

int tls_reload(char *err, size_t errlen)
{
	if (!tls_set.server && !tls_set.upstream)
		return 0;
	return tls_build(err, errlen);
}

void tls_free(void)
{
	pthread_mutex_lock(&tls_lock);
	SSL_CTX_free(tls_server_ctx);
	SSL_CTX_free(tls_client_ctx);
	tls_server_ctx = tls_client_ctx = NULL;
	pthread_mutex_unlock(&tls_lock);
	free(tls_set.cert);
	free(tls_set.key);
	free(tls_set.ca);
	free(tls_set.up_ca);
	free(tls_set.up_cert);
	free(tls_set.up_key);
	free(tls_set.up_name);
	memset(&tls_set, 0, sizeof(tls_set));
}

SSL *tls_server_new(void)
{
	SSL *ssl = NULL;

	pthread_mutex_lock(&tls_lock);
	if (tls_server_ctx)
		ssl = SSL_new(tls_server_ctx);
	pthread_mutex_unlock(&tls_lock);
	if (ssl)
		SSL_set_accept_state(ssl);
	return ssl;
}

int tls_upstream(void)
{
	return tls_set.upstream;
}

const char *tls_upstream_name(void)
{
	return tls_set.up_name;
}

const char *tls_upstream_ca(void)
{
	return tls_set.up_ca;
}

const char *tls_upstream_cert(void)
{
	return tls_set.up_cert;
}

const char *tls_upstream_key(void)
{
	return tls_set.up_key ? tls_set.up_key : tls_set.up_cert;
}

SSL *tls_client_new(const char *host)
{
	SSL *ssl = NULL;

	pthread_mutex_lock(&tls_lock);
	if (tls_client_ctx)
		ssl = SSL_new(tls_client_ctx);
	pthread_mutex_unlock(&tls_lock);
	if (ssl == NULL)
		return NULL;
	SSL_set_connect_state(ssl);
	if (host && host[0]) {
		/* SNI for a name; the certificate must carry the name or address. */
		unsigned char ip[16];
		int is_ip =
		    inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;

		if (!is_ip)
			SSL_set_tlsext_host_name(ssl, host);
		if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) != 1
			  : SSL_set1_host(ssl, host) != 1) {
			SSL_free(ssl);
			return NULL;
		}
	}
	return ssl;
}
