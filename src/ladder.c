/* ladder: the schedule ladder contract. */
#include "ladder.h"
