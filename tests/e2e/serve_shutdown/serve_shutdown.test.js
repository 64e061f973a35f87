// e2e (issue 12): SIGTERM while streams are running. The server stops accepting new generation
// requests, lets in-flight requests finish or aborts them within --shutdown-timeout, exits 0,
// leaves no child process and no file behind, and a restart on the same port works at once.
//
//   node --test serve_shutdown.test.js   with DS41=<ds41 binary> DS41_SHARED=<../shared>
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const S = require('../serve_support/ds41_server.js');

const DS41 = process.env.DS41;
const SHARED = process.env.DS41_SHARED;
if (!DS41 || !SHARED) throw new Error('set DS41 (the binary) and DS41_SHARED (the shared folder)');
const SHUTDOWN_S = 3;
// After the drain the server waits at most 1 s for cpp-httplib's stop() (idle keep-alive
// connections, which fetch keeps, would otherwise hold it for their 5 s idle timeout), then exits:
// the bound is the timeout + 1 s + 1 s of slack (it was timeout + 5 s before the fix).
const EXIT_BOUND_MS = (SHUTDOWN_S + 1 + 1) * 1000;

// Starts a streaming chat request; resolves when its first data event arrived, with a promise of
// how the stream ended: { done, finish, events, error, endedMs }.
async function startStream(url, maxTokens) {
  const r = await fetch(url + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', stream: true, max_tokens: maxTokens, ignore_eos: true, temperature: 0,
      messages: [{ role: 'user', content: 'Keep talking.' }], chat_template_kwargs: { thinking: false } }),
  });
  assert.equal(r.status, 200);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  const st = { done: false, finish: null, events: 0, error: null, endedMs: 0 };
  let firstResolve;
  const first = new Promise((res) => { firstResolve = res; });
  const ended = (async () => {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (!block.startsWith('data: ')) continue;
          const data = block.slice(6);
          if (data === '[DONE]') { st.done = true; continue; }
          const ev = JSON.parse(data);
          const c = ev.choices && ev.choices[0];
          if (c && c.finish_reason) st.finish = c.finish_reason;
          if (++st.events === 2) firstResolve();
        }
      }
    } catch (e) {
      st.error = String(e);
    }
    st.endedMs = Date.now();
    firstResolve();
    return st;
  })();
  await first;
  return { ended };
}

test('SIGTERM during streams: drain within --shutdown-timeout, exit 0, nothing left, restart at once', async () => {
  const tiny = S.makeTinyModel(DS41, SHARED, 1);
  const filesBefore = fs.readdirSync(tiny.model).sort();
  const srv = await S.startServer(DS41, tiny.model, ['--shutdown-timeout', String(SHUTDOWN_S)]);
  try {
    // Long streams (cannot finish within the timeout: aborted) and short ones (finish).
    const long = await Promise.all(Array.from({ length: 6 }, () => startStream(srv.url, 100000)));
    const short = await Promise.all(Array.from({ length: 2 }, () => startStream(srv.url, 12)));
    assert.deepEqual(S.childPids(srv.proc.pid), [], 'ds41 serve starts no child process');
    const t0 = Date.now();
    srv.proc.kill('SIGTERM');
    // New generation requests are refused while draining (503), or the port is already closed.
    await S.sleep(300);
    let refused;
    try {
      const r = await fetch(srv.url + '/v1/completions', { method: 'POST',
        body: JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: 2 }) });
      refused = r.status === 503 ? 'http 503' : `http ${r.status}`;
      if (r.status === 503) assert.ok(r.headers.get('retry-after'), 'Retry-After on the 503');
    } catch (e) {
      refused = 'connection refused';
    }
    assert.ok(refused === 'http 503' || refused === 'connection refused', `new request while draining: ${refused}`);
    const exit = await srv.exited;
    const exitMs = Date.now() - t0;
    console.log(`SIGTERM -> exit ${JSON.stringify(exit)} in ${exitMs} ms; new request: ${refused}`);
    assert.equal(exit.code, 0, srv.stderr());
    assert.ok(exitMs <= EXIT_BOUND_MS, `exited ${exitMs} ms after SIGTERM (timeout ${SHUTDOWN_S} s)`);
    for (const s of short) {
      const st = await s.ended;
      assert.ok(st.done && st.finish === 'length', 'a short stream finishes normally: ' + JSON.stringify(st));
    }
    for (const l of long) {
      const st = await l.ended;
      assert.ok(st.endedMs - t0 <= (SHUTDOWN_S + 2) * 1000, `a long stream ended within the timeout (${st.endedMs - t0} ms)`);
      // Either aborted cleanly (finish_reason abort + [DONE]) or cut when the server closed.
      assert.ok(!st.done || st.finish === 'abort', 'a long stream did not finish normally: ' + JSON.stringify(st));
    }
    // No orphans: the process is gone, nothing it started survives, no file added to the model dir.
    assert.equal(fs.existsSync(`/proc/${srv.proc.pid}`), false);
    assert.deepEqual(fs.readdirSync(tiny.model).sort(), filesBefore);
    // A restart on the same port works at once.
    const again = await S.startServer(DS41, tiny.model, [], { port: srv.port });
    try {
      assert.equal(again.port, srv.port);
      const r = await fetch(again.url + '/v1/completions', { method: 'POST',
        body: JSON.stringify({ model: 'tiny', prompt: 'Hello', max_tokens: 3 }) });
      assert.equal(r.status, 200);
      assert.equal((await r.json()).choices.length, 1);
    } finally {
      assert.equal((await again.stop('SIGINT')).code, 0, again.stderr());
    }
  } finally {
    if (srv.proc.exitCode === null && srv.proc.signalCode === null) srv.proc.kill('SIGKILL');
    tiny.remove();
  }
});
