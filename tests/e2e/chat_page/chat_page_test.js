// e2e: ds41's chat page (GET /) in Debian's headless Chromium, driven by puppeteer-core.
// Starts `ds41 serve` on the tiny model on a free port, opens the page, sends a message and checks
// the answer streamed in pieces with a tokens/s readout; a second turn with thinking on fills the
// collapsible reasoning section and sends the history; a long generation is stopped with the stop
// button (the text stops growing and the server's running sequences fall to 0). Writes a
// screenshot. Exit 0: pass, 1: failure (message on stderr).
//   node chat_page_test.js DS41_BINARY MODEL_DIR SCREENSHOT_PNG
"use strict";
const { spawn } = require("child_process");
const puppeteer = require("puppeteer-core");

const [ds41, modelDir, screenshot] = process.argv.slice(2);
const CHROMIUM = process.env.DS41_CHROMIUM || "/usr/bin/chromium";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function fail(msg) { throw new Error(msg); }

// Starts the server with --port 0 and resolves with its URL from the ready line.
function startServer() {
  const srv = spawn(ds41, ["serve", "--model", modelDir, "--port", "0", "--shutdown-timeout", "1", "-q"],
                    { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  srv.stderr.on("data", (d) => { stderr += d; });
  const url = new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error("server not ready in 60 s:\n" + stderr)), 60000);
    srv.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/ready on (http:\/\/[0-9.]+:[0-9]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    srv.on("exit", (code) => reject(new Error("server exited with " + code + ":\n" + stderr)));
  });
  return { srv, url };
}

async function runningSequences(url) {
  const text = await (await fetch(url + "/metrics")).text();
  const m = text.match(/^ds41_running_sequences\s+([0-9.e+]+)/m);
  if (!m) fail("no ds41_running_sequences in /metrics");
  return Number(m[1]);
}

async function main() {
  const { srv, url: urlPromise } = startServer();
  let browser = null;
  try {
    const url = await urlPromise;
    browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      headless: true,
      userDataDir: require("fs").mkdtempSync(require("os").tmpdir() + "/ds41-chromium-"),
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    const page = await browser.newPage();
    await page.setViewport({ width: 1000, height: 760 });
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(e.message));
    const posted = [];
    page.on("request", (r) => { if (r.url().endsWith("/v1/chat/completions")) posted.push(JSON.parse(r.postData())); });

    const resp = await page.goto(url + "/", { waitUntil: "load" });
    if (resp.status() !== 200) fail("GET / answered " + resp.status());
    if ((await page.title()) !== "ds41 chat") fail("unexpected title " + (await page.title()));
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("model:"), { timeout: 10000 });

    // Count how many times the answer's text grows while it streams.
    const watchGrowth = () => page.evaluate(() => {
      window.__growth = 0;
      const obs = new MutationObserver(() => { window.__growth++; });
      obs.observe(document.getElementById("log"), { childList: true, subtree: true, characterData: true });
    });
    const lastAssistant = () => page.evaluate(() => {
      const m = [...document.querySelectorAll(".msg.assistant")].pop();
      const r = m.querySelector("details.reasoning .text");
      return { content: m.querySelector(".content").textContent, reasoning: r ? r.textContent : null,
               meta: m.querySelector(".meta").textContent, growth: window.__growth };
    });
    const send = async (text, effort, maxTokens) => {
      await page.select("#effort", effort);
      await page.$eval("#max-tokens", (el, v) => { el.value = v; }, String(maxTokens));
      await page.type("#input", text);
      await page.click("#send");
      await page.waitForFunction(() => document.body.dataset.state === "streaming", { timeout: 30000 });  // generous: a loaded 2-core CI machine
    };
    const idle = (ms) => page.waitForFunction(() => document.body.dataset.state === "idle", { timeout: ms });

    // 1. Thinking off: the answer streams into the content.
    await watchGrowth();
    await send("Hello there", "off", 24);
    await idle(60000);
    let a = await lastAssistant();
    if (!a.content.length) fail("no answer text streamed (meta: " + a.meta + ")");
    if (a.growth < 5) fail("the answer did not arrive in pieces (" + a.growth + " updates)");
    if (!/length/.test(a.meta) || !/24 tokens/.test(a.meta) || !/tokens\/s/.test(a.meta))
      fail("meta line should say finish length, 24 tokens and a tokens/s rate: '" + a.meta + "'");
    if (posted[0].stream !== true || posted[0].chat_template_kwargs.thinking !== false || "reasoning_effort" in posted[0])
      fail("first request: " + JSON.stringify(posted[0]));
    console.log("turn 1: " + a.content.length + " chars in " + a.growth + " updates; " + a.meta);

    // 2. Thinking high: the reasoning section fills; the history (user, assistant, user) is sent.
    await send("Tell me more", "high", 16);
    await idle(60000);
    a = await lastAssistant();
    if (a.reasoning === null || !a.reasoning.length) fail("no reasoning section with thinking on");
    const p2 = posted[1];
    if (p2.reasoning_effort !== "high" || p2.chat_template_kwargs.thinking !== true) fail("second request: " + JSON.stringify(p2));
    if (p2.messages.length !== 3 || p2.messages[1].role !== "assistant") fail("history not sent: " + JSON.stringify(p2.messages));
    console.log("turn 2: reasoning " + a.reasoning.length + " chars; " + a.meta);

    // 3. Stop: a long generation is aborted from the page and the server frees the sequence.
    await send("Write a very long story", "off", 100000);
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll(".msg.assistant")].pop();
      return m.querySelector(".content").textContent.length > 20;
    }, { timeout: 60000 });
    if ((await runningSequences(url)) < 1) fail("the long generation is not running on the server");
    await page.click("#stop");
    await idle(15000);
    const stopped = await lastAssistant();
    if (!/^stopped/.test(stopped.meta)) fail("meta after stop: '" + stopped.meta + "'");
    await sleep(1500);
    const later = await lastAssistant();
    if (later.content !== stopped.content) fail("text kept growing after stop");
    let running = 1;
    for (let i = 0; i < 50 && running > 0; ++i) { running = await runningSequences(url); if (running > 0) await sleep(100); }
    if (running !== 0) fail("server still runs " + running + " sequence(s) after stop");
    console.log("stop: " + stopped.content.length + " chars kept; " + stopped.meta + "; server running sequences 0");

    if (pageErrors.length) fail("page errors: " + pageErrors.join("; "));
    await page.screenshot({ path: screenshot, fullPage: false });
    console.log("screenshot: " + screenshot);
  } finally {
    if (browser) await browser.close();
    srv.kill("SIGTERM");
  }
}

main().then(() => { console.log("ok"); process.exit(0); },
            (e) => { console.error("FAIL: " + e.message); process.exit(1); });
