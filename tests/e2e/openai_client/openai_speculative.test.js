// e2e (issue 17): DSpark speculative decoding served. The official `openai` npm client asks two
// `ds41 serve` processes on the public DSpark golden model (tiny target + 3 draft stages, CPU
// engine), one with `--speculative dspark` and one with `--speculative off`, the same questions:
//   - greedy answers are identical, for prompts past the window (8) and the 128-token cache block;
//   - the speculative server really decoded speculatively (/metrics: steps, accepted histogram);
//   - a repeated prompt is restored from the prefix cache (cached_tokens) and still answers the
//     same (the restored sequence's draft restarts with no context rows);
//   - a sampled request (temperature > 0, seeded) decodes plainly and matches the plain server;
//   - a third server with `--speculative-token-budget 3` (MODEL_SPEC 3.10.9: at most 3 candidates
//     verified per engine step over all sequences, < one block) answers concurrent greedy requests
//     the same, and /metrics counts the candidates the budget cut.
//
//   node --test openai_speculative.test.js   with DS41=<ds41 binary> DS41_SHARED=<../shared>
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const OpenAI = require('openai');
const S = require('../serve_support/ds41_server.js');

const DS41 = process.env.DS41;
const SHARED = process.env.DS41_SHARED;
if (!DS41 || !SHARED) throw new Error('set DS41 (the binary) and DS41_SHARED (the shared folder)');

const KEY = 'sk-e2e-spec';
const AUTH = { Authorization: `Bearer ${KEY}` };
const MODEL_DIR = path.join(SHARED, 'golden', 'v41-tiny-dspark-public');
let spec, plain, budget, specClient, plainClient, budgetClient;

// Token-id prompts (the golden model's vocabulary is 2048 ids): a fixed LCG, ids in [3, 2047].
function ids(n, seed) {
  const out = [0];
  let s = seed >>> 0;
  while (out.length < n) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out.push(3 + (s % 2045));
  }
  return out;
}

test.before(async () => {
  const common = ['--api-key', KEY, '--served-model-name', 'tiny', '--tokenizer',
    path.join(SHARED, 'tokenizer-v41'), '-q'];
  spec = await S.startServer(DS41, MODEL_DIR, [...common, '--speculative', 'dspark']);
  plain = await S.startServer(DS41, MODEL_DIR, [...common, '--speculative', 'off']);
  budget = await S.startServer(DS41, MODEL_DIR,
    [...common, '--speculative', 'dspark', '--speculative-token-budget', '3']);
  const opts = { apiKey: KEY, maxRetries: 0, timeout: 120000 };
  specClient = new OpenAI({ ...opts, baseURL: spec.url + '/v1' });
  plainClient = new OpenAI({ ...opts, baseURL: plain.url + '/v1' });
  budgetClient = new OpenAI({ ...opts, baseURL: budget.url + '/v1' });
});

test.after(async () => {
  for (const srv of [spec, plain, budget]) {
    if (!srv) continue;
    const r = await srv.stop('SIGTERM');
    assert.equal(r.code, 0, 'ds41 serve exit code on SIGTERM:\n' + srv.stderr());
  }
});

const ask = (client, prompt, extra = {}) =>
  client.completions.create({ model: 'tiny', prompt, max_tokens: 40, temperature: 0, ...extra });

test('greedy answers are the same with and without --speculative dspark', async () => {
  for (const [n, seed] of [[40, 1], [150, 2], [300, 3]]) {
    const p = ids(n, seed);
    const [a, b] = await Promise.all([ask(specClient, p), ask(plainClient, p)]);
    assert.equal(a.choices[0].text, b.choices[0].text, `prompt of ${n} tokens`);
    assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
    assert.equal(a.usage.prompt_tokens, n);
  }
  const m = await S.metrics(spec.url, AUTH);
  assert.ok(m.ds41_spec_decode_steps_total > 0, 'the speculative server ran speculative steps');
  let hist = 0;
  for (const [k, v] of Object.entries(m)) if (k.startsWith('ds41_spec_decode_accepted_total{')) hist += v;
  assert.equal(hist, m.ds41_spec_decode_steps_total, 'the acceptance histogram counts every step');
  assert.ok(m.ds41_spec_decode_mean_accepted_length >= 0);
  const mp = await S.metrics(plain.url, AUTH);
  assert.equal(mp.ds41_spec_decode_steps_total, 0, 'the plain server never decodes speculatively');
});

test('a repeated prompt is restored from the prefix cache and answers the same', async () => {
  const p = ids(300, 3);  // asked in the first test
  const before = (await S.metrics(spec.url, AUTH)).ds41_spec_decode_steps_total;
  const again = await ask(specClient, p);
  const ref = await ask(plainClient, p);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens >= 256,
    'cached_tokens ' + again.usage.prompt_tokens_details.cached_tokens);
  assert.equal(again.choices[0].text, ref.choices[0].text);
  const after = (await S.metrics(spec.url, AUTH)).ds41_spec_decode_steps_total;
  assert.ok(after > before, 'the restored request decoded speculatively');
});

test('a sampled request decodes plainly and matches the plain server for the same seed', async () => {
  const p = ids(120, 7);
  const extra = { temperature: 0.8, seed: 1234, max_tokens: 24 };
  const [a, b] = await Promise.all([ask(specClient, p, extra), ask(plainClient, p, extra)]);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('--speculative-token-budget cuts verify lengths and keeps the greedy answers', async () => {
  const prompts = [ids(60, 11), ids(90, 12), ids(140, 13)];
  const [got, want] = await Promise.all([
    Promise.all(prompts.map((p) => ask(budgetClient, p))),
    Promise.all(prompts.map((p) => ask(plainClient, p))),
  ]);
  for (let i = 0; i < prompts.length; ++i)
    assert.equal(got[i].choices[0].text, want[i].choices[0].text, `prompt ${i}`);
  const m = await S.metrics(budget.url, AUTH);
  assert.ok(m.ds41_spec_decode_steps_total > 0, 'the budget server decoded speculatively');
  assert.ok(m.ds41_spec_decode_verified_tokens_total > 0, 'candidates were verified');
  assert.ok(m.ds41_spec_decode_budget_cut_tokens_total > 0, 'the budget cut candidates');
  const ms = await S.metrics(spec.url, AUTH);
  assert.equal(ms.ds41_spec_decode_budget_cut_tokens_total, 0, 'no budget: nothing cut');
});
