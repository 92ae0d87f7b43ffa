/* reply_to: make the acemq-reply-to header and the reply-to property agree. */
#include "reply_to.h"

#include "../../amqp/table.h"
#include "../pipeline.h"
#include "../rules.h"
#include "../worker.h"

#include <string.h>

static int reply_to_is_direct(amqp_bytes_t b)
{
	size_t n = strlen(REPLY_TO_DIRECT);

	return b.len == n && memcmp(b.bytes, REPLY_TO_DIRECT, n) == 0;
}

/* The broker's per-channel rewrite of the direct reply-to name. */
static int reply_to_is_direct_rewritten(amqp_bytes_t b)
{
	size_t n = strlen(REPLY_TO_DIRECT);

	return b.len > n + 1 && memcmp(b.bytes, REPLY_TO_DIRECT ".", n + 1) == 0;
}

static int reply_to_equal(amqp_bytes_t a, amqp_bytes_t b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.bytes, b.bytes, a.len) == 0);
}

static int reply_to_set_property(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t v)
{
	void *copy = amqp_pool_alloc(pool, v.len ? v.len : 1);

	if (copy == NULL)
		return -1;
	memcpy(copy, v.bytes, v.len);
	p->reply_to.bytes = copy;
	p->reply_to.len = v.len;
	p->_flags |= AMQP_BASIC_REPLY_TO_FLAG;
	return 0;
}

static int reply_to_add_header(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t v)
{
	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG)) {
		p->headers.num_entries = 0;
		p->headers.entries = NULL;
		p->_flags |= AMQP_BASIC_HEADERS_FLAG;
	}
	return table_set_string(&p->headers, pool, REPLY_TO_HEADER, v);
}

int reply_to_normalise(amqp_basic_properties_t *p, amqp_pool_t *pool, int publish)
{
	int has_prop = (p->_flags & AMQP_BASIC_REPLY_TO_FLAG) != 0;
	int has_head = 0;
	amqp_bytes_t head = {0, NULL}, prop = p->reply_to;
	int change = 0;

	if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
		has_head = table_get_string(&p->headers, REPLY_TO_HEADER, &head) == 0;
	if (!has_prop && !has_head)
		return REPLY_TO_SAME;

	if (publish) {
		/* The broker rewrites a direct reply-to property into a
		 * per-channel name as it routes; a header holding the bare
		 * name would point responders nowhere. Keep the name in the
		 * property only; the delivery side fills the header in. */
		if (has_head && reply_to_is_direct(head)) {
			table_remove(&p->headers, REPLY_TO_HEADER);
			change |= REPLY_TO_HEADER_DROPPED;
			if (!has_prop || !reply_to_equal(prop, head)) {
				if (has_prop)
					change |= REPLY_TO_MISMATCH;
				if (reply_to_set_property(p, pool, head) != 0)
					return -1;
				change |= REPLY_TO_PROPERTY_SET;
			}
			return change;
		}
		if (!has_head && reply_to_is_direct(prop))
			return REPLY_TO_SAME;
	} else if (has_head && has_prop && reply_to_is_direct(head) &&
		   reply_to_is_direct_rewritten(prop)) {
		/* Published elsewhere with the bare name in the header: the
		 * property holds the broker's real address. */
		if (reply_to_add_header(p, pool, prop) != 0)
			return -1;
		return REPLY_TO_HEADER_ADDED;
	}

	if (has_prop && !has_head) {
		if (reply_to_add_header(p, pool, prop) != 0)
			return -1;
		return REPLY_TO_HEADER_ADDED;
	}
	if (has_head && !has_prop) {
		if (reply_to_set_property(p, pool, head) != 0)
			return -1;
		return REPLY_TO_PROPERTY_SET;
	}
	if (reply_to_equal(head, prop))
		return REPLY_TO_SAME;
	/* Both, and different: the header wins, as AceMQ readers take it first. */
	if (reply_to_set_property(p, pool, head) != 0)
		return -1;
	return REPLY_TO_PROPERTY_SET | REPLY_TO_MISMATCH;
}

static int reply_to_enabled(struct pipeline *p)
{
	const struct rules_vhost *v = pipeline_rules(p);

	return v != NULL && v->reply_to;
}

static void *reply_to_attach(struct pipeline *p)
{
	static int attached;

	return reply_to_enabled(p) ? &attached : NULL;
}

static int reply_to_wants(void *state, struct pipeline *p, struct channel *ch,
			  enum pipe_kind kind, amqp_method_number_t id, void *method)
{
	if (kind == PIPE_RETURN || !reply_to_enabled(p))
		return PIPE_WANT_NONE;
	return PIPE_WANT_MSG;
}

static enum pipe_verdict reply_to_message(void *state, struct pipeline *p, struct channel *ch,
					  struct pipe_msg *m)
{
	int rc, had;

	if (m->props == NULL || !reply_to_enabled(p))
		return PIPE_PASS;
	had = (m->props->_flags & AMQP_BASIC_HEADERS_FLAG) ? m->props->headers.num_entries : 0;
	rc = reply_to_normalise(m->props, &m->pool, m->kind == PIPE_PUBLISH);
	if (rc <= 0)
		return PIPE_PASS;
	/* The usual change, the header added beside the property, is an
	 * entry appended: spliced into the frame as it is. */
	if (rc == REPLY_TO_HEADER_ADDED && m->props->headers.num_entries == had + 1)
		pipeline_headers_appended(m);
	else
		m->props_dirty = 1;
	if (rc & REPLY_TO_HEADER_ADDED)
		STATS_INC(&p->w->stats, reply_to_header_added);
	if (rc & REPLY_TO_PROPERTY_SET)
		STATS_INC(&p->w->stats, reply_to_property_set);
	if (rc & REPLY_TO_MISMATCH)
		STATS_INC(&p->w->stats, reply_to_mismatch);
	return PIPE_PASS;
}

static const struct pipe_hook reply_to_hook = {
    .name = "reply_to",
    .rewrite_only = 1,
    .attach = reply_to_attach,
    .wants = reply_to_wants,
    .message = reply_to_message,
};

void reply_to_register(void)
{
	pipeline_register(&reply_to_hook);
}
