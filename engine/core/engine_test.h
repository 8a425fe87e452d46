/* engine_test.h - hooks into the engine for tests only (not llmd.h's API).
 *
 * Like mem_fail_nth(), they make a path run that the engine's own decisions
 * reach only under conditions a test cannot arrange: here the spare draft
 * catch-up (spec_catch_up_plan), which the policy grants only where a draft
 * model pays at the measured costs, and which none of the test models does.
 * Thread safety: the engine's (one caller thread). */
#ifndef LLMD_ENGINE_TEST_H
#define LLMD_ENGINE_TEST_H

#include <stdint.h>

struct llmd_engine;

/* From the next step on (seed != 0; 0 turns it off), with a draft model,
 * the draft-length policy's choice is replaced by a seeded pseudo-random
 * one: each speculating decode drafts its whole offer or nothing, even
 * odds, and half of those that draft nothing and lag get a spare catch-up
 * of 1 to lag + 2 tokens (past the lag on purpose: the engine clamps it).
 * Every other rule holds (the scheduler's budget, the pass's capacity,
 * d_comp, sealing), so a self-drafted run must still accept every draft
 * and give the plain run's ids. */
void eng_test_force_spare(struct llmd_engine *e, uint32_t seed);

/* Tokens the spare catch-up has run through the draft since the engine
 * opened (forced or not). */
uint64_t eng_test_spare_tokens(const struct llmd_engine *e);

#endif /* LLMD_ENGINE_TEST_H */
