// e2e (issue 12): the official `openai` npm client against `ds41 serve` on the tiny model (CPU
// engine). Outputs are checked against `ds41 generate` with the same prompt tokens, seed and
// sampling parameters: the same tokens must come out (same text, same token count).
//
//   node --test openai_client.test.js   with DS41=<ds41 binary> DS41_SHARED=<../shared>
//
// Thinking mode: the server's default is thinking ON (text::ChatOptions, documented in the
// README), `ds41 generate --chat` defaults to chat mode and turns thinking on only with --effort;
// every chat request below sets chat_template_kwargs.thinking explicitly so the two agree.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const OpenAI = require('openai');
const S = require('../serve_support/ds41_server.js');

const DS41 = process.env.DS41;
const SHARED = process.env.DS41_SHARED;
if (!DS41 || !SHARED) throw new Error('set DS41 (the binary) and DS41_SHARED (the shared folder)');

// `ds41 generate` skips special tokens when it prints, the server keeps them (the router needs
// </think> and DSML markers): strip the tokenizer's special tokens before comparing texts.
const SPECIALS = JSON.parse(fs.readFileSync(path.join(SHARED, 'tokenizer-v41', 'tokenizer.json'), 'utf8'))
  .added_tokens.filter((t) => t.special).map((t) => t.content).sort((a, b) => b.length - a.length);
const stripSpecials = (s) => SPECIALS.reduce((acc, sp) => acc.split(sp).join(''), s);

const KEY = 'sk-e2e-test';
let tiny, srv, client;

test.before(async () => {
  tiny = S.makeTinyModel(DS41, SHARED, 1);
  srv = await S.startServer(DS41, tiny.model, ['--api-key', KEY, '--served-model-name', 'tiny']);
  client = new OpenAI({ apiKey: KEY, baseURL: srv.url + '/v1', maxRetries: 0, timeout: 120000 });
});

test.after(async () => {
  if (srv) {
    const r = await srv.stop('SIGTERM');
    assert.equal(r.code, 0, 'ds41 serve exit code on SIGTERM:\n' + srv.stderr());
  }
  if (tiny) tiny.remove();
});

// Token ids of a raw prompt (BOS + text), as `ds41 generate --prompt` builds it.
async function rawIds(text) {
  const r = await fetch(srv.url + '/tokenize', {
    method: 'POST', headers: { Authorization: `Bearer ${KEY}` }, body: JSON.stringify({ prompt: text }),
  });
  assert.equal(r.status, 200);
  const ids = (await r.json()).tokens;
  return ids[0] === 0 ? ids : [0, ...ids];
}

// Token ids the chat route builds for `body` (same template, tools, thinking and effort).
async function chatIds(body) {
  const r = await fetch(srv.url + '/tokenize', {
    method: 'POST', headers: { Authorization: `Bearer ${KEY}` }, body: JSON.stringify(body),
  });
  assert.equal(r.status, 200, await r.clone().text());
  return (await r.json()).tokens;
}

// Server completion_tokens counts a terminating EOS, `ds41 generate` does not.
function assertSameCount(usage, finish, gen) {
  assert.equal(usage.completion_tokens, gen.decoded + (finish === 'stop' ? 1 : 0),
    `completion_tokens ${usage.completion_tokens} vs generate's ${gen.decoded} (finish ${finish})`);
}

test('GET /v1/models lists the served model name', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ['tiny']);
});

test('wrong or missing key is 401 (AuthenticationError); /health needs no key', async () => {
  const bad = new OpenAI({ apiKey: 'sk-wrong', baseURL: srv.url + '/v1', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(
    bad.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }),
    (e) => e.status === 401 && e.error && e.error.type === 'authentication_error');
  const r = await fetch(srv.url + '/v1/models');
  assert.equal(r.status, 401);
  assert.equal((await r.json()).error.code, 'invalid_api_key');
  assert.equal((await fetch(srv.url + '/health')).status, 200);
});

test('chat non-stream and stream, thinking off, equal `ds41 generate --chat` (greedy)', async () => {
  const prompt = 'Name three colours.';
  const body = { model: 'tiny', messages: [{ role: 'user', content: prompt }], max_tokens: 16, temperature: 0,
    chat_template_kwargs: { thinking: false } };
  const r = await client.chat.completions.create(body);
  const gen = S.generate(DS41, ['--model', tiny.model, '--chat', '--prompt', prompt, '--max-tokens', '16']);
  const msg = r.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.reasoning_content, undefined, 'no reasoning_content in chat mode');
  assert.equal(stripSpecials(msg.content), gen.text);
  assertSameCount(r.usage, r.choices[0].finish_reason, gen);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(r.usage.prompt_tokens, (await chatIds(body)).length);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);

  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let content = '', finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    ++chunks;
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    content += c.choices[0].delta.content || '';
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.ok(chunks >= 3, 'several chunks');
  assert.equal(content, msg.content, 'streamed text = non-streamed text');
  assert.equal(finish, r.choices[0].finish_reason);
  // The same prompt again: the prefix cache (on by default) restores all but its last token.
  const { prompt_tokens_details: cachedDetails, ds41: cacheUsage, ...rest } = usage;
  const { prompt_tokens_details: coldDetails, ds41: coldCache, ...coldRest } = r.usage;
  assert.deepEqual(rest, coldRest);
  assert.equal(coldDetails.cached_tokens, 0);
  assert.equal(coldCache.swa, 'none');
  assert.equal(cachedDetails.cached_tokens, r.usage.prompt_tokens - 1);
  assert.equal(cacheUsage.swa, 'restored');
});

test('chat with seeded sampling (temperature, top_p, top_k, seed) equals `ds41 generate`', async () => {
  const prompt = 'Tell me a story.';
  const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: prompt }],
    max_tokens: 12, temperature: 0.9, top_p: 0.95, top_k: 50, seed: 7, chat_template_kwargs: { thinking: false } });
  const gen = S.generate(DS41, ['--model', tiny.model, '--chat', '--prompt', prompt, '--max-tokens', '12',
    '--temperature', '0.9', '--top-p', '0.95', '--top-k', '50', '--seed', '7']);
  assert.equal(stripSpecials(r.choices[0].message.content), gen.text);
  assertSameCount(r.usage, r.choices[0].finish_reason, gen);
  const other = S.generate(DS41, ['--model', tiny.model, '--chat', '--prompt', prompt, '--max-tokens', '12',
    '--temperature', '0.9', '--top-p', '0.95', '--top-k', '50', '--seed', '8']);
  assert.notEqual(other.text, gen.text, 'another seed gives another text (the comparison can fail)');
});

test('reasoning: thinking on with each effort tier returns reasoning_content = `generate --effort`', async () => {
  const prompt = 'Why is the sky blue?';
  const promptLens = new Set();
  for (const effort of ['low', 'high', 'max', 42]) {
    const body = { model: 'tiny', messages: [{ role: 'user', content: prompt }], max_tokens: 10, temperature: 0,
      reasoning_effort: effort, chat_template_kwargs: { thinking: true } };
    const r = await client.chat.completions.create(body);
    const msg = r.choices[0].message;
    assert.equal(typeof msg.reasoning_content, 'string', `reasoning_content present (effort ${effort})`);
    const gen = S.generate(DS41, ['--model', tiny.model, '--chat', '--prompt', prompt, '--max-tokens', '10',
      '--effort', String(effort)]);
    // generate prints the reasoning under "--- thinking ---" and, after </think> (an ordinary
    // token, not printed), the answer under "--- answer ---".
    const shown = `--- thinking ---\n${msg.reasoning_content}` +
      (msg.content ? `\n--- answer ---\n${msg.content}` : '');
    assert.equal(stripSpecials(shown), gen.text, `effort ${effort}`);
    assertSameCount(r.usage, r.choices[0].finish_reason, gen);
    assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
    assert.equal(r.usage.prompt_tokens, (await chatIds(body)).length);
    promptLens.add((await chatIds(body)).join(','));
  }
  assert.equal(promptLens.size, 4, 'each effort tier renders a different prompt');
  // enable_thinking (SGLang / vLLM spelling) switches it too; thinking off has no reasoning.
  const on = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: prompt }],
    max_tokens: 4, temperature: 0, chat_template_kwargs: { enable_thinking: true } });
  assert.equal(typeof on.choices[0].message.reasoning_content, 'string');
  const off = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: prompt }],
    max_tokens: 4, temperature: 0, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(off.choices[0].message.reasoning_content, undefined);
  assert.equal(off.usage.completion_tokens_details.reasoning_tokens, 0);
  // Streaming carries it as delta.reasoning_content.
  const stream = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: prompt }],
    max_tokens: 10, temperature: 0, reasoning_effort: 'high', chat_template_kwargs: { thinking: true }, stream: true });
  let reasoning = '';
  for await (const c of stream) reasoning += (c.choices[0] && c.choices[0].delta.reasoning_content) || '';
  const ref = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: prompt }],
    max_tokens: 10, temperature: 0, reasoning_effort: 'high', chat_template_kwargs: { thinking: true } });
  assert.equal(reasoning, ref.choices[0].message.reasoning_content);
  // Out-of-range effort is a 400 naming the field.
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: prompt }],
    max_tokens: 2, reasoning_effort: 101 }), (e) => e.status === 400 && e.param === 'reasoning_effort');
});

test('max_tokens -> finish_reason length; max_completion_tokens wins', async () => {
  const body = { model: 'tiny', messages: [{ role: 'user', content: 'Count to ten.' }], temperature: 0,
    chat_template_kwargs: { thinking: false }, ignore_eos: true };
  const r = await client.chat.completions.create({ ...body, max_tokens: 3 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 3);
  const r2 = await client.chat.completions.create({ ...body, max_tokens: 9, max_completion_tokens: 2 });
  assert.equal(r2.choices[0].finish_reason, 'length');
  assert.equal(r2.usage.completion_tokens, 2);
});

test('stop strings cut the text where they first appear (chat and stream)', async () => {
  const body = { model: 'tiny', messages: [{ role: 'user', content: 'Write a sentence.' }], temperature: 0,
    max_tokens: 24, chat_template_kwargs: { thinking: false }, ignore_eos: true };
  const full = (await client.chat.completions.create(body)).choices[0].message.content;
  const chars = Array.from(full);
  assert.ok(chars.length >= 8, 'enough text to cut: ' + JSON.stringify(full));
  const stop = chars.slice(4, 6).join('');
  const at = full.indexOf(stop);
  const r = await client.chat.completions.create({ ...body, stop: [stop, 'never-appears-xyz'] });
  assert.equal(r.choices[0].message.content, full.slice(0, at));
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.completion_tokens < 24);
  const stream = await client.chat.completions.create({ ...body, stop, stream: true });
  let content = '', finish = null;
  for await (const c of stream) {
    content += (c.choices[0] && c.choices[0].delta.content) || '';
    if (c.choices[0] && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(content, full.slice(0, at));
  assert.equal(finish, 'stop');
});

test('logprobs and top_logprobs (chat, greedy: the chosen token is the most likely)', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    temperature: 0, max_tokens: 6, logprobs: true, top_logprobs: 5, ignore_eos: true,
    chat_template_kwargs: { thinking: false } });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 6);
  assert.equal(lp.map((t) => t.token).join(''), r.choices[0].message.content);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 5);
    for (let i = 1; i < 5; ++i) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
    assert.equal(t.top_logprobs[0].token, t.token);
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5);
    assert.deepEqual(t.bytes, Array.from(Buffer.from(t.token, 'utf8')));
  }
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 2, logprobs: true, top_logprobs: 21 }), (e) => e.status === 400);
});

test('/v1/completions: token ids equal `generate --prompt-ids`; string; batch; echo; logprobs', async () => {
  const ids1 = await rawIds('The capital of France is');
  const ids2 = await rawIds('Once upon a time');
  const gen1 = S.generate(DS41, ['--model', tiny.model, '--prompt-ids', ids1.join(','), '--max-tokens', '12']);
  const gen2 = S.generate(DS41, ['--model', tiny.model, '--prompt-ids', ids2.join(','), '--max-tokens', '12']);
  assert.notEqual(gen1.text, gen2.text);
  const one = await client.completions.create({ model: 'tiny', prompt: ids1, max_tokens: 12, temperature: 0 });
  assert.equal(stripSpecials(one.choices[0].text), gen1.text);
  assertSameCount(one.usage, one.choices[0].finish_reason, gen1);
  assert.equal(one.usage.prompt_tokens, ids1.length);
  // `ds41 generate --prompt TEXT` is BOS + the text: the same as a string prompt that spells the BOS.
  const genText = S.generate(DS41, ['--model', tiny.model, '--prompt', 'The capital of France is', '--max-tokens', '12']);
  assert.equal(genText.text, gen1.text);
  const str = await client.completions.create({ model: 'tiny', prompt: '<｜begin▁of▁sentence｜>The capital of France is',
    max_tokens: 12, temperature: 0 });
  assert.equal(str.choices[0].text, one.choices[0].text);
  // A batch of two id prompts: one choice each, in order, each equal to its own generate.
  const batch = await client.completions.create({ model: 'tiny', prompt: [ids1, ids2], max_tokens: 12, temperature: 0 });
  assert.deepEqual(batch.choices.map((c) => c.index), [0, 1]);
  assert.equal(stripSpecials(batch.choices[0].text), gen1.text);
  assert.equal(stripSpecials(batch.choices[1].text), gen2.text);
  assert.equal(batch.usage.prompt_tokens, ids1.length + ids2.length);
  // A batch of strings.
  const sb = await client.completions.create({ model: 'tiny', prompt: ['a b c', 'x y z'], max_tokens: 3, temperature: 0 });
  assert.equal(sb.choices.length, 2);
  // echo: the prompt text comes first.
  const echo = await client.completions.create({ model: 'tiny', prompt: ids1, max_tokens: 12, temperature: 0, echo: true });
  assert.equal(echo.choices[0].text, '<｜begin▁of▁sentence｜>The capital of France is' + one.choices[0].text);
  // logprobs: tokens concatenate to the text; top alternatives per token.
  const lp = await client.completions.create({ model: 'tiny', prompt: ids1, max_tokens: 5, temperature: 0,
    logprobs: 3, ignore_eos: true });
  const l = lp.choices[0].logprobs;
  assert.equal(l.tokens.length, 5);
  assert.equal(l.tokens.join(''), lp.choices[0].text);
  assert.equal(l.token_logprobs.length, 5);
  for (const t of l.top_logprobs) assert.ok(Object.keys(t).length >= 1 && Object.keys(t).length <= 3);
  // Streaming completion text = non-streamed text.
  const stream = await client.completions.create({ model: 'tiny', prompt: ids1, max_tokens: 12, temperature: 0, stream: true });
  let text = '';
  for await (const c of stream) text += c.choices[0] ? c.choices[0].text : '';
  assert.equal(text, one.choices[0].text);
});

test('tools round trip: assistant tool_calls + tool message are accepted and answered = generate', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
  ];
  const body = { model: 'tiny', messages, tools, tool_choice: 'auto', max_tokens: 10, temperature: 0,
    chat_template_kwargs: { thinking: false } };
  const r = await client.chat.completions.create(body);
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  // The exact prompt the server built (tools rendered, tool result in the conversation) fed to
  // generate gives the same answer.
  const ids = await chatIds(body);
  const noTools = await chatIds({ ...body, tools: undefined, tool_choice: undefined });
  assert.ok(ids.length > noTools.length + 20, 'the tool schema is rendered into the prompt');
  assert.equal(r.usage.prompt_tokens, ids.length);
  const gen = S.generate(DS41, ['--model', tiny.model, '--prompt-ids', ids.join(','), '--max-tokens', '10']);
  const m = r.choices[0].message;
  assert.equal(stripSpecials(m.content || ''), gen.text);
  // Streamed too; a named tool_choice and "none" are accepted.
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let content = '';
  for await (const c of stream) content += (c.choices[0] && c.choices[0].delta.content) || '';
  assert.equal(content, m.content || '');
  await client.chat.completions.create({ ...body, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  await client.chat.completions.create({ ...body, tool_choice: 'none' });
  // A tool message answering no call, or an unknown role, is a clear 400.
  await assert.rejects(client.chat.completions.create({ ...body, messages: [{ role: 'robot', content: 'x' }] }),
    (e) => e.status === 400);
});

test('abort mid-stream (AbortController): the sequence is freed and the server keeps serving', async () => {
  const ac = new AbortController();
  const stream = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Go on.' }],
    max_tokens: 4000, ignore_eos: true, stream: true, chat_template_kwargs: { thinking: false } }, { signal: ac.signal });
  // The openai client ends the iteration quietly when its request is aborted.
  let chunks = 0;
  for await (const c of stream) { if (++chunks === 3) ac.abort(); void c; }
  assert.ok(ac.signal.aborted);
  assert.equal(chunks, 3, 'no chunk after the abort (the stream asked for 4000 tokens)');
  const auth = { Authorization: `Bearer ${KEY}` };
  const freed = await S.waitFor(async () => {
    const m = await S.metrics(srv.url, auth);
    return m.ds41_running_sequences === 0 && m.ds41_waiting_requests === 0;
  }, 10000);
  assert.ok(freed, 'running/waiting gauges back to 0 after the abort');
  const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 2, chat_template_kwargs: { thinking: false } });
  assert.equal(r.choices.length, 1);
});
