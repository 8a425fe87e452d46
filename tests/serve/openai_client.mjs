// openai_client.mjs - OpenAI's official Node client (the `openai` npm
// package, major version 4) against a running `llmd serve`.
//
//   node tests/serve/openai_client.mjs BASE_URL MODEL [PROMPT]
//   e.g. node tests/serve/openai_client.mjs http://127.0.0.1:8080/v1 stories260K-f32
//
// It lists the models, then asks for a greedy completion of PROMPT (default
// "Once upon a time"; temperature 0, max_tokens 16) whole and streamed, the
// same as a chat completion (one user message holding PROMPT), and an
// unknown model, which the SDK must raise as NotFoundError (status 404).
// The streamed text must equal the whole answer's, and so must the finish
// reason and the usage (streams ask for it with include_usage). Then both
// again with logprobs (completions `logprobs: 2`, chat `logprobs: true,
// top_logprobs: 2`): the tokens must spell the text, each greedy token be
// the first and most likely of its alternatives, and the streamed
// logprobs equal the whole answer's. Last, a completion with echo and
// max_tokens 0 (the prompt scored alone): the text is PROMPT, the first
// token's logprob null and every other one finite. Then n = 3 (completions)
// and n = 2 (chat), sampled with a seed, whole and streamed: each choice
// equals a request of its own with seed + i; and a seeded request inside a
// busy batch equals itself alone. It prints
// one JSON summary on stdout (tests/test_serve_openai.c reads it and
// compares the text with `llmd generate`) and exits 0 when everything
// agreed, 1 on a mismatch, 2 when it could not run (no SDK, a request
// failed).
//
// Where the SDK comes from: `make deps-test` (tools/deps.sh) installs it
// with `npm install --prefix build/npm`. An ES module resolves a bare
// `import 'openai'` next to the importing file only (NODE_PATH is for
// CommonJS), so this script loads the package through a require() rooted
// at that prefix: $LLMD_NPM_PREFIX, else build/npm of the repository that
// holds this file. It is the same package; its CommonJS entry point.
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const prefix = path.resolve(process.env.LLMD_NPM_PREFIX || path.join(here, '..', '..', 'build', 'npm'));

function finish(summary, code) {
    process.stdout.write(JSON.stringify(summary) + '\n');
    process.exit(code);
}

let OpenAI, sdkVersion;
try {
    const require = createRequire(path.join(prefix, 'package.json'));
    OpenAI = require('openai');
    sdkVersion = require('openai/version').VERSION;
} catch (e) {
    finish({ ok: false, error: `the openai package is not in ${prefix}: run \`make deps-test\` (${e.message})` }, 2);
}

const [baseURL, model, prompt = 'Once upon a time'] = process.argv.slice(2);
if (!baseURL || !model)
    finish({ ok: false, error: 'usage: node openai_client.mjs BASE_URL MODEL [PROMPT]' }, 2);

// no retries: a retried request would hide a server error and skew the
// server's counters that the tests compare
const client = new OpenAI({ baseURL, apiKey: 'sk-llmd-test', maxRetries: 0, timeout: 60_000 });
const summary = { ok: false, sdk_version: sdkVersion, model, prompt, mismatches: [] };

function expect(cond, what) {
    if (!cond)
        summary.mismatches.push(what);
}

function sameUsage(a, b) {
    return !!a && !!b && a.prompt_tokens === b.prompt_tokens &&
        a.completion_tokens === b.completion_tokens && a.total_tokens === b.total_tokens;
}

// A choice's logprobs as [{token, logprob, top: [[token, logprob]...]}], in
// either endpoint's shape (completions: the legacy arrays; chat: content).
function tokenLogprobs(lp) {
    if (!lp)
        return [];
    if (lp.content)
        return lp.content.map((t) => ({ token: t.token, logprob: t.logprob,
            top: t.top_logprobs.map((a) => [a.token, a.logprob]) }));
    return lp.tokens.map((t, i) => ({ token: t, logprob: lp.token_logprobs[i],
        top: Object.entries(lp.top_logprobs[i]) }));
}

// Greedy logprobs: the tokens spell the text, each token is its first
// alternative and none is more likely, every value is finite and <= 0.
function checkLogprobs(name, lps, text) {
    expect(lps.map((t) => t.token).join('') === text, `${name}: the logprob tokens do not spell the text`);
    lps.forEach((t, i) => {
        expect(Number.isFinite(t.logprob) && t.logprob <= 0, `${name}: token ${i} logprob ${t.logprob}`);
        expect(t.top.length === 2, `${name}: token ${i} has ${t.top.length} alternatives`);
        expect(t.top.length > 0 && t.top[0][0] === t.token && t.top[0][1] === t.logprob,
            `${name}: token ${i} is not its first alternative`);
        expect(t.top.every((a) => a[1] <= t.logprob), `${name}: token ${i} has a likelier alternative`);
    });
}

// One kind of request, whole then streamed. pick(choice) is the text of a
// whole answer's choice, pickDelta(choice) of a streamed chunk's.
async function both(name, create, params, pick, pickDelta) {
    const whole = await create({ ...params });
    const c = whole.choices[0];
    const out = {
        text: pick(c),
        finish_reason: c.finish_reason,
        usage: whole.usage,
        stream_text: '',
        stream_finish_reason: null,
        stream_usage: null,
        n_chunks: 0,
    };
    const lps = tokenLogprobs(c.logprobs);
    const streamLps = [];
    const stream = await create({ ...params, stream: true, stream_options: { include_usage: true } });
    for await (const chunk of stream) {
        out.n_chunks++;
        if (chunk.usage)
            out.stream_usage = chunk.usage;
        for (const ch of chunk.choices) {
            out.stream_text += pickDelta(ch) ?? '';
            streamLps.push(...tokenLogprobs(ch.logprobs));
            if (ch.finish_reason)
                out.stream_finish_reason = ch.finish_reason;
        }
    }
    expect(typeof out.text === 'string', `${name}: no text`);
    expect(out.stream_text === out.text, `${name}: streamed text differs from the whole answer`);
    expect(out.stream_finish_reason === out.finish_reason, `${name}: streamed finish_reason differs`);
    expect(sameUsage(out.stream_usage, out.usage), `${name}: streamed usage differs`);
    expect(out.n_chunks > 2, `${name}: only ${out.n_chunks} chunks`);
    if (params.logprobs !== undefined) {
        checkLogprobs(name, lps, out.text);
        expect(JSON.stringify(streamLps) === JSON.stringify(lps),
            `${name}: streamed logprobs differ from the whole answer's`);
        out.n_logprobs = lps.length;
        out.stream_n_logprobs = streamLps.length;
    } else {
        expect(c.logprobs === null, `${name}: logprobs ${JSON.stringify(c.logprobs)} not asked for`);
    }
    summary[name] = out;
}

// n choices of one sampled request, whole then streamed: n choices indexed
// 0..n-1, the prompt counted once in usage and the completion tokens
// summed; the streamed choices (interleaved, told apart by index) equal
// the whole ones; and choice i equals a request of its own with seed + i.
async function nChoices(name, create, params, pick, pickDelta) {
    const n = params.n;
    const whole = await create({ ...params });
    const texts = whole.choices.map(pick);
    const out = { n_choices: whole.choices.length, usage: whole.usage, texts,
        indexes: whole.choices.map((c) => c.index), stream_texts: Array(n).fill(''),
        stream_finish: Array(n).fill(null), stream_interleaved: false };
    expect(JSON.stringify(out.indexes) === JSON.stringify([...Array(n).keys()]),
        `${name}: choice indexes ${out.indexes}`);
    let tokens = 0;
    for (let i = 0; i < n; i++) {
        const one = await create({ ...params, n: 1, seed: params.seed + i });
        expect(pick(one.choices[0]) === texts[i], `${name}: choice ${i} differs from seed ${params.seed + i} alone`);
        expect(one.usage.prompt_tokens === whole.usage.prompt_tokens, `${name}: prompt_tokens differ`);
        tokens += one.usage.completion_tokens;
    }
    expect(whole.usage.completion_tokens === tokens, `${name}: completion_tokens ${whole.usage.completion_tokens}, the choices' sum ${tokens}`);
    const stream = await create({ ...params, stream: true, stream_options: { include_usage: true } });
    let last = -1;
    for await (const chunk of stream) {
        if (chunk.usage)
            out.stream_usage = chunk.usage;
        for (const ch of chunk.choices) {
            out.stream_texts[ch.index] += pickDelta(ch) ?? '';
            if (ch.finish_reason)
                out.stream_finish[ch.index] = ch.finish_reason;
            if (last >= 0 && ch.index !== last)
                out.stream_interleaved = true;
            last = ch.index;
        }
    }
    expect(JSON.stringify(out.stream_texts) === JSON.stringify(texts), `${name}: streamed choices differ`);
    expect(JSON.stringify(out.stream_finish) === JSON.stringify(whole.choices.map((c) => c.finish_reason)),
        `${name}: streamed finish reasons differ`);
    expect(sameUsage(out.stream_usage, whole.usage), `${name}: streamed usage differs`);
    expect(new Set(texts).size > 1, `${name}: every choice has the same text`);
    summary[name] = out;
}

// seed: the same request with the same seed gives the same text alone and
// inside a busy batch (other sampled requests running beside it).
async function seedInBatch(params) {
    const alone = (await client.completions.create(params)).choices[0].text;
    const others = [];
    for (let i = 0; i < 6; i++)
        others.push(client.completions.create({ ...params, prompt: `${params.prompt} ${i}`, seed: 1000 + i,
            max_tokens: 24 }));
    const busy = client.completions.create(params);
    const [got] = await Promise.all([busy, ...others]);
    summary.seed_in_batch = { alone, busy: got.choices[0].text };
    expect(got.choices[0].text === alone, 'seed: the text in a busy batch differs from the text alone');
}

// The SDK must map llmd's 404 error object to its NotFoundError.
async function notFound(name, call) {
    const got = { call: name };
    try {
        await call();
        got.error = null;
    } catch (e) {
        got.error = e.constructor.name;
        got.status = e.status;
        got.code = e.code ?? null;
        expect(e instanceof OpenAI.NotFoundError, `${name}: ${e.constructor.name}, not NotFoundError`);
    }
    expect(got.status === 404, `${name}: status ${got.status}, not 404`);
    expect(got.code === 'model_not_found', `${name}: code ${got.code}`);
    summary.not_found.push(got);
}

try {
    const models = await client.models.list();
    summary.models = models.data.map((m) => m.id);
    expect(summary.models.includes(model), `models.list has no ${model}`);
    const one = await client.models.retrieve(model);
    expect(one.id === model, `models.retrieve: ${one.id}`);

    const greedy = { model, max_tokens: 16, temperature: 0 };
    await both('completion', (p) => client.completions.create(p), { ...greedy, prompt },
        (c) => c.text, (c) => c.text);
    await both('chat', (p) => client.chat.completions.create(p),
        { ...greedy, messages: [{ role: 'user', content: prompt }] },
        (c) => c.message.content, (c) => c.delta?.content);
    await both('completion_logprobs', (p) => client.completions.create(p),
        { ...greedy, prompt, logprobs: 2 }, (c) => c.text, (c) => c.text);
    await both('chat_logprobs', (p) => client.chat.completions.create(p),
        { ...greedy, messages: [{ role: 'user', content: prompt }], logprobs: true, top_logprobs: 2 },
        (c) => c.message.content, (c) => c.delta?.content);

    const scored = await client.completions.create({ model, prompt, max_tokens: 0, echo: true, logprobs: 1 });
    const sl = scored.choices[0].logprobs;
    summary.echo = { text: scored.choices[0].text, n_logprobs: sl.token_logprobs.length,
        completion_tokens: scored.usage.completion_tokens };
    expect(scored.choices[0].text === prompt, 'echo: the text is not the prompt');
    expect(sl.token_logprobs[0] === null && sl.top_logprobs[0] === null, 'echo: the first token has a logprob');
    expect(sl.token_logprobs.slice(1).every((l) => Number.isFinite(l) && l <= 0), 'echo: a logprob is not finite');
    expect(sl.token_logprobs.length === scored.usage.prompt_tokens, 'echo: not one logprob a prompt token');

    const sampled = { model, max_tokens: 16, temperature: 1, seed: 42, n: 3 };
    await nChoices('completion_n3', (p) => client.completions.create(p), { ...sampled, prompt },
        (c) => c.text, (c) => c.text);
    await nChoices('chat_n2', (p) => client.chat.completions.create(p),
        { ...sampled, n: 2, messages: [{ role: 'user', content: prompt }] },
        (c) => c.message.content, (c) => c.delta?.content);
    await seedInBatch({ model, prompt, max_tokens: 16, temperature: 1, seed: 7 });

    summary.not_found = [];
    const other = { ...greedy, model: 'no-such-model' };
    await notFound('completions.create', () => client.completions.create({ ...other, prompt }));
    await notFound('chat.completions.create stream', async () => {
        const s = await client.chat.completions.create(
            { ...other, messages: [{ role: 'user', content: prompt }], stream: true });
        for await (const chunk of s)
            void chunk;
    });
    await notFound('models.retrieve', () => client.models.retrieve('no-such-model'));
} catch (e) {
    summary.error = `${e.constructor.name}: ${e.message}`;
    finish(summary, 2);
}
summary.ok = summary.mismatches.length === 0;
finish(summary, summary.ok ? 0 : 1);
