// openai_client.cjs PORT QUESTION: the official `openai` npm client (scripts/setup.sh installs it into
// .node/) against a running `dgemma serve`; run by tests/test_serve.c, which compares what this prints
// (one JSON object) with the engine's own answers. CommonJS so that NODE_PATH=.node/node_modules finds it.
"use strict";
const OpenAI = require("openai");

async function main() {
  const [port, question] = process.argv.slice(2);
  const client = new OpenAI({baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0, timeout: 600000});
  const out = {};
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);
  const model = out.models[0];
  const messages = [{role: "user", content: question}];
  const chat = await client.chat.completions.create({model, messages, max_tokens: 64, seed: 0});
  out.chat = chat.choices[0].message.content;
  out.chat_finish = chat.choices[0].finish_reason;
  out.chat_usage = chat.usage;
  const stream = await client.chat.completions.create({model, messages, max_tokens: 64, seed: 0, stream: true,
                                                       stream_options: {include_usage: true}});
  out.stream = "";
  out.stream_chunks = 0;
  for await (const ch of stream) {
    if (ch.choices && ch.choices.length) {
      out.stream += (ch.choices[0].delta && ch.choices[0].delta.content) || "";
      if (ch.choices[0].finish_reason) out.stream_finish = ch.choices[0].finish_reason;
      out.stream_chunks++;
    }
    if (ch.usage) out.stream_usage = ch.usage;
  }
  const cmp = await client.completions.create({model, prompt: "Once upon a time", max_tokens: 128, seed: 5});
  out.completion = cmp.choices[0].text;
  out.completion_finish = cmp.choices[0].finish_reason;
  try {
    await client.chat.completions.create({model, messages: [], max_tokens: 1});
    out.error_status = 0;
  } catch (e) {
    out.error_status = e.status;
    out.error_code = e.code;
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(String(e && e.stack || e)); process.exit(1); });
