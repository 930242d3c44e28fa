// The Vercel AI SDK's OpenAI provider, whose language models speak the
// Responses API, against troupe serve: text and streams with usage,
// generateObject and streamObject, tools with toolChoice required and named,
// executed, and a second step that sends the call's result back.
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, generateObject, streamObject, tool, stepCountIs } from 'ai';
import { z } from 'zod';
import { step, done, baseURL } from './check.mjs';

const provider = createOpenAI({ baseURL, apiKey: 'x' });
const served = await (await fetch(`${baseURL}/models`)).json();
const model = provider.responses(served.data[0].id);
const store = { openai: { store: false } };  // the provider's default asks the server to keep items
await step('generateText', async () => { const r = await generateText({ model, prompt: 'Hello', maxOutputTokens: 12, temperature: 0, providerOptions: store }); return { text: r.text, usage: r.usage, finish: r.finishReason }; });
await step('streamText', async () => { const r = streamText({ model, prompt: 'Hello', maxOutputTokens: 12, temperature: 0, providerOptions: store }); let t = ''; for await (const p of r.textStream) t += p; return { t, usage: await r.usage, finish: await r.finishReason }; });
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), kind: z.enum(['a', 'b']) });
await step('generateObject', async () => { const r = await generateObject({ model, schema: Person, prompt: 'Someone', maxOutputTokens: 100, temperature: 0, providerOptions: store }); return r.object; });
await step('streamObject', async () => { const r = streamObject({ model, schema: Person, prompt: 'Someone', maxOutputTokens: 100, temperature: 0, providerOptions: store }); for await (const _ of r.partialObjectStream) {} return await r.object; });
const weather = tool({ description: 'w', inputSchema: z.object({ c: z.string().max(4) }), execute: async ({ c }) => `sunny in ${c}` });
await step('tools required', async () => { const r = await generateText({ model, prompt: 'W?', tools: { w: weather }, toolChoice: 'required', maxOutputTokens: 60, temperature: 0, providerOptions: store }); if (!r.toolResults.length) throw new Error('no call: ' + JSON.stringify(r.content)); return { calls: r.toolCalls, results: r.toolResults, finish: r.finishReason }; });
await step('tool named, streamed', async () => { const r = streamText({ model, prompt: 'W?', tools: { w: weather }, toolChoice: { type: 'tool', toolName: 'w' }, maxOutputTokens: 60, temperature: 0, providerOptions: store }); for await (const _ of r.fullStream) {} const calls = await r.toolCalls; if (calls.length !== 1) throw new Error('calls ' + JSON.stringify(calls)); return { calls, finish: await r.finishReason }; });
await step('tool result sent back', async () => {
  const r = await generateText({ model, prompt: 'W?', tools: { w: weather }, toolChoice: 'required', stopWhen: stepCountIs(2), prepareStep: ({ stepNumber }) => (stepNumber > 0 ? { toolChoice: 'none' } : {}), maxOutputTokens: 60, temperature: 0, providerOptions: store });
  if (r.steps.length !== 2) throw new Error('steps ' + r.steps.length);
  return { steps: r.steps.length, text: r.text };
});
done('AI SDK (Responses)');
