/* hooks: which pipeline hooks a build of the proxy registers. */
#ifndef ACEMQ_HOOKS_H
#define ACEMQ_HOOKS_H

void hooks_register(void);
/* Defined only in the test build (testhook.c). */
void testhook_register(void) __attribute__((weak));

#endif
