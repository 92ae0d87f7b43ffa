/* hooks: which pipeline hooks a build of the proxy registers. */
#include "hooks.h"

#include "patterns/claim_check.h"
#include "patterns/dedup_publish.h"
#include "patterns/idempotency.h"
#include "patterns/reply_to.h"
#include "patterns/schedule.h"
#include "pipeline.h"

void hooks_register(void)
{
	idempotency_register();
	dedup_publish_register();
	claim_check_register();
	schedule_register();
	reply_to_register();
	if (testhook_register)
		testhook_register();
}
