// ds41 engine: the step scheduler (scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>

namespace ds41::engine {

Status validate(const SchedulerConfig& c) {
  if (c.max_running < 1)
    return invalid_argument("max_running must be >= 1 (got " + std::to_string(c.max_running) + ")");
  if (c.max_batch_tokens < c.max_running)
    return invalid_argument("max_batch_tokens (" + std::to_string(c.max_batch_tokens) +
                            ") must be >= max_running (" + std::to_string(c.max_running) +
                            "): every running sequence must be able to decode in one step");
  if (c.long_prefill_chunk < 0)
    return invalid_argument("long_prefill_chunk must be >= 0 (got " + std::to_string(c.long_prefill_chunk) +
                            ")");
  if (!c.bytes_for_tokens) return invalid_argument("bytes_for_tokens is not set");
  if (c.kv_memory_bytes < c.bytes_for_tokens(1))
    return invalid_argument("kv_memory_bytes " + std::to_string(c.kv_memory_bytes) +
                            " is smaller than the state of a one-token sequence (" +
                            std::to_string(c.bytes_for_tokens(1)) + " bytes)");
  return ok_status();
}

Status check_fits(const SchedulerConfig& c, int64_t tokens) {
  const int64_t need = c.bytes_for_tokens(tokens);
  if (need > c.kv_memory_bytes)
    return invalid_argument("a sequence of " + std::to_string(tokens) +
                            " tokens (prompt + max_tokens) needs " + std::to_string(need) +
                            " bytes of state, more than the whole state capacity of " +
                            std::to_string(c.kv_memory_bytes) + " bytes (--kv-memory)");
  return ok_status();
}

namespace {

struct Candidate {
  int64_t id = 0;
  int64_t remaining = 0;  // prefill tokens still to run
  int64_t chunk = 0;      // planned this step
};

}  // namespace

StepPlan plan_step(const SchedulerConfig& c, std::span<const WaitingEntry> waiting,
                   std::span<const RunningEntry> running) {
  StepPlan plan;
  const auto& B = c.bytes_for_tokens;
  const int64_t cap_chunk =
      c.long_prefill_chunk > 0 ? c.long_prefill_chunk : std::max<int64_t>(1, c.max_batch_tokens / 8);

  // Capacity: prefill targets reserved, decodes counted at their length after this step. Preempt
  // the newest until the rest fits (the oldest always fits alone: check_fits at submit).
  int64_t keep = static_cast<int64_t>(running.size());
  std::vector<int64_t> counted(keep);
  int64_t total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    const RunningEntry& r = running[i];
    const bool decoding = r.computed >= r.prompt_tokens;
    counted[i] = B(std::max(r.prompt_tokens, r.computed + (decoding ? 1 : 0)));
    total += counted[i];
  }
  while (total > c.kv_memory_bytes && keep > 1) {
    --keep;
    plan.preempt.push_back(running[keep].id);
    total -= counted[keep];
  }

  int64_t budget = c.max_batch_tokens;
  std::vector<PlanItem> decodes;
  auto plan_decodes = [&] {
    for (int64_t i = 0; i < keep && budget > 0; ++i)
      if (running[i].computed >= running[i].prompt_tokens) {
        decodes.push_back({running[i].id, 1, true});
        --budget;
      }
  };
  if (c.decode_first) plan_decodes();

  // First pass: capped chunks for the running prefills, then FCFS head-of-line admission.
  std::vector<Candidate> cands;
  for (int64_t i = 0; i < keep; ++i)
    if (running[i].computed < running[i].prompt_tokens) {
      Candidate k{running[i].id, running[i].prompt_tokens - running[i].computed, 0};
      k.chunk = std::min({k.remaining, cap_chunk, budget});
      budget -= k.chunk;
      cands.push_back(k);
    }
  int64_t n_running = keep;
  if (plan.preempt.empty()) {
    for (const WaitingEntry& w : waiting) {
      if (n_running >= c.max_running || budget <= 0) break;
      const int64_t need = B(w.prompt_tokens + 1);
      if (total + need > c.kv_memory_bytes) break;  // head of line: nobody overtakes it
      Candidate k{w.id, w.prompt_tokens, 0};
      k.chunk = std::min({k.remaining, cap_chunk, budget});
      budget -= k.chunk;
      total += B(w.prompt_tokens);
      cands.push_back(k);
      plan.admit.push_back(w.id);
      ++n_running;
    }
  }
  if (!c.decode_first) plan_decodes();
  // Second pass: what is left goes to the oldest prefills first.
  for (Candidate& k : cands) {
    const int64_t extra = std::min(k.remaining - k.chunk, budget);
    k.chunk += extra;
    budget -= extra;
  }

  if (c.decode_first) plan.items = decodes;
  for (const Candidate& k : cands)
    if (k.chunk > 0) plan.items.push_back({k.id, k.chunk, false});
  if (!c.decode_first) plan.items.insert(plan.items.end(), decodes.begin(), decodes.end());
  for (const PlanItem& it : plan.items) plan.tokens += it.tokens;
  plan.kv_bytes = total;
  return plan;
}

}  // namespace ds41::engine
