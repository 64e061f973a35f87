// ds41 engine: the step scheduler — pure logic (no model, no threads, no clock): given the
// waiting requests in FCFS order and the running sequences in admission order, plan one step.
//
// Policy (issue 12 "Scheduler"):
//   - Continuous batching: every step re-plans; sequences join and leave between steps.
//   - Token budget: a step carries at most max_batch_tokens tokens (decodes count 1 each,
//     prefill chunks their length). With decode_first, every decoding sequence gets its token
//     first and prefill chunks take what is left; otherwise the first (capped) prefill pass below
//     is planned before the decodes (better TTFT when many prompts arrive at once, worse
//     inter-token latency) and the second pass still comes after them, so one long prompt
//     never starves the decodes in either mode.
//   - Chunked prefill: prefill candidates (running sequences still prefilling, in admission order,
//     then admitted waiting requests in FCFS order) first get at most long_prefill_chunk tokens
//     each, so a 100K-token prompt does not hold back the short prompts behind it for more than
//     one step; whatever budget is left then goes to the candidates in the same order (a lone
//     long prompt still gets the whole budget).
//   - Capacity (kv_memory_bytes, sizes from bytes_for_tokens): a running sequence is counted at
//     max(its whole prefill length, its length after this step) — the prefill target is reserved
//     at admission, so a sequence is never preempted because its own prefill grows; decode growth
//     is counted at its current length, as vLLM does, rather than reserving prompt + max_tokens
//     up front (which would leave most of the memory idle). When decode growth does not fit,
//     the newest running sequence is preempted (repeatedly if needed): its state is dropped and
//     it goes back to the front of the waiting queue; the caller appends its generated tokens to
//     its prompt so the recompute is exact.
//   - No admission in a step that preempts (the preempted request is the next to come back).
//   - Admission: FCFS, head of line — the oldest waiting request is admitted first and a later
//     one never overtakes it (no starvation), while running < max_running, budget is left and
//     its prefill target plus one token fits beside the running sequences' counted bytes.
//   - A request whose prompt + max_tokens alone exceeds the capacity can never run: the loop
//     refuses it at submit (check_fits()).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds41::engine {

struct SchedulerConfig {
  int64_t max_batch_tokens = 2048;
  int64_t max_running = 64;
  int64_t kv_memory_bytes = int64_t{8} << 30;
  bool decode_first = true;
  // Per-candidate prefill chunk in the first pass; 0: max(1, max_batch_tokens / 8).
  int64_t long_prefill_chunk = 0;
  std::function<int64_t(int64_t tokens)> bytes_for_tokens;  // state bytes of a sequence of N tokens
};

// Errors name the field and the value.
Status validate(const SchedulerConfig& c);
// kInvalidArgument naming the numbers when a sequence of `tokens` tokens can never fit.
Status check_fits(const SchedulerConfig& c, int64_t tokens);

struct WaitingEntry {
  int64_t id = 0;
  int64_t prompt_tokens = 0;  // tokens to prefill (prompt + tokens generated before a preemption)
};

struct RunningEntry {
  int64_t id = 0;
  int64_t prompt_tokens = 0;  // prefill target
  int64_t computed = 0;       // tokens in the state; >= prompt_tokens: decoding (1 token a step)
};

struct PlanItem {
  int64_t id = 0;
  int64_t tokens = 0;   // this step's tokens (1 for a decode)
  bool decode = false;  // false: a prefill chunk
};

struct StepPlan {
  std::vector<int64_t> preempt;  // running ids to drop (newest first); back to the waiting front
  std::vector<int64_t> admit;    // waiting ids to start (FCFS order); their chunks are in items
  std::vector<PlanItem> items;   // batch order
  int64_t tokens = 0;            // sum of items' tokens (<= max_batch_tokens)
  int64_t kv_bytes = 0;          // counted bytes of the running set after this step
};

// `c` must be valid; every running entry has prompt_tokens >= 1. Pure: same inputs, same plan.
StepPlan plan_step(const SchedulerConfig& c, std::span<const WaitingEntry> waiting,
                   std::span<const RunningEntry> running);

}  // namespace ds41::engine
