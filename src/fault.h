/* fault: what the proxy tells a peer that broke a rule: a protocol error,
 * a limit's refusal, a channel error. */
#ifndef ACEMQ_FAULT_H
#define ACEMQ_FAULT_H

#include "limits.h"

#include <stdint.h>

struct session;
struct channel;
struct frame_info;

/* A frame from the client broke the protocol: connection.close with code
 * (the broker's words for it), then the session closes. */
void fault_protocol(struct session *s, uint16_t code, const char *why, uint16_t class_id,
		    uint16_t method_id);
/* A limit refuses what the client asked for: connection.close 530 with the
 * reason, as the broker words its own limits; logged once per episode. */
void fault_refuse(struct session *s, enum limits_reason r, const struct frame_info *fi);
/* Close one channel on both sides with code (the broker's close-ok is
 * dropped on the way back), as the broker does for a channel error; a
 * client in the middle of a publish on it loses the connection instead. */
void fault_channel(struct session *s, struct channel *ch, uint16_t code, const char *text,
		   uint16_t class_id, uint16_t method_id);

#endif
