// e2e (issue 13): the prefix cache through `ds41 serve` with the official `openai` npm client, on
// the tiny model (window 8, top-k 8, candidate pool 6 x 2: prompts of a few hundred tokens exceed
// every limit). Greedy outputs are compared token for token (logprobs token strings + text) with
// a server started with --no-prefix-cache.
//
//   node --test prefix_cache.test.js   with DS41=<ds41 binary> DS41_SHARED=<../shared>
//   DS41_REDIS=1 also runs the two-Redis-node test (needs redis-server; ctest label `redis`).
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const net = require('node:net');
const { spawn } = require('node:child_process');
const OpenAI = require(path.join(__dirname, '..', 'openai_client', 'node_modules', 'openai'));
const S = require('../serve_support/ds41_server.js');

const DS41 = process.env.DS41;
const SHARED = process.env.DS41_SHARED;
if (!DS41 || !SHARED) throw new Error('set DS41 (the binary) and DS41_SHARED (the shared folder)');
const REDIS_ONLY = process.env.DS41_REDIS === '1';

const KEY = 'sk-e2e-cache';
let tiny;
const tmpDirs = [];
test.before(() => { tiny = S.makeTinyModel(DS41, SHARED, 3); });
test.after(() => {
  if (tiny) tiny.remove();
  for (const d of tmpDirs) fs.rmSync(d, { recursive: true, force: true });
});

function tmpDir(tag) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), `ds41-e2e-${tag}-`));
  tmpDirs.push(d);
  return d;
}

// Deterministic filler text: `n` words from a small vocabulary (roughly one token per word).
function words(n, seed) {
  const vocab = ['alpha', 'river', 'stone', 'cloud', 'seven', 'orange', 'build', 'kernel', 'cache', 'token',
    'window', 'ratio', 'block', 'green', 'north', 'paper', 'light', 'quiet', 'metal', 'forest', 'value', 'index'];
  let x = seed * 2654435761 % 4294967296;
  const out = [];
  for (let i = 0; i < n; ++i) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out.push(vocab[x % vocab.length]);
  }
  return out.join(' ');
}

async function start(extra) {
  const srv = await S.startServer(DS41, tiny.model, ['--api-key', KEY, '--served-model-name', 'tiny', ...extra]);
  srv.client = new OpenAI({ apiKey: KEY, baseURL: srv.url + '/v1', maxRetries: 0, timeout: 120000 });
  return srv;
}

async function stop(srv) {
  const r = await srv.stop('SIGTERM');
  assert.equal(r.code, 0, 'ds41 serve exit code on SIGTERM:\n' + srv.stderr());
}

// Greedy chat completion -> { tokens (token strings), text, usage, finish }.
async function chat(srv, messages, maxTokens = 8) {
  const r = await srv.client.chat.completions.create({
    model: 'tiny', messages, max_tokens: maxTokens, temperature: 0, logprobs: true, top_logprobs: 0,
    chat_template_kwargs: { thinking: false },
  });
  const c = r.choices[0];
  return { tokens: c.logprobs.content.map((t) => t.token), text: c.message.content ?? '', usage: r.usage,
    finish: c.finish_reason };
}

async function metric(srv, name) {
  const m = await S.metrics(srv.url, { Authorization: `Bearer ${KEY}` });
  return m[name] ?? 0;
}

async function chatIds(srv, messages) {
  const r = await fetch(srv.url + '/tokenize', {
    method: 'POST', headers: { Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ messages, chat_template_kwargs: { thinking: false } }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).tokens;
}

const conversation = (seed) => [
  { role: 'system', content: 'You are an agent. ' + words(320, seed) },
  { role: 'user', content: 'Task: ' + words(30, seed + 1) },
];

test('multi-turn agent session: token-identical to a cold server, SWA hits, cached >= 90% of the previous context',
  { skip: REDIS_ONLY }, async () => {
    const cached = await start([]);
    const cold = await start(['--no-prefix-cache']);
    try {
      const messages = conversation(1);
      let prevContext = 0, prevIds = null;
      for (let turn = 0; turn < 4; ++turn) {
        const ids = await chatIds(cached, messages);
        if (prevIds) assert.deepEqual(ids.slice(0, prevIds.length), prevIds, 'turn N+1 extends turn N');
        const a = await chat(cached, messages);
        const b = await chat(cold, messages);
        assert.deepEqual(a.tokens, b.tokens, `turn ${turn}: tokens differ from the cold server`);
        assert.equal(a.text, b.text);
        assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0);
        assert.equal(b.usage.ds41, undefined, 'no ds41 cache usage without a cache');
        if (turn > 0) {
          const c = a.usage.prompt_tokens_details.cached_tokens;
          assert.ok(c >= 0.9 * prevContext, `turn ${turn}: cached ${c} < 90% of the previous context ${prevContext}`);
          assert.equal(a.usage.ds41.swa, 'restored', JSON.stringify(a.usage));
          const t = a.usage.ds41.cached_tokens_by_tier;
          assert.equal(t.engine + t.dram + t.disk + t.swa_snapshot, c);
        }
        prevContext = a.usage.prompt_tokens + a.usage.completion_tokens;
        prevIds = ids;
        messages.push({ role: 'assistant', content: a.text });
        messages.push({ role: 'user', content: 'Tool output: ' + words(60, 10 + turn) });
      }
      assert.ok(await metric(cached, 'ds41_prompt_cached_tokens_total') > 0);
      assert.equal(await metric(cached, 'ds41_prefix_cache_swa_total{result="restored"}'), 3);
    } finally {
      await stop(cached);
      await stop(cold);
    }
  });

test('two concurrent requests sharing a prefix compute it once', { skip: REDIS_ONLY }, async () => {
  const srv = await start([]);
  try {
    const a = conversation(5), b = conversation(5);
    a[1].content = 'First task: ' + words(40, 7);
    b[1].content = 'Second task: ' + words(50, 8);
    const [ra, rb] = await Promise.all([chat(srv, a, 4), chat(srv, b, 4)]);
    const P = ra.usage.prompt_tokens + rb.usage.prompt_tokens;
    const computed = await metric(srv, 'ds41_prefill_tokens_computed_total');
    const cachedSum = ra.usage.prompt_tokens_details.cached_tokens + rb.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cachedSum >= 256, `the shared system prompt (${cachedSum} cached) was computed twice`);
    assert.equal(computed, P - cachedSum);
    // Same outputs as each alone on a cold server.
    const cold = await start(['--no-prefix-cache']);
    try {
      assert.deepEqual((await chat(cold, a, 4)).tokens, ra.tokens);
      assert.deepEqual((await chat(cold, b, 4)).tokens, rb.tokens);
    } finally {
      await stop(cold);
    }
  } finally {
    await stop(srv);
  }
});

test('--prefill-mode decoder-replay serves and meters the prefill', { skip: REDIS_ONLY }, async () => {
  const srv = await start(['--prefill-mode', 'decoder-replay']);
  try {
    const r = await chat(srv, conversation(40), 4);
    assert.ok(r.tokens.length > 0);
    assert.equal(await metric(srv, 'ds41_prefill_tokens_computed_total'), r.usage.prompt_tokens);
    const again = await chat(srv, conversation(40), 4);
    assert.deepEqual(again.tokens, r.tokens, 'a repeat restores the (approximate) state exactly');
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens - 1);
  } finally {
    await stop(srv);
  }
});

test('restart with the same --kv-dir: persistent tier serves, replay counted; recompute is exact; a corrupt block is a miss',
  { skip: REDIS_ONLY }, async () => {
    const dir = tmpDir('kvdir');
    const messages = conversation(20);
    const a = await start(['--kv-dir', dir]);
    const first = await chat(a, messages, 6);
    await stop(a);  // SIGTERM drains the write queue
    assert.doesNotMatch(a.stderr(), /did not drain/);
    const blockFiles = () => fs.readdirSync(path.join(dir, 'blocks'), { recursive: true })
      .filter((f) => String(f).endsWith('.kvb')).map((f) => path.join(dir, 'blocks', String(f)));
    const nBlocks = Math.floor((first.usage.prompt_tokens + first.usage.completion_tokens - 1) / 128);
    assert.equal(blockFiles().length, nBlocks, 'every full block of the first request is on disk after SIGTERM');

    const b = await start(['--kv-dir', dir]);  // --swa-miss replay (default); the SWA pool is empty
    try {
      const r = await chat(b, messages, 6);
      const expect = Math.floor((first.usage.prompt_tokens - 1) / 128) * 128;
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, expect);
      assert.equal(r.usage.ds41.swa, 'replayed');
      assert.equal(r.usage.ds41.cached_tokens_by_tier.disk, expect);
      assert.equal(await metric(b, 'ds41_prefix_cache_swa_total{result="replayed"}'), 1);
    } finally {
      await stop(b);
    }

    const c = await start(['--kv-dir', dir, '--swa-miss', 'recompute']);
    try {
      const r = await chat(c, messages, 6);
      assert.deepEqual(r.tokens, first.tokens, 'recompute after a restart is token-identical to cold');
      assert.equal(r.usage.ds41.swa, 'recomputed');
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    } finally {
      await stop(c);
    }

    // Flip one byte in the payload of every exact block file: the first read is a miss, the file
    // is deleted, the request is recomputed and still exact.
    for (const f of blockFiles()) {
      const buf = fs.readFileSync(f);
      buf[200] ^= 0x01;
      fs.writeFileSync(f, buf);
    }
    const d = await start(['--kv-dir', dir]);
    try {
      const r = await chat(d, messages, 6);
      assert.deepEqual(r.tokens, first.tokens, 'a corrupt block never reaches the answer');
      assert.ok(await metric(d, 'ds41_kv_disk_checksum_failures_total') >= 1);
      assert.ok(await metric(d, 'ds41_kv_disk_evictions_total{reason="corrupt"}') >= 1);
    } finally {
      await stop(d);
    }
  });

// --numerics is part of the model identity: KV computed with FP8 activations never serves an exact request and
// the reverse, over one --kv-dir; each mode's blocks serve its own later requests.
test('--numerics fp8-act and exact never share cached blocks', { skip: REDIS_ONLY }, async () => {
  const dir = tmpDir('kvdir_numerics');
  const messages = conversation(31);
  const a = await start(['--kv-dir', dir]);
  const first = await chat(a, messages, 4);
  await stop(a);
  const expect = Math.floor((first.usage.prompt_tokens - 1) / 128) * 128;
  assert.ok(expect > 0);
  const b = await start(['--kv-dir', dir, '--numerics', 'fp8-act']);
  let f8;
  try {
    f8 = await chat(b, messages, 4);
    assert.equal(f8.usage.prompt_tokens_details.cached_tokens, 0, 'fp8-act read the exact server\'s blocks');
  } finally {
    await stop(b);
  }
  const c = await start(['--kv-dir', dir, '--numerics', 'fp8-act']);
  try {
    const r = await chat(c, messages, 4);
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, expect, 'fp8-act blocks serve fp8-act');
    assert.equal(r.usage.ds41.swa, 'replayed');  // approximate (MODEL_SPEC 4.5): tokens may differ from f8's
  } finally {
    await stop(c);
  }
  const d = await start(['--kv-dir', dir, '--swa-miss', 'recompute']);
  try {
    const r = await chat(d, messages, 4);
    assert.deepEqual(r.tokens, first.tokens, 'the exact server after fp8-act ones: still the exact answer');
  } finally {
    await stop(d);
  }
});

// ---------------------------------------------------------------- Redis (label `redis`)

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
    s.on('error', reject);
  });
}

async function startRedis() {
  const port = await freePort();
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no'], { stdio: 'ignore' });
  const up = await S.waitFor(() => new Promise((res) => {
    const c = net.connect(port, '127.0.0.1', () => { c.end(); res(true); });
    c.on('error', () => res(false));
  }), 10000);
  assert.ok(up, 'redis-server did not come up');
  return { proc, addr: `127.0.0.1:${port}`, kill: () => { try { proc.kill('SIGKILL'); } catch { /* gone */ } } };
}

test('two Redis nodes shared by two servers: exact SWA restore across processes; a node killed is a miss, no hang',
  { skip: !REDIS_ONLY }, async () => {
    const r1 = await startRedis(), r2 = await startRedis();
    const dir = tmpDir('kvdir-redis');
    const flags = ['--kv-dir', dir, '--kv-redis', `${r1.addr},${r2.addr}`];
    let a, b;
    try {
      a = await start(flags);
      const messages = conversation(30);
      const cold = await chat(a, messages, 6);
      assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
      const want = Math.floor((cold.usage.prompt_tokens + cold.usage.completion_tokens - 1) / 128);
      await S.waitFor(() => fs.readdirSync(path.join(dir, 'blocks'), { recursive: true })
        .filter((f) => String(f).endsWith('.kvb')).length >= want, 10000);
      b = await start(flags);
      const r = await chat(b, messages, 6);
      assert.deepEqual(r.tokens, cold.tokens, 'a second server restores the first one\'s SWA state exactly');
      assert.equal(r.usage.ds41.swa, 'restored');
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, cold.usage.prompt_tokens - 1);
      r1.kill();
      const t0 = Date.now();
      const other = await chat(b, conversation(31), 4);
      assert.ok(other.tokens.length > 0);
      const again = await chat(b, messages, 6);
      assert.ok(['restored', 'replayed'].includes(again.usage.ds41.swa));
      assert.ok(Date.now() - t0 < 60000, 'requests with a Redis node down answered without hanging');
      const m = await S.metrics(b.url, { Authorization: `Bearer ${KEY}` });
      const errors = Object.entries(m).filter(([k]) => k.startsWith('ds41_kv_swa_redis_errors_total'))
        .reduce((s, [, v]) => s + v, 0);
      assert.ok(errors >= 1, 'the dead node is counted');
    } finally {
      if (a) await stop(a);
      if (b) await stop(b);
      r1.kill();
      r2.kill();
    }
  });
