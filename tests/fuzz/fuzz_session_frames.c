/* fuzz_session_frames: the canned, well-formed frames the session fuzzer's
 * script sends as the client (OP_CLIENT_FRAME) and as the broker
 * (OP_BROKER_FRAME): k picks the frame, p its channel and details. */
#include "fuzz_session_frames.h"

#include "amqp/content.h"
#include "amqp/method.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>

static uint64_t fuzz_deliver_tag[8]; /* per channel (mod 8): the broker's last */
static unsigned fuzz_next_id;        /* message-ids never used before in this input */

void fuzz_frames_reset(void)
{
	memset(fuzz_deliver_tag, 0, sizeof(fuzz_deliver_tag));
	fuzz_next_id = 0;
}

amqp_bytes_t fuzz_str(const char *s)
{
	return amqp_cstring_bytes(s);
}

static void fuzz_body(struct evbuffer *b, uint16_t ch, uint8_t p, const char *rk)
{
	amqp_basic_properties_t props = {0};
	amqp_table_entry_t e[3];
	size_t len = (size_t)p * 97, i;
	char id[16];
	struct evbuffer *body = evbuffer_new();

	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG;
	props.content_type = fuzz_str("text/plain");
	if (p & 1) {
		props._flags |= AMQP_BASIC_REPLY_TO_FLAG;
		props.reply_to = fuzz_str(p & 2 ? "amq.rabbitmq.reply-to" : "replies");
	}
	props.headers.entries = e;
	if (p & 0x80) {
		/* A message-id from a few: duplicates for the idempotency rule,
		 * and the same in the publish-dedup header; or (p & 0x40, with
		 * no claim check) one of its own, claimed every time. */
		static const char *const ids[4] = {"m0", "m1", "m2", "m3"};
		amqp_table_entry_t *d = &e[props.headers.num_entries++];

		props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
		props.message_id = fuzz_str(ids[p & 3]);
		if ((p & 0x70) == 0x40) {
			snprintf(id, sizeof(id), "u%u", fuzz_next_id++);
			props.message_id = fuzz_str(id);
		}
		d->key = fuzz_str("x-deduplication-header");
		d->value.kind = AMQP_FIELD_KIND_UTF8;
		d->value.value.bytes = props.message_id;
	}
	if (p & 4) {
		amqp_table_entry_t *r = &e[props.headers.num_entries++];

		r->key = fuzz_str("acemq-reply-to");
		r->value.kind = AMQP_FIELD_KIND_UTF8;
		r->value.value.bytes = fuzz_str("other");
		if (p & 8) {
			/* A delay for the schedule rule: good, or not a number. */
			amqp_table_entry_t *d = &e[props.headers.num_entries++];

			d->key = fuzz_str("x-delay");
			if (p & 2) {
				d->value.kind = AMQP_FIELD_KIND_I32;
				d->value.value.i32 = 1500;
			} else {
				d->value.kind = AMQP_FIELD_KIND_UTF8;
				d->value.value.bytes = fuzz_str(p & 1 ? "soon" : "-3");
			}
		}
		props._flags |= AMQP_BASIC_HEADERS_FLAG;
	}
	if ((p & 0x30) == 0x30) {
		/* A claim check: to the stored payload, a missing one, or a
		 * key the store never issues; or an inline-framed body. */
		static const uint8_t ref[3] = {0xAC, 0x01, 0x01}, inl[3] = {0xAC, 0x01, 0x00};

		evbuffer_add(body, p & 0x40 ? inl : ref, 3);
		evbuffer_add(body,
			     p & 2   ? FUZZ_CLAIM_KEY
			     : p & 4 ? "../../etc/passwd"
				     : "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0",
			     p & 2   ? 32
			     : p & 4 ? 16
				     : 32);
		len = evbuffer_get_length(body);
	} else {
		for (i = 0; i < len; i++)
			evbuffer_add(body, "x", 1);
	}
	content_header_write(b, ch, 60, len, &props);
	content_body_write(b, ch, body, p & 8 ? 4096 : 131072);
	evbuffer_free(body);
	(void)rk;
}

void fuzz_client_frame(struct evbuffer *b, uint8_t k, uint8_t p)
{
	uint16_t ch = (uint16_t)(1 + p % 3);
	static const uint8_t header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
	static const uint8_t heartbeat[8] = {8, 0, 0, 0, 0, 0, 0, 0xCE};

	switch (k % 22) {
	case 0:
		evbuffer_add(b, header, 8);
		break;
	case 1: {
		amqp_connection_start_ok_t m = {.mechanism = fuzz_str("PLAIN"),
						.response = {12, "\0guest\0guest"},
						.locale = fuzz_str("en_US")};
		method_write(b, 0, AMQP_CONNECTION_START_OK_METHOD, &m);
		break;
	}
	case 2: {
		amqp_connection_tune_ok_t m = {2047, p & 1 ? 4096 : 131072, (uint16_t)(p & 2)};
		method_write(b, 0, AMQP_CONNECTION_TUNE_OK_METHOD, &m);
		break;
	}
	case 3: {
		amqp_connection_open_t m = {.virtual_host = fuzz_str(p & 1     ? "plain"
								     : (p & 4) ? "closer"
									       : "/"),
					    .capabilities = fuzz_str("")};
		method_write(b, 0, AMQP_CONNECTION_OPEN_METHOD, &m);
		break;
	}
	case 4: {
		amqp_channel_open_t m = {.out_of_band = fuzz_str("")};
		method_write(b, ch, AMQP_CHANNEL_OPEN_METHOD, &m);
		break;
	}
	case 5: {
		amqp_confirm_select_t m = {0};
		method_write(b, ch, AMQP_CONFIRM_SELECT_METHOD, &m);
		break;
	}
	case 6: {
		const char *rk = p & 16 ? "stream.x" : "rk";
		amqp_basic_publish_t m = {.exchange = fuzz_str(""),
					  .routing_key = fuzz_str(rk),
					  .mandatory = (p & 32) != 0};
		method_write(b, ch, AMQP_BASIC_PUBLISH_METHOD, &m);
		if (!(p & 64))
			fuzz_body(b, ch, p, rk);
		break;
	}
	case 7: {
		amqp_basic_consume_t m = {.queue = fuzz_str("q"),
					  .consumer_tag = fuzz_str(p & 1 ? "ctag" : ""),
					  .no_ack = (p & 2) != 0};
		method_write(b, ch, AMQP_BASIC_CONSUME_METHOD, &m);
		break;
	}
	case 8:
		method_write_basic_ack(b, ch, p >> 2, p & 1);
		break;
	case 9: {
		amqp_basic_nack_t m = {p >> 2, p & 1, (p & 2) != 0};
		method_write(b, ch, AMQP_BASIC_NACK_METHOD, &m);
		break;
	}
	case 10: {
		amqp_basic_reject_t m = {p >> 2, p & 1};
		method_write(b, ch, AMQP_BASIC_REJECT_METHOD, &m);
		break;
	}
	case 11: {
		amqp_basic_get_t m = {.queue = fuzz_str("q"), .no_ack = p & 1};
		method_write(b, ch, AMQP_BASIC_GET_METHOD, &m);
		break;
	}
	case 12:
		method_write_channel_close(b, ch, 200, "bye", 0, 0);
		break;
	case 13:
		method_write_connection_close(b, 200, "bye", 0, 0);
		break;
	case 14:
		method_write(b, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
			     &(amqp_connection_close_ok_t){0});
		break;
	case 15:
		evbuffer_add(b, heartbeat, 8);
		break;
	case 16:
		method_write(b, ch, AMQP_CHANNEL_CLOSE_OK_METHOD,
			     &(amqp_channel_close_ok_t){0});
		break;
	case 17: {
		/* connection.update-secret (10/70): newer than the codec. */
		static const uint8_t f[] = {1,  0, 0, 0, 0, 0,   11, 0,   10,  0,
					    70, 0, 0, 0, 1, 's', 1,  'r', 0xCE};
		evbuffer_add(b, f, sizeof(f));
		break;
	}
	case 18:
		/* A body with no method before it. */
		fuzz_body(b, ch, p | 8, "rk");
		break;
	case 20: {
		/* A prefetch the idempotency rule asks ahead for (100 or more),
		 * a small one, or one for the channel. */
		amqp_basic_qos_t m = {0, (uint16_t)(p & 0x40 ? p & 3 : 100 + (p & 7)),
				      (p & 0x80) != 0};
		method_write(b, ch, AMQP_BASIC_QOS_METHOD, &m);
		break;
	}
	case 21: {
		amqp_basic_cancel_t m = {.consumer_tag = fuzz_str(p & 1 ? "ctag" : "other"),
					 .nowait = (p & 2) != 0};
		method_write(b, ch, AMQP_BASIC_CANCEL_METHOD, &m);
		break;
	}
	default: {
		amqp_basic_recover_t m = {p & 1};
		method_write(b, ch, AMQP_BASIC_RECOVER_METHOD, &m);
		break;
	}
	}
}

void fuzz_broker_frame(struct evbuffer *b, uint8_t k, uint8_t p)
{
	uint16_t ch = (uint16_t)(1 + p % 3);
	static const uint8_t heartbeat[8] = {8, 0, 0, 0, 0, 0, 0, 0xCE};

	switch (k % 17) {
	case 0: {
		amqp_connection_start_t m = {.version_major = 0,
					     .version_minor = 9,
					     .mechanisms = fuzz_str("PLAIN AMQPLAIN"),
					     .locales = fuzz_str("en_US")};
		method_write(b, 0, AMQP_CONNECTION_START_METHOD, &m);
		break;
	}
	case 1: {
		amqp_connection_tune_t m = {2047, p & 1 ? 4096 : 131072, (uint16_t)(p & 2)};
		method_write(b, 0, AMQP_CONNECTION_TUNE_METHOD, &m);
		break;
	}
	case 2: {
		amqp_connection_open_ok_t m = {.known_hosts = fuzz_str("")};
		method_write(b, 0, AMQP_CONNECTION_OPEN_OK_METHOD, &m);
		break;
	}
	case 3: {
		amqp_channel_open_ok_t m = {.channel_id = fuzz_str("")};
		method_write(b, ch, AMQP_CHANNEL_OPEN_OK_METHOD, &m);
		break;
	}
	case 4:
		method_write(b, ch, AMQP_CONFIRM_SELECT_OK_METHOD,
			     &(amqp_confirm_select_ok_t){0});
		break;
	case 5: {
		amqp_basic_deliver_t m = {.consumer_tag = fuzz_str(p & 4 ? "ctag" : "other"),
					  .delivery_tag = ++fuzz_deliver_tag[ch % 8],
					  .exchange = fuzz_str(""),
					  .routing_key = fuzz_str("q")};
		method_write(b, ch, AMQP_BASIC_DELIVER_METHOD, &m);
		fuzz_body(b, ch, p, "q");
		break;
	}
	case 6: {
		amqp_basic_get_ok_t m = {.delivery_tag = ++fuzz_deliver_tag[ch % 8],
					 .exchange = fuzz_str(""),
					 .routing_key = fuzz_str("q")};
		method_write(b, ch, AMQP_BASIC_GET_OK_METHOD, &m);
		fuzz_body(b, ch, p, "q");
		break;
	}
	case 7:
		method_write_basic_ack(b, ch, p >> 2, p & 1);
		break;
	case 8: {
		amqp_basic_nack_t m = {p >> 2, p & 1, 0};
		method_write(b, ch, AMQP_BASIC_NACK_METHOD, &m);
		break;
	}
	case 9: {
		amqp_basic_return_t m = {.reply_code = 312,
					 .reply_text = fuzz_str("NO_ROUTE"),
					 .exchange = fuzz_str(""),
					 .routing_key = fuzz_str("rk")};
		method_write(b, ch, AMQP_BASIC_RETURN_METHOD, &m);
		fuzz_body(b, ch, p, "rk");
		break;
	}
	case 10: {
		amqp_basic_consume_ok_t m = {.consumer_tag = fuzz_str("ctag")};
		method_write(b, ch, AMQP_BASIC_CONSUME_OK_METHOD, &m);
		break;
	}
	case 11:
		method_write_channel_close(b, ch, 406, "PRECONDITION_FAILED - fuzz", 60, 40);
		break;
	case 12:
		method_write_connection_close(b, 320, "CONNECTION_FORCED - fuzz", 0, 0);
		break;
	case 13:
		method_write(b, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
			     &(amqp_connection_close_ok_t){0});
		break;
	case 14:
		method_write(b, ch, AMQP_CHANNEL_CLOSE_OK_METHOD,
			     &(amqp_channel_close_ok_t){0});
		break;
	case 16: {
		/* The broker cancels a consumer (its queue was deleted). */
		amqp_basic_cancel_t m = {.consumer_tag = fuzz_str(p & 4 ? "ctag" : "other")};
		method_write(b, ch, AMQP_BASIC_CANCEL_METHOD, &m);
		break;
	}
	default:
		if (p & 0x80) /* the answer to the pool's qos(0) that keeps a channel */
			method_write(b, ch, AMQP_BASIC_QOS_OK_METHOD,
				     &(amqp_basic_qos_ok_t){0});
		else
			evbuffer_add(b, heartbeat, 8);
		break;
	}
}

/* The scripted broker: answer what the proxy sent as RabbitMQ would. */
