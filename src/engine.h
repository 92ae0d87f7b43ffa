/* engine: the proxy's own broker connections. */
#ifndef ACEMQ_ENGINE_H
#define ACEMQ_ENGINE_H
#endif
