/* hooks: which pipeline hooks a build of the proxy registers. */
#include "hooks.h"

#include "pipeline.h"

void hooks_register(void)
{
	/* The messaging patterns register here as they are added. */
	if (testhook_register)
		testhook_register();
}
