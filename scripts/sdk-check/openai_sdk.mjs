// The official openai npm SDK against troupe serve on the bundled model:
// chat, streams with usage, completions with logprobs, structured output
// through zod's helpers (parse, stream, n > 1), forced tool calls (required
// and named, parsed arguments), json_object, and a 400. The bundled model is
// small (256 tokens of context) and no writer: only the shapes are checked.
import OpenAI from 'openai';
import { z } from 'zod';
import { zodResponseFormat, zodFunction } from 'openai/helpers/zod';
import { step, done, baseURL } from './check.mjs';

const client = new OpenAI({ baseURL, apiKey: 'x', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Tell me about someone.' }];
const model = (await client.models.list()).data[0].id;
await step('models', async () => model);
await step('chat', async () => (await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 })).choices[0]);
await step('chat stream', async () => {
  const s = await client.chat.completions.create({ model, messages, max_tokens: 16, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null;
  for await (const c of s) { if (c.choices[0]?.delta?.content) text += c.choices[0].delta.content; if (c.usage) usage = c.usage; }
  return { text, usage };
});
await step('completions', async () => (await client.completions.create({ model, prompt: 'Once upon', max_tokens: 8, logprobs: 2, temperature: 0 })).choices[0]);
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), n: z.number().int(), kind: z.enum(['a', 'b']), day: z.iso.date().nullable() });
await step('parse zod', async () => {
  const r = await client.chat.completions.parse({ model, messages, response_format: zodResponseFormat(Person, 'person'), max_tokens: 200, temperature: 0 });
  if (!r.choices[0].message.parsed) throw new Error('not parsed: ' + r.choices[0].message.content + ' finish ' + r.choices[0].finish_reason);
  return r.choices[0].message.parsed;
});
await step('parse zod sampled n=2', async () => {
  const r = await client.chat.completions.parse({ model, messages, response_format: zodResponseFormat(Person, 'person'), max_tokens: 200, temperature: 1, seed: 3, n: 2 });
  return r.choices.map(c => { if (!c.message.parsed) throw new Error('not parsed: ' + c.message.content + ' ' + c.finish_reason); return c.message.parsed; });
});
await step('stream helper zod', async () => {
  const runner = client.chat.completions.stream({ model, messages, response_format: zodResponseFormat(Person, 'person'), max_tokens: 200, temperature: 0 });
  const r = await runner.finalChatCompletion();
  return r.choices[0].message.parsed;
});
const Weather = zodFunction({ name: 'w', parameters: z.object({ c: z.string().max(4) }) });
await step('tools required', async () => {
  const r = await client.chat.completions.parse({ model, messages: [{ role: 'user', content: 'W?' }], tools: [Weather], tool_choice: "required", max_tokens: 60, temperature: 0 });
  const m = r.choices[0].message;
  if (r.choices[0].finish_reason !== 'tool_calls') throw new Error('finish_reason ' + r.choices[0].finish_reason);
  return { finish: r.choices[0].finish_reason, call: m.tool_calls[0].function.name, args: m.tool_calls[0].function.parsed_arguments };
});
await step('tools named stream', async () => {
  const runner = client.chat.completions.stream({ model, messages: [{ role: 'user', content: 'W?' }], tools: [Weather], tool_choice: { type: 'function', function: { name: "w" } }, max_tokens: 60, temperature: 0 });
  const r = await runner.finalChatCompletion();
  const calls = r.choices[0].message.tool_calls;
  if (calls?.length !== 1 || !calls[0].function.parsed_arguments) throw new Error('no parsed call: ' + JSON.stringify(r.choices[0]));
  return { finish: r.choices[0].finish_reason, calls };
});
await step('json_object', async () => {
  const r = await client.chat.completions.create({ model, messages, response_format: { type: 'json_object' }, max_tokens: 60, temperature: 0 });
  return JSON.parse(r.choices[0].message.content);
});
await step('bad request is a 400', async () => {
  try { await client.chat.completions.create({ model, messages, max_tokens: -1 }); } catch (e) { if (e.status === 400) return e.message; throw e; }
  throw new Error('accepted');
});
done('openai SDK');
