/* channel: per-channel state of a session: content order, consumers, tag maps. */
#ifndef ACEMQ_CHANNEL_H
#define ACEMQ_CHANNEL_H

#include "tagmap.h"

#include <amqp.h>
#include <stdint.h>

struct pipe_msg;
struct surplus;

/* Direction of travel, also the index of per-direction state. */
enum chan_dir { DIR_TO_BROKER = 0, DIR_TO_CLIENT = 1 };

enum chan_expect { EXPECT_METHOD, EXPECT_HEADER, EXPECT_BODY };

struct chan_content {
	uint8_t expect;
	uint16_t class_id;
	amqp_method_number_t method; /* the content method being followed */
	uint64_t remaining;          /* body bytes still to come */
	struct pipe_msg *msg;        /* being assembled for a hook, or NULL */
	int skip;                    /* content of a message the proxy drops */
};

struct chan_consumer {
	char *tag;
	char *queue; /* the queue it consumes from */
	int no_ack;
};

struct channel {
	uint16_t id;
	struct chan_content content[2];
	struct tagmap tags;
	struct confirmmap confirms;
	int confirm_mode;
	uint64_t published;  /* publishes from the client since confirm.select */
	uint64_t confirmed;  /* the highest sequence number the broker answered */
	int open;            /* the client opened it (counted against max_channels) */
	int closing_hold;    /* the client's frames wait for the broker's close-ok */
	int proxy_closing;   /* the proxy closes it: close-oks still awaited */
	int get_no_ack;      /* no_ack of the basic.get awaiting its answer */
	int consume_no_ack;  /* no_ack of a basic.consume awaiting consume-ok */
	char *consume_queue; /* queue of a basic.consume awaiting consume-ok */
	char *get_queue;     /* queue of the basic.get awaiting its answer */
	struct chan_consumer *consumers;
	int nconsumers;
	uint16_t prefetch;        /* the client's basic.qos, per consumer */
	int prefetch_global;      /* ... and one for the channel was set */
	uint16_t consume_surplus; /* a basic.consume awaiting consume-ok asked
				   * for more: the client's prefetch */
	int qos_unanswered;       /* qos-oks owed for the proxy's own basic.qos */
	struct surplus *surplus;  /* deliveries past the client's prefetch */
	void *hook_state[4];      /* one slot per attached hook */
};

/* proxy_closing: whose close-ok the proxy still waits for. */
enum { CHAN_CLOSING_BROKER = 1, CHAN_CLOSING_CLIENT = 2 };

struct channel *channel_new(uint16_t id);
void channel_free(struct channel *ch);
void channel_reset(struct channel *ch);

/* Track a consumer (consume-ok gives the final tag), and look one up. */
int channel_consumer_add(struct channel *ch, const char *tag, size_t len, int no_ack,
			 const char *queue);
void channel_consumer_remove(struct channel *ch, const char *tag, size_t len);
int channel_consumer_no_ack(const struct channel *ch, const char *tag, size_t len);
/* The queue a consumer reads, or NULL. */
const char *channel_consumer_queue(const struct channel *ch, const char *tag, size_t len);
/* Remember a string (a pending consume's or get's queue); NULL clears. */
void channel_set_str(char **slot, const void *bytes, size_t len);

/* What an out-of-order frame is told, in the broker's words. */
struct chan_error {
	char text[128];
	amqp_method_number_t method; /* class and method to report, or 0 */
};

/* Content order: returns 0, or the reply code for an out-of-order frame. */
int channel_content_method(struct channel *ch, enum chan_dir dir, amqp_method_number_t id,
			   int has_content, struct chan_error *err);
int channel_content_header(struct channel *ch, enum chan_dir dir, uint16_t class_id,
			   uint64_t body_size, struct chan_error *err);
int channel_content_body(struct channel *ch, enum chan_dir dir, uint32_t size,
			 struct chan_error *err);

#endif
