// Scheduler (src/engine/scheduler.h) driven by a simulator: the plan is applied the way the
// engine loop applies it (prefill chunks advance, a completed prefill or a decode yields a token,
// preempted requests go back to the waiting front with their generated tokens as prompt), and
// every step advances a FakeClock by a cost model (fixed + per token), so TTFT is measured in
// simulated seconds. Invariants are checked on every plan.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>

#include "core/clock.h"

namespace ds41::engine {
namespace {

struct SimReq {
  int64_t id = 0, prompt = 0, max_new = 0;
  int64_t gen = 0, computed = 0, target = 0;
  int64_t arrival_ns = 0, first_token_ns = -1, finish_ns = -1;
  int preemptions = 0;
};

class Sim {
 public:
  explicit Sim(SchedulerConfig c) : c_(std::move(c)) { EXPECT_TRUE(validate(c_).ok()); }
  int64_t add(int64_t prompt, int64_t max_new) {
    auto r = std::make_unique<SimReq>();
    r->id = next_++;
    r->prompt = r->target = prompt;
    r->max_new = max_new;
    r->arrival_ns = clock_.now_mono_ns();
    arrival_order_.push_back(r->id);
    waiting_.push_back(r.get());
    all_[r->id] = std::move(r);
    return next_ - 1;
  }
  // Removes a request wherever it is (the loop's cancel path).
  void cancel(int64_t id) {
    std::erase(waiting_, all_[id].get());
    std::erase(running_, all_[id].get());
    cancelled_.push_back(id);
  }
  StepPlan step() {
    std::vector<WaitingEntry> w;
    for (SimReq* r : waiting_) w.push_back({r->id, r->prompt + r->gen});
    std::vector<RunningEntry> rn;
    for (SimReq* r : running_) rn.push_back({r->id, r->target, r->computed});
    StepPlan p = plan_step(c_, w, rn);
    check(p, w, rn);
    for (int64_t id : p.preempt) {
      SimReq* r = all_[id].get();
      EXPECT_EQ(running_.back(), r) << "preemption must take the newest running request";
      running_.pop_back();
      r->computed = 0;
      r->target = r->prompt + r->gen;
      ++r->preemptions;
      waiting_.push_front(r);
      ++preemptions_;
    }
    for (int64_t id : p.admit) {
      EXPECT_EQ(waiting_.front()->id, id) << "admission must be FCFS head of line";
      running_.push_back(waiting_.front());
      waiting_.pop_front();
      admission_order_.push_back(id);
    }
    clock_.advance_ns(step_fixed_ns + step_per_token_ns * p.tokens);
    for (const PlanItem& it : p.items) {
      SimReq* r = all_[it.id].get();
      r->computed += it.tokens;
      if (r->computed == r->prompt + r->gen) {  // a logits row: one new token
        if (++r->gen == 1 && r->first_token_ns < 0) r->first_token_ns = clock_.now_mono_ns();
        if (r->gen == r->max_new) {
          r->finish_ns = clock_.now_mono_ns();
          std::erase(running_, r);
          finished_.push_back(r->id);
        }
      }
    }
    ++steps_;
    return p;
  }
  int64_t run(int64_t max_steps) {
    int64_t n = 0;
    while ((!waiting_.empty() || !running_.empty()) && n < max_steps) {
      step();
      ++n;
    }
    return n;
  }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  SimReq& req(int64_t id) { return *all_[id]; }
  const std::vector<int64_t>& finished() const { return finished_; }
  const std::vector<int64_t>& admission_order() const { return admission_order_; }
  const std::deque<SimReq*>& waiting() const { return waiting_; }
  const std::vector<SimReq*>& running() const { return running_; }
  int64_t preemptions() const { return preemptions_; }
  FakeClock& clock() { return clock_; }
  int64_t step_fixed_ns = 5'000'000, step_per_token_ns = 50'000;

 private:
  void check(const StepPlan& p, const std::vector<WaitingEntry>& w, const std::vector<RunningEntry>& rn) {
    EXPECT_LE(p.tokens, c_.max_batch_tokens);
    int64_t sum = 0;
    std::set<int64_t> ids;
    for (const PlanItem& it : p.items) {
      sum += it.tokens;
      EXPECT_GT(it.tokens, 0);
      EXPECT_TRUE(ids.insert(it.id).second) << "a request twice in one step";
      EXPECT_EQ(std::count(p.preempt.begin(), p.preempt.end(), it.id), 0) << "a preempted request is planned";
    }
    EXPECT_EQ(sum, p.tokens);
    EXPECT_LE(static_cast<int64_t>(rn.size() - p.preempt.size() + p.admit.size()), c_.max_running);
    EXPECT_LE(p.kv_bytes, c_.kv_memory_bytes);
    if (!p.preempt.empty()) {
      EXPECT_TRUE(p.admit.empty()) << "no admission in a step that preempts";
    }
  }

  SchedulerConfig c_;
  FakeClock clock_;
  std::map<int64_t, std::unique_ptr<SimReq>> all_;
  std::deque<SimReq*> waiting_;
  std::vector<SimReq*> running_;
  std::vector<int64_t> arrival_order_, admission_order_, finished_, cancelled_;
  int64_t next_ = 1, steps_ = 0, preemptions_ = 0;
};

SchedulerConfig linear_config(int64_t budget, int64_t max_running, int64_t capacity) {
  SchedulerConfig c;
  c.max_batch_tokens = budget;
  c.max_running = max_running;
  c.kv_memory_bytes = capacity;
  c.bytes_for_tokens = [](int64_t n) { return 1000 + 10 * n; };
  return c;
}

TEST(Scheduler, LongPromptAmongShortChatsAllProgress) {
  Sim sim(linear_config(2048, 64, int64_t{1} << 40));
  const int64_t long_id = sim.add(100'000, 16);
  std::vector<int64_t> shorts;
  for (int i = 0; i < 63; ++i) shorts.push_back(sim.add(100 + 7 * i, 32));
  // Step 1 admits the long prompt (its first chunk capped at 2048 / 8) and as many short chats
  // as the rest of the budget covers.
  StepPlan first = sim.step();
  EXPECT_EQ(first.admit.front(), long_id);
  EXPECT_GT(first.admit.size(), 5u);
  const int64_t steps = sim.run(10'000);
  EXPECT_TRUE(sim.idle()) << "not everything finished in " << steps << " steps";
  EXPECT_EQ(sim.finished().size(), 64u);
  // No short chat waits for the long prefill to complete (>= 49 steps): the shorts' prompts total
  // about 20K tokens, so at ~1.7K tokens a step every one has its first token within ~13 steps.
  const int64_t step_max_ns = sim.step_fixed_ns + 2048 * sim.step_per_token_ns;
  int64_t worst_ttft = 0;
  for (int64_t id : shorts) {
    EXPECT_EQ(sim.req(id).gen, 32);
    worst_ttft = std::max(worst_ttft, sim.req(id).first_token_ns - sim.req(id).arrival_ns);
  }
  EXPECT_LE(worst_ttft, 16 * step_max_ns);
  EXPECT_LT(worst_ttft, (sim.req(long_id).first_token_ns - sim.req(long_id).arrival_ns) / 3);
  // The long prompt finishes, and with at most the budget per step: >= 100000 / 2048 steps.
  EXPECT_EQ(sim.req(long_id).gen, 16);
  EXPECT_GE(steps + 1, 100'000 / 2048);
  EXPECT_LT(steps + 1, 100'000 / 2048 + 80);
}

TEST(Scheduler, LoneLongPromptGetsTheWholeBudget) {
  Sim sim(linear_config(2048, 64, int64_t{1} << 40));
  sim.add(10'000, 1);
  StepPlan p = sim.step();
  ASSERT_EQ(p.items.size(), 1u);
  EXPECT_EQ(p.items[0].tokens, 2048);  // the cap only applies while others compete
}

TEST(Scheduler, DecodesFirstAndNeverStarvedByPrefill) {
  for (bool decode_first : {true, false}) {
    auto c = linear_config(512, 8, int64_t{1} << 40);
    c.decode_first = decode_first;
    Sim sim(c);
    for (int i = 0; i < 4; ++i) sim.add(10, 1000);
    sim.step();  // four short prefills complete -> four decoding sequences
    sim.add(50'000, 4);
    for (int s = 0; s < 20; ++s) {
      StepPlan p = sim.step();
      int64_t decodes =
          std::count_if(p.items.begin(), p.items.end(), [](const PlanItem& i) { return i.decode; });
      EXPECT_EQ(decodes, 4) << "decode_first " << decode_first << " step " << s;
      EXPECT_EQ(p.tokens, 512);
      EXPECT_EQ(p.items.front().decode, decode_first);
    }
  }
}

TEST(Scheduler, BurstRespectsMaxRunningAndAdmitsInArrivalOrder) {
  Sim sim(linear_config(256, 16, int64_t{1} << 40));
  std::vector<int64_t> ids;
  for (int i = 0; i < 300; ++i) ids.push_back(sim.add(1 + (i * 37) % 200, 1 + (i * 13) % 20));
  int64_t steps = sim.run(100'000);
  EXPECT_TRUE(sim.idle()) << steps;
  EXPECT_EQ(sim.admission_order(), ids);  // FCFS: nobody overtakes
  for (int64_t id : ids) EXPECT_EQ(sim.req(id).gen, sim.req(id).max_new);
}

TEST(Scheduler, HeadOfLineIsNeverOvertakenByASmallerRequest) {
  // Capacity for about 1000 tokens: a running 600-token request leaves room for a small one but
  // not for the 500-token head of the queue; the small one behind it must wait too.
  auto c = linear_config(4096, 8, 1000 * 10 + 2 * 1000 + 500);
  Sim sim(c);
  const int64_t a = sim.add(600, 50);
  sim.step();
  const int64_t big = sim.add(500, 10), small = sim.add(5, 2);
  for (int i = 0; i < 5; ++i) {
    StepPlan p = sim.step();
    EXPECT_TRUE(p.admit.empty());
  }
  sim.run(10'000);
  EXPECT_TRUE(sim.idle());
  EXPECT_EQ(sim.admission_order(), (std::vector<int64_t>{a, big, small}));
}

TEST(Scheduler, CancelMidPrefillFreesItsCapacityAndTheRestContinue) {
  auto c = linear_config(1024, 8, 1000 * 3 + 10 * 9000);
  Sim sim(c);
  const int64_t big = sim.add(8000, 4);
  const int64_t next = sim.add(5000, 4);
  StepPlan p = sim.step();
  EXPECT_EQ(p.admit, (std::vector<int64_t>{big}));  // 8000 + 5000 tokens do not fit together
  sim.step();
  ASSERT_GT(sim.req(big).computed, 0);
  ASSERT_LT(sim.req(big).computed, 8000);  // mid-prefill
  sim.cancel(big);
  p = sim.step();
  EXPECT_EQ(p.admit, (std::vector<int64_t>{next}));
  sim.run(1000);
  EXPECT_TRUE(sim.idle());
  EXPECT_EQ(sim.req(next).gen, 4);
}

TEST(Scheduler, RequestLargerThanCapacityIsRefusedWithTheNumbers) {
  auto c = linear_config(1024, 8, 50'000);
  EXPECT_TRUE(check_fits(c, 4900).ok());
  Status s = check_fits(c, 4901);  // 1000 + 49010 bytes
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4901 tokens"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("50010 bytes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("50000 bytes"), std::string::npos) << s.message();
}

TEST(Scheduler, ConfigValidationNamesTheField) {
  auto c = linear_config(8, 16, 1 << 20);
  Status s = validate(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("max_batch_tokens (8)"), std::string::npos) << s.message();
  c = linear_config(64, 16, 100);
  s = validate(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kv_memory_bytes 100"), std::string::npos) << s.message();
}

TEST(Scheduler, PreemptsTheNewestAndRecomputesItFirst) {
  // Three requests admitted together; decode growth outruns the capacity, so the newest is
  // preempted, goes back to the front of the queue (before the later arrival d), and resumes with
  // its generated tokens prefilled as prompt.
  auto c = linear_config(4096, 8, 3 * 1000 + 10 * (3 * 100 + 40));
  Sim sim(c);
  const int64_t a = sim.add(100, 60), b = sim.add(100, 60), cc = sim.add(100, 60);
  sim.step();
  ASSERT_EQ(sim.running().size(), 3u);
  const int64_t d = sim.add(10, 5);
  int64_t guard = 0;
  while (sim.preemptions() == 0 && guard++ < 100) sim.step();
  ASSERT_EQ(sim.preemptions(), 1);
  ASSERT_FALSE(sim.waiting().empty());
  EXPECT_EQ(sim.waiting().front()->id, cc);
  EXPECT_EQ(sim.waiting()[1]->id, d);
  const int64_t gen_at_preempt = sim.req(cc).gen;
  EXPECT_GT(gen_at_preempt, 0);
  EXPECT_EQ(sim.req(cc).target, 100 + gen_at_preempt);
  // The next admission brings cc back before d (the later arrival).
  StepPlan p;
  guard = 0;
  do p = sim.step();
  while (p.admit.empty() && guard++ < 100);
  ASSERT_FALSE(p.admit.empty());
  EXPECT_EQ(p.admit.front(), cc);
  sim.run(10'000);
  EXPECT_TRUE(sim.idle());
  for (int64_t id : {a, b, cc, d}) EXPECT_EQ(sim.req(id).gen, sim.req(id).max_new);
}

TEST(Scheduler, PlanIsPure) {
  auto c = linear_config(300, 8, 1 << 20);
  std::vector<WaitingEntry> w = {{7, 500}, {8, 20}};
  std::vector<RunningEntry> r = {{1, 40, 40}, {2, 900, 100}};
  StepPlan p1 = plan_step(c, w, r), p2 = plan_step(c, w, r);
  ASSERT_EQ(p1.items.size(), p2.items.size());
  for (size_t i = 0; i < p1.items.size(); ++i) EXPECT_EQ(p1.items[i].tokens, p2.items[i].tokens);
  // decode of 1, then capped chunks (300/8 = 37) for 2, 7, 8, then the rest to the oldest (2).
  ASSERT_EQ(p1.items.size(), 4u);
  EXPECT_EQ(p1.items[0].id, 1);
  EXPECT_TRUE(p1.items[0].decode);
  EXPECT_EQ(p1.items[1].id, 2);
  EXPECT_EQ(p1.items[1].tokens, 299 - 37 - 20);
  EXPECT_EQ(p1.items[2].id, 7);
  EXPECT_EQ(p1.items[2].tokens, 37);
  EXPECT_EQ(p1.items[3].id, 8);
  EXPECT_EQ(p1.items[3].tokens, 20);
  EXPECT_EQ(p1.tokens, 300);
}

}  // namespace
}  // namespace ds41::engine
