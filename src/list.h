/* list: an intrusive doubly linked list. An element embeds a struct list
 * and is found from it with list_entry; a list is a struct list head whose
 * next is the first element and prev the last (an empty one points at
 * itself). Adding and removing are O(1), and a removed node is left
 * pointing at itself, so removing it again (or testing list_linked) is
 * harmless. Header-only. */
#ifndef ACEMQ_LIST_H
#define ACEMQ_LIST_H

#include <stddef.h>

struct list {
	struct list *prev, *next;
};

/* An empty list, or a node linked nowhere. */
static inline void list_init(struct list *l)
{
	l->prev = l->next = l;
}

static inline int list_empty(const struct list *head)
{
	return head->next == head;
}

/* Whether a node (set up with list_init, or added) is in a list. */
static inline int list_linked(const struct list *n)
{
	return n->next != n;
}

static inline void list_insert(struct list *n, struct list *prev, struct list *next)
{
	n->prev = prev;
	n->next = next;
	prev->next = n;
	next->prev = n;
}

/* n becomes the first element of head. */
static inline void list_add(struct list *n, struct list *head)
{
	list_insert(n, head, head->next);
}

/* n becomes the last element of head. */
static inline void list_add_tail(struct list *n, struct list *head)
{
	list_insert(n, head->prev, head);
}

/* n leaves its list and points at itself: a second list_del does nothing. */
static inline void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

/* The element of type that embeds ptr as member. */
#define list_entry(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* The first element of head, or NULL when it is empty. */
#define list_first_entry(head, type, member) \
	(list_empty(head) ? (type *)NULL : list_entry((head)->next, type, member))

/* The loops below walk with a cursor of their own (named for the line, so
 * loops may nest) and form pos only from a node that is an element. */
#define LIST_CAT_(a, b) a##b
#define LIST_CAT(a, b)  LIST_CAT_(a, b)
#define LIST_CUR        LIST_CAT(list_cur_, __LINE__)
#define LIST_NEXT       LIST_CAT(list_next_, __LINE__)

/* Each element pos of head, in order; pos must stay in the list. After a
 * break pos is the element it stopped at. */
#define list_for_each_entry(pos, head, member)                              \
	for (struct list *LIST_CUR = (head)->next;                          \
	     LIST_CUR != (head) &&                                          \
	     ((pos) = list_entry(LIST_CUR, __typeof__(*(pos)), member), 1); \
	     LIST_CUR = LIST_CUR->next)

/* Each element pos of head, in order, where the body may take pos out of
 * the list (or free it); nothing else may leave the list meanwhile. */
#define list_for_each_entry_safe(pos, head, member)                             \
	for (struct list *LIST_CUR = (head)->next, *LIST_NEXT = LIST_CUR->next; \
	     LIST_CUR != (head) &&                                              \
	     ((pos) = list_entry(LIST_CUR, __typeof__(*(pos)), member), 1);     \
	     LIST_CUR = LIST_NEXT, LIST_NEXT = LIST_CUR->next)

#endif
