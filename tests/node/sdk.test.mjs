// sdk.test.mjs: the official OpenAI Node SDK (npm `openai`) against `lumen serve`, as a real
// client uses it: chat completions streaming and not, legacy completions, logprobs, n choices,
// X-Request-Id, an aborted stream, and errors as the SDK's typed exceptions.
//
// Run by tests/test_node_sdk.c under ctest, which starts the server and sets LUMEN_BASE_URL
// (http://127.0.0.1:PORT/v1) and LUMEN_MODEL. By hand: `lumen serve --model models/tiny-qwen3
// --port 8000`, then `LUMEN_BASE_URL=http://127.0.0.1:8000/v1 node --test tests/node/`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.LUMEN_BASE_URL ?? 'http://127.0.0.1:8000/v1';
const model = process.env.LUMEN_MODEL ?? 'tiny-qwen3';
const client = new OpenAI({ baseURL, apiKey: 'not-needed', maxRetries: 0, timeout: 120_000 });
const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Name three colours.' },
];

test('models.list shows the served model and its capabilities', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.ok(ids.includes(model), `models: ${ids}`);
  const m = page.data.find((x) => x.id === model);
  assert.deepEqual(m.capabilities, ['text_generation', 'text_conversation']);
});

test('chat completion, non-streaming', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.ok(r.id.startsWith('chatcmpl-'));
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
});

test('chat completion, streaming, equals the non-streamed answer; one usage chunk at the end', async () => {
  const body = { model, messages, max_tokens: 16, temperature: 0, chat_template_kwargs: { enable_thinking: false } };
  const whole = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let usageChunks = 0;
  let afterUsage = 0;
  let finish = null;
  const ids = new Set();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    if (usage) afterUsage++;
    if (chunk.choices.length === 0) {
      usageChunks++;
      usage = chunk.usage;
      continue;
    }
    text += chunk.choices[0].delta.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usageChunks, 1);
  assert.equal(afterUsage, 0, 'the usage chunk is the last one');
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(ids.size, 1, 'every chunk carries the same id');
});

test('X-Request-Id is echoed in the header and the completion id', async () => {
  const { data, response } = await client.chat.completions
    .create({ model, messages, max_tokens: 2 }, { headers: { 'X-Request-Id': 'node-sdk-42' } })
    .withResponse();
  assert.equal(response.headers.get('x-request-id'), 'node-sdk-42');
  assert.equal(data.id, 'chatcmpl-node-sdk-42');
});

test('chat logprobs and n choices', async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 6, temperature: 0.9, seed: 7, n: 2, logprobs: true, top_logprobs: 2,
  });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  let tokens = 0;
  for (const c of r.choices) {
    assert.ok(Array.isArray(c.logprobs.content));
    for (const t of c.logprobs.content) {
      assert.equal(typeof t.token, 'string');
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 2);
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
    }
    tokens += c.logprobs.content.length;
  }
  assert.equal(tokens, r.usage.completion_tokens);
});

test('completions, non-streaming and streaming', async () => {
  const body = { model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, logprobs: 1 };
  const r = await client.completions.create(body);
  assert.equal(r.object, 'text_completion');
  assert.ok(r.id.startsWith('cmpl-'));
  const c = r.choices[0];
  assert.equal(typeof c.text, 'string');
  assert.equal(c.logprobs.tokens.length, r.usage.completion_tokens);
  assert.equal(c.logprobs.token_logprobs.length, r.usage.completion_tokens);
  const stream = await client.completions.create({ ...body, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, c.text);
  const ids = await client.completions.create({ model, prompt: [9707, 11, 1879], max_tokens: 3, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);
});

test('a stream the client leaves early does not disturb the next request', async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 2000, ignore_eos: true, stream: true,
  });
  let chunks = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (++chunks === 2) break; // the SDK aborts the HTTP request
  }
  assert.equal(chunks, 2);
  const t0 = Date.now();
  const r = await client.chat.completions.create({ model, messages, max_tokens: 3 });
  assert.equal(r.object, 'chat.completion');
  assert.ok(Date.now() - t0 < 30_000);
});

test('errors arrive as the SDK\'s typed exceptions, and the server answers afterwards', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [], max_tokens: 1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /messages must not be empty/.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages, temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature' && e.type === 'invalid_request_error',
  );
  await assert.rejects(
    client.completions.create({ model, prompt: 'x', echo: true }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400,
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages, max_tokens: 1_000_000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded',
  );
  const r = await client.chat.completions.create({ model, messages, max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});
