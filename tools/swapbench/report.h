/*
 * report.h - what swapbench prints: the configuration, one line per
 * iteration, and the summary, as text or as one JSON object.
 */
#ifndef SWAPBENCH_REPORT_H
#define SWAPBENCH_REPORT_H

#include "swapbench.h"

/* Text: the configuration at the top (nothing in JSON mode). */
void report_header(const struct sb_config *cfg, const struct sb_plan *plan);

/* Text: the line of phase @k (0: init) summed over all ranks. */
void report_phase(const struct sb_config *cfg, const struct sb_rank *ranks, int k);

/*
 * The summary of iterations 1..@done: steady-state medians and verify counts
 * as text, or the whole run as one JSON object.  @status is the exit status.
 */
int report_summary(const struct sb_config *cfg, const struct sb_plan *plan,
		   const struct sb_rank *ranks, int done, int status);

#endif
