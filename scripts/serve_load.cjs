// serve_load.cjs PORT SERVER_PID N MAX_TOKENS [ROUNDS]: the load test of `dgemma serve` (scripts/serve_load.sh).
// A warm-up round of 8 requests, then N concurrent streaming chat requests (question i % 8, seed i),
// each parsed as SSE (chunks in order, a finish_reason, the usage chunk, [DONE] last); then each request
// again alone, not streamed, and its text compared. Prints one JSON line: lost (no complete stream),
// corrupted (bad framing), mismatched (stream != alone), p50/p99 latency (s), aggregate tok/s of the
// concurrent phase, and the server's RSS (MiB) after the warm-up and at the end. ROUNDS > 1: the concurrent
// phase repeated (the same N requests; every round's streams checked against the run alone), with the RSS
// after each round (rss_mib_after_round): flat over rounds = no memory kept per request.
"use strict";
const fs = require("fs");
const [port, pid, nArg, tokArg, roundsArg] = process.argv.slice(2);
const N = +nArg, MAXTOK = +tokArg, ROUNDS = Math.max(1, +(roundsArg || 1));
const QS = ["What is 7 times 8?", "Tom has 23 apples and buys 14 more. How many apples does he have?",
            "Write a line about the sea.", "What is 12 plus 30?", "Sam has 5 pens and loses 2. How many are left?",
            "Name a color.", "What is 9 times 6?", "Tell me about the moon."];
const url = `http://127.0.0.1:${port}/v1/chat/completions`;
const body = (i, stream) => JSON.stringify({messages: [{role: "user", content: QS[i % QS.length]}], max_tokens: MAXTOK, seed: i,
                                            stream, ...(stream ? {stream_options: {include_usage: true}} : {})});
const rss = () => +(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))[1]) / 1024;

async function streamOne(i) {
  const t0 = performance.now();
  const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"}, body: body(i, true)});
  if (r.status !== 200) return {ok: false, why: `status ${r.status}`};
  const raw = await r.text();
  const res = {ok: true, text: "", tokens: -1, finish: null, done: false, sec: (performance.now() - t0) / 1000};
  for (const ev of raw.split("\n\n")) {
    const line = ev.trim();
    if (!line || line.startsWith(":")) continue;
    if (!line.startsWith("data: ") || res.done) return {ok: false, corrupt: true, why: `bad event ${line.slice(0, 60)}`};
    const d = line.slice(6);
    if (d === "[DONE]") { res.done = true; continue; }
    const j = JSON.parse(d);
    if (j.error) return {ok: false, why: j.error.message};
    if (j.usage) res.tokens = j.usage.completion_tokens;
    for (const c of j.choices) {
      res.text += (c.delta && c.delta.content) || "";
      if (c.finish_reason) res.finish = c.finish_reason;
    }
  }
  if (!res.done || !res.finish || res.tokens < 0) return {ok: false, corrupt: true, why: "incomplete stream"};
  return res;
}

async function aloneOne(i) {
  const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"}, body: body(i, false)});
  const j = await r.json();
  return j.choices[0].message.content;
}

async function main() {
  await Promise.all([...Array(8).keys()].map((i) => streamOne(1000 + i)));
  const rssWarm = rss();
  let lost = 0, corrupted = 0, mismatched = 0, tokens = 0, wall = 0, rssLoad = 0;
  const lat = [], rssRounds = [], alone = [];
  for (let round = 0; round < ROUNDS; round++) {
    const t0 = performance.now();
    const rs = await Promise.all([...Array(N).keys()].map((i) => streamOne(i).catch((e) => ({ok: false, why: String(e)}))));
    if (round === 0) { wall = (performance.now() - t0) / 1000; rssLoad = rss(); }
    for (let i = 0; i < N; i++) {
      const r = rs[i];
      if (!r.ok) { if (r.corrupt) corrupted++; else lost++; console.error(`round ${round} request ${i}: ${r.why}`); continue; }
      if (round === 0) { tokens += r.tokens; lat.push(r.sec); }
      if (alone[i] === undefined) alone[i] = await aloneOne(i);
      if (alone[i] !== r.text) { mismatched++; console.error(`round ${round} request ${i}: stream differs from its run alone`); }
    }
    rssRounds.push(+rss().toFixed(1));
  }
  lat.sort((a, b) => a - b);
  const q = (p) => lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : NaN;
  console.log(JSON.stringify({requests: N, lost, corrupted, mismatched, p50_s: +q(0.5).toFixed(2), p99_s: +q(0.99).toFixed(2),
                              wall_s: +wall.toFixed(2), tokens, aggregate_tok_s: +(tokens / wall).toFixed(1),
                              rss_mib_after_warmup: +rssWarm.toFixed(1), rss_mib_after_load: +rssLoad.toFixed(1),
                              rss_mib_end: +rss().toFixed(1), rounds: ROUNDS, rss_mib_after_round: rssRounds}));
  process.exit(lost || corrupted || mismatched ? 1 : 0);
}
main().catch((e) => { console.error(String((e && e.stack) || e)); process.exit(1); });
