// e2e (issue 16): the official `openai` npm client sends images to `ds41 serve` on the tiny-vision
// model (tiny + a one-block vision tower, CPU engine) as data: URLs in image_url content parts.
//   - an image gets an answer, and usage.prompt_tokens counts the image's span positions;
//   - the same request again is restored from the prefix cache (image-aware block keys): the
//     tower does not run; the same image after another question is a vision-feature cache hit
//     (/metrics), the tower ran once;
//   - a corrupt image is a 400 that names the problem; an http URL without --allow-image-urls
//     and an unknown `detail` are 400s.
//
//   node --test openai_vision.test.js   with DS41=<ds41 binary> DS41_SHARED=<../shared>
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

const KEY = 'sk-e2e-vision';
const AUTH = { Authorization: `Bearer ${KEY}` };
let tiny, srv, client;

// A 157x101 RGB PNG of the public vision golden set (golden README "Images and their plans").
const png = fs.readFileSync(path.join(SHARED, 'golden', 'v41-tiny-vision-public', 'images', 'image2.png'));
const dataUrl = 'data:image/png;base64,' + png.toString('base64');

test.before(async () => {
  tiny = S.makeTinyModel(DS41, SHARED, 3, 'tiny-vision');
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

const body = (url, extra = {}, question = 'What is in this picture?') => ({
  model: 'tiny',
  messages: [{ role: 'user', content: [
    { type: 'text', text: question },
    { type: 'image_url', image_url: { url, detail: 'low', ...extra } },
  ] }],
  max_tokens: 6, temperature: 0, chat_template_kwargs: { thinking: false },
});
const ask = (url, extra = {}, question) => client.chat.completions.create(body(url, extra, question));

test('a data-URL image gets an answer; usage counts its span positions', async () => {
  // /tokenize renders the same chat body with the image as one placeholder token.
  const t = await fetch(srv.url + '/tokenize', { method: 'POST', headers: AUTH, body: JSON.stringify(body(dataUrl)) });
  assert.equal(t.status, 200, await t.clone().text());
  const withPlaceholder = (await t.json()).tokens.length;
  const r = await ask(dataUrl);
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  // 157x101 at the tiny-vision budget (max 64 positions, min 84^2 pixels): box 112x168 ->
  // aligner grid 3x4 -> 3 * (4 + 1) + 2 = 17 span positions, in place of the placeholder token.
  assert.equal(r.usage.prompt_tokens, withPlaceholder - 1 + 17);
  const m = await S.metrics(srv.url, AUTH);
  assert.equal(m.ds41_images_encoded_total, 1);
  assert.equal(m.ds41_vision_cache_misses_total, 1);
  assert.equal(m.ds41_vision_cache_hits_total, 0);
  assert.equal(m.ds41_image_tokens_total, 17);
  // Encoded off the loop thread by the image encoder (engine/image_encoder.h), which is idle again.
  assert.equal(m.ds41_image_encoder_queue_depth, 0);
  assert.ok(m.ds41_image_encoder_busy_seconds_total > 0, 'the encoder ran the tower');
});

test('the same request again is restored from the prefix cache: the tower does not run', async () => {
  const first = await ask(dataUrl);
  const r = await ask(dataUrl);
  assert.equal(r.choices[0].message.content, first.choices[0].message.content);
  // Image-aware block keys (docs/formats/kv_block.md): all but the last prompt position restored.
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens - 1);
  const m = await S.metrics(srv.url, AUTH);
  assert.equal(m.ds41_images_encoded_total, 1);
  assert.equal(m.ds41_vision_cache_hits_total, 0, 'a restore covering the image needs no span rows');
});

test('the same image after another question hits the vision-feature cache (the tower runs once)', async () => {
  // The text before the image differs, so no cached block covers the image: its span rows come
  // from the feature cache.
  const r = await ask(dataUrl, {}, 'Describe the colours, please.');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens - 17);
  const m = await S.metrics(srv.url, AUTH);
  assert.equal(m.ds41_vision_cache_hits_total, 1);
  assert.equal(m.ds41_images_encoded_total, 1);
  assert.equal(m.ds41_vision_cache_entries, 1);
});

test('a corrupt image is a 400 naming the problem', async () => {
  const broken = 'data:image/png;base64,' + png.subarray(0, png.length >> 1).toString('base64');
  await assert.rejects(ask(broken), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /PNG/);
    return true;
  });
  await assert.rejects(ask('data:image/png;base64,bm90IGFuIGltYWdl'), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /not a supported image/);
    return true;
  });
});

test('http URLs are off by default, and detail must be auto/low/high', async () => {
  await assert.rejects(ask('http://127.0.0.1:1/x.png'), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /--allow-image-urls/);
    return true;
  });
  await assert.rejects(ask(dataUrl, { detail: 'ultra' }), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /detail/);
    return true;
  });
});
