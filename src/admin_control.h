/* admin_control: the admin endpoint's actions on running connections: a
 * client closed or drained (POST /connections/ID/close|drain), a vhost's
 * publishers paused and resumed, or its clients drained
 * (POST /vhosts/NAME/pause|resume|disconnect), a broker address taken out
 * of use and its clients drained (POST /upstreams/HOST:PORT/disable|enable|
 * drain). */
#ifndef ACEMQ_ADMIN_CONTROL_H
#define ACEMQ_ADMIN_CONTROL_H

struct http_request;

#define ADMIN_CONTROL_MAX_BODY 4096 /* {"reason": ...} */

/* The handler of all three prefixes. */
void admin_control(struct http_request *req, void *arg);

#endif
