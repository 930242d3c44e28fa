"""vocab.expected.json: llama.cpp's ids for the fixture texts with each
vocabulary. Usage: mkexpect.py LREF (the built tools/lref.cpp); run from
anywhere, it reads and writes tests/data/gguf."""
import json, subprocess, sys
from pathlib import Path
DATA = Path(__file__).resolve().parents[1]
LREF = sys.argv[1]
texts = [c['text'] for c in json.load(open(DATA.parent / 'tokenizers/llama3_1-small.expected.json'))['cases']]
texts += ["<s>Hello</s> world", "  leading spaces", "tabs\tand\nnewlines\n\n", "", " ", "Once upon a time, there was a"]
out = {"generator": "llama.cpp (ggml-org/llama.cpp as node-llama-cpp 3.22.1 bundles it): llama_tokenize(vocab, text, add_special=true, parse_special=true)",
       "texts": texts, "ids": {}}
for f in ['llama3-vocab.gguf', 'qwen2-vocab.gguf', 'gpt2-vocab.gguf', 'llama-q4_k_m.gguf']:
    ids = []
    for t in texts:
        r = subprocess.run([LREF, str(DATA / f), '0', '--tokens-only'], input=t.encode(), capture_output=True, check=True)
        line = r.stdout.decode().strip()
        ids.append([int(x) for x in line.split(',')] if line else [])
    out['ids'][f] = ids
json.dump(out, open(DATA / 'vocab.expected.json', 'w'), ensure_ascii=False, indent=0)
print(len(texts), 'texts')
