// The official openai npm SDK's Responses API (client.responses) against
// troupe serve on the bundled model: create, the typed event stream and its
// final response, structured output through zod (parse, stream), forced
// function calls with parsed arguments, a function call's output sent back,
// and 400s. Only the shapes are checked: the model is small.
import OpenAI from 'openai';
import { z } from 'zod';
import { zodTextFormat, zodResponsesFunction } from 'openai/helpers/zod';
import { step, done, baseURL } from './check.mjs';

const client = new OpenAI({ baseURL, apiKey: 'x', maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const expect = (ok, what) => { if (!ok) throw new Error(what); };

await step('responses create', async () => {
  const r = await client.responses.create({ model, input: 'Tell me about someone.', instructions: 'Be brief.', max_output_tokens: 16, temperature: 0 });
  expect(r.object === 'response' && r.output[0].type === 'message', 'shape ' + JSON.stringify(r));
  expect(typeof r.output_text === 'string' && r.output_text.length > 0, 'no output_text');
  expect(r.usage.output_tokens === 16 && r.status === 'incomplete', 'usage/status ' + JSON.stringify(r.usage) + ' ' + r.status);
  return { status: r.status, text: r.output_text };
});
await step('responses stream events', async () => {
  const s = await client.responses.create({ model, input: [{ role: 'user', content: 'Tell me about someone.' }], max_output_tokens: 16, temperature: 0, stream: true });
  let text = '', last = null, seq = -1;
  for await (const e of s) {
    expect(e.sequence_number === seq + 1, 'sequence ' + e.sequence_number + ' after ' + seq);
    seq = e.sequence_number;
    if (e.type === 'response.output_text.delta') text += e.delta;
    last = e;
  }
  expect(['response.completed', 'response.incomplete'].includes(last.type) && last.response.output[0].content[0].text === text, 'final ' + JSON.stringify(last));
  return { events: seq + 1, text };
});
await step('responses stream helper', async () => {
  const runner = client.responses.stream({ model, input: 'Tell me about someone.', max_output_tokens: 12, temperature: 0 });
  let deltas = '';
  runner.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const r = await runner.finalResponse();
  expect(r.output_text === deltas, 'final text ' + r.output_text + ' vs ' + deltas);
  return r.output_text;
});
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), kind: z.enum(['a', 'b']) });
await step('responses parse zod', async () => {
  const r = await client.responses.parse({ model, input: 'Tell me about someone.', text: { format: zodTextFormat(Person, 'person') }, max_output_tokens: 200, temperature: 0 });
  expect(r.output_parsed, 'not parsed: ' + r.output_text + ' ' + r.status);
  return r.output_parsed;
});
await step('responses stream zod', async () => {
  const runner = client.responses.stream({ model, input: 'Tell me about someone.', text: { format: zodTextFormat(Person, 'person') }, max_output_tokens: 200, temperature: 1, seed: 5 });
  const r = await runner.finalResponse();
  expect(r.output_parsed, 'not parsed: ' + r.output_text);
  return r.output_parsed;
});
const Weather = zodResponsesFunction({ name: 'w', parameters: z.object({ c: z.string().max(4) }) });
let call;
await step('responses function required', async () => {
  const r = await client.responses.parse({ model, input: 'W?', tools: [Weather], tool_choice: 'required', max_output_tokens: 60, temperature: 0 });
  call = r.output.find((o) => o.type === 'function_call');
  expect(call && call.parsed_arguments, 'no parsed call: ' + JSON.stringify(r.output));
  return { name: call.name, args: call.parsed_arguments, call_id: call.call_id };
});
await step('responses function named stream', async () => {
  const runner = client.responses.stream({ model, input: 'W?', tools: [Weather], tool_choice: { type: 'function', name: 'w' }, max_output_tokens: 60, temperature: 0 });
  const r = await runner.finalResponse();
  const calls = r.output.filter((o) => o.type === 'function_call');
  expect(calls.length === 1 && JSON.parse(calls[0].arguments), 'calls ' + JSON.stringify(r.output));
  return calls[0].arguments;
});
await step('responses function output back', async () => {
  const input = [{ role: 'user', content: 'W?' }, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
    { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }];
  const r = await client.responses.create({ model, input, tools: [Weather], tool_choice: 'none', max_output_tokens: 8, temperature: 0 });
  return r.output_text;
});
await step('responses 400s', async () => {
  const said = [];
  for (const body of [{ model, input: 'x', max_output_tokens: -1 }, { model, input: 'x', previous_response_id: 'resp_1' }, { model, input: [{ type: 'function_call_output' }] }]) {
    try { await client.responses.create(body); } catch (e) { if (e.status === 400) { said.push(e.message); continue; } throw e; }
    throw new Error('accepted ' + JSON.stringify(body));
  }
  return said;
});
done('openai SDK (Responses)');
