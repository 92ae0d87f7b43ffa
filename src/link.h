/* link: the back-link of a completion whose owner may have gone. A request
 * handed to another thread or to a later loop turn (a store operation,
 * say) keeps a struct link to what waits for it; that owner, when it goes
 * first, cuts the link, and the request then completes on its own (frees
 * itself, gives up what it held) instead of touching freed memory. The
 * one idiom for it in the patterns:
 *
 *   submit:     link_set(&op->to, e); e->op = op;
 *   owner goes: if (e->op) link_cut(&e->op->to);
 *   completion: e = link_owner(&op->to); if (e == NULL) { free(op); return; }
 *
 * Only the owner's thread cuts or reads a link (a completion runs on the
 * owner's worker). Header-only. */
#ifndef ACEMQ_LINK_H
#define ACEMQ_LINK_H

#include <stddef.h>

struct link {
	void *owner;
};

static inline void link_set(struct link *l, void *owner)
{
	l->owner = owner;
}

/* The owner goes (or lets the request go on unwatched). */
static inline void link_cut(struct link *l)
{
	l->owner = NULL;
}

/* The owner, or NULL once the link was cut. */
static inline void *link_owner(const struct link *l)
{
	return l->owner;
}

#endif
