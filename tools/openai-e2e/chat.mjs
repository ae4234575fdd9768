// Runs one non-streaming and one streaming chat completion through kvrouter
// with the official openai client and prints what it saw as one JSON line.
// Usage: KVROUTER_URL=http://127.0.0.1:8080 MODEL=m node chat.mjs
import OpenAI from 'openai';

const base = process.env.KVROUTER_URL;
const model = process.env.MODEL;
if (!base || !model) {
  console.error('KVROUTER_URL and MODEL are required');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: process.env.KVROUTER_API_KEY || 'none', maxRetries: 0, timeout: 30000 });
const messages = [
  { role: 'system', content: 'You are a terse assistant. '.repeat(40) },
  { role: 'user', content: 'Say something about prefix caches.' },
];

const { data: full, response } = await client.chat.completions
  .create({ model, messages, max_tokens: 8 })
  .withResponse();

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 8, stream: true, stream_options: { include_usage: true },
});
let content = '';
let chunks = 0;
let usage = null;
let finish = null;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    content += c.delta?.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
}

console.log(JSON.stringify({
  nonstream: {
    content: full.choices[0].message.content,
    finish: full.choices[0].finish_reason,
    usage: full.usage,
    replica: response.headers.get('x-kvrouter-replica'),
    cached: response.headers.get('x-kvrouter-cached-tokens'),
    request_id: response.headers.get('x-request-id'),
  },
  stream: { content, chunks, usage, finish },
}));
