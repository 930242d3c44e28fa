// The Vercel AI SDK's OpenAI-compatible provider against troupe serve:
// text and streams with usage, generateObject and streamObject (structured
// output), tools with toolChoice required and named, executed.
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText, generateObject, streamObject, tool } from 'ai';
import { z } from 'zod';
import { step, done, baseURL } from './check.mjs';

const provider = createOpenAICompatible({ name: 'troupe', baseURL, apiKey: 'x', supportsStructuredOutputs: true, includeUsage: true });
const served = await (await fetch(`${baseURL}/models`)).json();
const model = provider(served.data[0].id);
await step('generateText', async () => { const r = await generateText({ model, prompt: 'Hello', maxOutputTokens: 12, temperature: 0 }); return { text: r.text, usage: r.usage, finish: r.finishReason }; });
await step('streamText', async () => { const r = streamText({ model, prompt: 'Hello', maxOutputTokens: 12, temperature: 0 }); let t = ''; for await (const p of r.textStream) t += p; return { t, usage: await r.usage, finish: await r.finishReason }; });
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), kind: z.enum(['a', 'b']) });
await step('generateObject', async () => { const r = await generateObject({ model, schema: Person, prompt: 'Someone', maxOutputTokens: 100, temperature: 0 }); return r.object; });
await step('streamObject', async () => { const r = streamObject({ model, schema: Person, prompt: 'Someone', maxOutputTokens: 100, temperature: 0 }); for await (const _ of r.partialObjectStream) {} return await r.object; });
const weather = tool({ description: 'w', inputSchema: z.object({ c: z.string().max(4) }), execute: async ({ c }) => `sunny in ${c}` });
await step('tools required', async () => { const r = await generateText({ model, prompt: 'W?', tools: { w: weather }, toolChoice: 'required', maxOutputTokens: 60, temperature: 0 }); return { calls: r.toolCalls, results: r.toolResults, finish: r.finishReason }; });
await step('tool named, streamed', async () => { const r = streamText({ model, prompt: 'W?', tools: { w: weather }, toolChoice: { type: 'tool', toolName: 'w' }, maxOutputTokens: 60, temperature: 0 }); for await (const _ of r.fullStream) {} return { calls: await r.toolCalls, finish: await r.finishReason }; });
done('AI SDK');
