/* engine: the proxy's own broker connections. */
#include "engine.h"
