/* fuzz_session_frames: the canned frames of the session fuzzer's script. */
#ifndef ACEMQ_FUZZ_SESSION_FRAMES_H
#define ACEMQ_FUZZ_SESSION_FRAMES_H

#include <amqp.h>
#include <stdint.h>

struct evbuffer;

/* The payload the claim store holds, for references to find. */
#define FUZZ_CLAIM_KEY "0123456789abcdef0123456789abcdef"

/* A new input: delivery tags and message-ids start again. */
void fuzz_frames_reset(void);
/* Append frame k (details p) as the client, or as the broker, sends it. */
void fuzz_client_frame(struct evbuffer *b, uint8_t k, uint8_t p);
void fuzz_broker_frame(struct evbuffer *b, uint8_t k, uint8_t p);
amqp_bytes_t fuzz_str(const char *s);

#endif
