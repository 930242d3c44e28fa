#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz corpora (tests/fuzz/corpus/TARGET/seed-*)
from the bundled models and configs, cut down to a few KB: real requests,
real server streams, the shipped configs, the real models' weights sliced to a
tiny shape. scripts/fuzz.sh merges what the fuzzers find next to them.
Run from anywhere: python3 tests/fuzz/make_seeds.py"""
import json
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
SEP = b"\n====\n"  # fuzz_support.h's kFileSeparator


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ("seed-" + name)).write_bytes(data if isinstance(data, bytes) else data.encode())


# ---- HTTP: requests as curl and the OpenAI clients send them ----

def post(body, extra="", version="1.1", target="/v1/completions"):
    body = body.encode() if isinstance(body, str) else body
    return (f"POST {target} HTTP/{version}\r\nHost: 127.0.0.1:8080\r\nUser-Agent: curl/7.88.1\r\n"
            f"Accept: */*\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def get(path, version="1.1", extra=""):
    return f"GET {path} HTTP/{version}\r\nHost: 127.0.0.1:8080\r\n{extra}\r\n".encode()


BODIES = {
    "text": {"model": "fortune", "prompt": "The meaning of life", "max_tokens": 32, "temperature": 0},
    "stream": {"prompt": "A fool", "max_tokens": 32, "temperature": 0.8, "seed": 7, "stream": True},
    "usage": {"prompt": "A fool", "max_tokens": 8, "stream": True,
              "stream_options": {"include_usage": True}, "return_token_ids": True},
    "ids": {"prompt": [1, 300, 40, 7], "max_tokens": 4, "top_k": 40, "top_p": 0.9, "ignore_eos": True},
    "stop": {"prompt": "Once upon a time", "max_tokens": 64, "stop": ["\n", "the"], "priority": 1},
    "one-string": {"prompt": ["Hello"], "n": 1, "best_of": 1, "echo": False, "logprobs": None,
                   "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u"},
    "errors": {"prompt": "x", "max_tokens": 0, "temperature": 3, "n": 2, "suffix": "s"},
    "unicode": {"prompt": "caf\u00e9 \u2603 \U0001F600 \\u00e9", "max_tokens": 16.0, "seed": -1,
                "stop": "\u2603"},
}

for name, body in BODIES.items():
    put("openai_request", name, json.dumps(body))
put("openai_request", "chat-tools", json.dumps({
    "messages": [{"role": "user", "content": "Weather?"},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                  "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "21"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Now",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": "auto", "chat_template_kwargs": {"enable_thinking": False},
    "add_generation_prompt": True}))
put("openai_request", "not-object", "[1, 2, 3]")
put("openai_request", "malformed", '{"prompt": "x", "max_tokens": 1')

http = {
    "completion": post(json.dumps(BODIES["text"])),
    "stream": post(json.dumps(BODIES["stream"])),
    "stream-http10": post(json.dumps(BODIES["usage"]), version="1.0"),
    "pipelined": post(json.dumps(BODIES["ids"])) + get("/health") + post(json.dumps(BODIES["stop"])),
    "continue": post(json.dumps(BODIES["text"]), extra="Expect: 100-continue\r\n"),
    "chunked": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: application/json\r\n\r\n10\r\n{\"prompt\": \"A f\r\nb\r\nool\", \"max\r\n"
                b"13\r\n_tokens\": 4, \"n\": 1}\r\n0\r\n\r\n"),
    "gets": get("/v1/models") + get("/ready") + get("/metrics?x=1") + get("/nowhere", extra="Connection: close\r\n"),
    "wrong-method": get("/v1/completions") + post("{}", target="/health"),
    "too-large": post(b"", extra="") .replace(b"Content-Length: 0", b"Content-Length: 2097152"),
    "errors": post(json.dumps(BODIES["errors"])) + post(json.dumps({"prompt": "x", "priority": 2, "stream": True})),
    "bad-line": b"GARBAGE / HTTP/9.9\r\n\r\n",
}
for name, data in http.items():
    put("http_request", name, data)
    put("http_server", name, data)

# ---- SSE: streams as the server sends them (the first byte seeds the split) ----

def chunk(obj):
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"

meta = {"id": "cmpl-00000000000000010000000000000001", "object": "text_completion",
        "created": 1733000000, "model": "fortune"}
def text_chunk(text, reason=None, usage=False, ids=None):
    c = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    if ids is not None:
        c["token_ids"] = ids
    o = dict(meta, choices=[c])
    if usage:
        o["usage"] = None
    return chunk(o)

stream = (text_chunk(" Once") + text_chunk(" upon") + text_chunk(" a time", "length")
          + "data: [DONE]\n\n")
usage = (": keep-alive\n\n" + text_chunk(" A", usage=True, ids=[319]) + text_chunk("", "stop", True, [])
         + chunk(dict(meta, choices=[], usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}))
         + "data: [DONE]\n\n")
error = (text_chunk(" x") + chunk({"error": {"message": "The request timed out.", "type": "timeout",
                                              "param": None, "code": None, "status": 504}})
         + "data: [DONE]\n\n")
put("sse_stream", "stream", b"\x07" + stream.encode())
put("sse_stream", "usage-ids", b"\x01" + usage.encode())
put("sse_stream", "error", b"\x30" + error.encode())
put("sse_stream", "crlf", b"\x02" + stream.replace("\n", "\r\n").encode())
put("sse_stream", "multiline", b"\x03event: x\r\nid: 1\rretry: 10\ndata: {\"a\":\ndata:1}\n\ndata:[DONE]\n\n")

# ---- config: the shipped files, and --set pairs as the README gives them ----

for f in (ROOT / "configs").glob("*.yaml"):
    put("config", f.stem, f.read_bytes())
put("config", "sizes", "server: {listen: '[::1]:0', max_body_bytes: 64KiB}\n"
    "kv_cache: {block_tokens: 32, bytes: 256MiB}\n"
    "devices:\n  - {kind: auto, threads: 1, memory: 2GiB}\n")
put("config_overrides", "readme", "batching.max_batch_tokens=4096\nparallel={replicas: 2}\n"
    "devices=[{kind: cpu, threads: 1}, {kind: cpu, threads: 3}]\ndevices[1].threads=2\n")
put("config_overrides", "kinds", "kv_cache.bytes=256MiB\nserver.listen=[::1]:0\nadmission.on_timeout=keep\n"
    "logging.level=debug\nrouting={policy: round_robin, seed: 7}\nmodel.name=a #1\nsupervision.within_s=0.5\n")

# ---- checkpoints: the bundled models' weights sliced to a tiny shape ----

TINY = dict(dim=8, hidden=8, layers=1, heads=2, kv_heads=1, vocab=16, seq=8)


def llama2c_arrays():
    """stories260K.bin's arrays (run.c order), as lists of rows of floats."""
    raw = (ROOT / "models/stories260K/stories260K.bin").read_bytes()
    dim, hid, L, H, KV, vocab, seq = struct.unpack("<7i", raw[:28])
    hs = dim // H
    kv = KV * hs
    pos = 28

    def take(rows, cols):
        nonlocal pos
        out = [list(struct.unpack_from(f"<{cols}f", raw, pos + 4 * r * cols)) for r in range(rows)]
        pos += 4 * rows * cols
        return out
    a = {"emb": take(abs(vocab), dim), "rms_att": take(L, dim), "wq": take(L * dim, dim),
         "wk": take(L * kv, dim), "wv": take(L * kv, dim), "wo": take(L * dim, dim),
         "rms_ffn": take(L, dim), "w1": take(L * hid, dim), "w2": take(L * dim, hid),
         "w3": take(L * hid, dim), "rms_final": take(1, dim)}
    return a


def cut(rows, r, c):
    return [row[:c] for row in rows[:r]]


def flat(rows):
    return [v for row in rows for v in row]


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def tiny_llama2c(tied=True):
    a = llama2c_arrays()
    t = TINY
    d, h, hs = t["dim"], t["hidden"], t["dim"] // t["heads"]
    kv = t["kv_heads"] * hs
    vocab = t["vocab"] if tied else -t["vocab"]
    out = struct.pack("<7i", d, h, t["layers"], t["heads"], t["kv_heads"], vocab, t["seq"])
    for key, r, c in (("emb", t["vocab"], d), ("rms_att", 1, d), ("wq", d, d), ("wk", kv, d),
                      ("wv", kv, d), ("wo", d, d), ("rms_ffn", 1, d), ("w1", h, d), ("w2", d, h),
                      ("w3", h, d), ("rms_final", 1, d)):
        out += f32(flat(cut(a[key], r, c)))
    out += f32([0.0] * (t["seq"] * hs))  # freq_cis, unread
    if not tied:
        out += f32(flat(cut(a["emb"], t["vocab"], d))[::-1])
    return out


put("llama2c", "tiny-tied", tiny_llama2c(True))
put("llama2c", "tiny-untied", tiny_llama2c(False))
put("llama2c", "header-only", (ROOT / "models/stories260K/stories260K.bin").read_bytes()[:28])


def read_safetensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        shape = e["shape"]
        vals = struct.unpack(f"<{(end - b) // 4}f", data[b:end])
        cols = shape[-1]
        out[name] = [list(vals[i:i + cols]) for i in range(0, len(vals), cols)]
    return out


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def f16(values):
    return b"".join(struct.pack("<e", v) for v in values)


def safetensors(tensors, metadata=None, dtype="F32"):
    """tensors: [(name, shape, floats)] -> bytes, laid out as write_safetensors does."""
    enc = {"F32": f32, "F16": f16, "BF16": bf16}[dtype]
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, shape, values in tensors:
        blob = enc(values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs)


def tiny_hf_tensors():
    w = read_safetensors(ROOT / "models/fortune/model.safetensors")
    t = TINY
    d, h, hd = t["dim"], t["hidden"], t["dim"] // t["heads"]
    kv = t["kv_heads"] * hd
    p = "model.layers.0."
    spec = [("model.embed_tokens.weight", "model.embed_tokens.weight", t["vocab"], d),
            (p + "input_layernorm.weight", p + "input_layernorm.weight", 1, d),
            (p + "self_attn.q_proj.weight", p + "self_attn.q_proj.weight", d, d),
            (p + "self_attn.k_proj.weight", p + "self_attn.k_proj.weight", kv, d),
            (p + "self_attn.v_proj.weight", p + "self_attn.v_proj.weight", kv, d),
            (p + "self_attn.o_proj.weight", p + "self_attn.o_proj.weight", d, d),
            (p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight", 1, d),
            (p + "mlp.gate_proj.weight", p + "mlp.gate_proj.weight", h, d),
            (p + "mlp.up_proj.weight", p + "mlp.up_proj.weight", h, d),
            (p + "mlp.down_proj.weight", p + "mlp.down_proj.weight", d, h),
            ("model.norm.weight", "model.norm.weight", 1, d)]
    out = []
    for name, src, r, c in spec:
        shape = [c] if r == 1 else [r, c]
        out.append((name, shape, flat(cut(w[src], r, c))))
    return out


def tiny_hf_config(**over):
    c = json.loads((ROOT / "models/fortune/config.json").read_text())
    t = TINY
    c.update(hidden_size=t["dim"], intermediate_size=t["hidden"], num_hidden_layers=t["layers"],
             num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"],
             head_dim=t["dim"] // t["heads"], vocab_size=t["vocab"], max_position_embeddings=t["seq"])
    c.update(over)
    return json.dumps(c, indent=2).encode()


tensors = tiny_hf_tensors()
put("safetensors", "tiny-f32", safetensors(tensors[:3], {"format": "pt"}))
put("safetensors", "tiny-bf16", safetensors(tensors[1:4], dtype="BF16"))
put("safetensors", "tiny-f16", safetensors(tensors[5:7], {"format": "pt", "note": "f16"}, dtype="F16"))
put("hf_dir", "tiny", tiny_hf_config() + SEP + safetensors(tensors, {"format": "pt"}))
untied = tensors + [("lm_head.weight", [TINY["vocab"], TINY["dim"]], tensors[0][2][::-1])]
put("hf_dir", "tiny-untied-bf16",
    tiny_hf_config(tie_word_embeddings=False, eos_token_id=2) + SEP + safetensors(untied, dtype="BF16"))
half = len(tensors) // 2
index = {"metadata": {"total_size": 0},
         "weight_map": {n: ("s1.safetensors" if i < half else "s2.safetensors")
                        for i, (n, _, _) in enumerate(tensors)}}
put("hf_dir", "tiny-sharded", tiny_hf_config() + SEP + SEP + json.dumps(index, indent=2).encode() + SEP
    + safetensors(tensors[:half]) + SEP + safetensors(tensors[half:]))

# ---- tokenizer: the bundled SentencePiece model ----

# ---- GGUF: llama.cpp's model file, a tiny model with a SentencePiece-style
# vocabulary, tensors f32, f16, q8_0 and q4_K; and the test vocabularies ----

def gguf(meta, tensors):
    """meta: [(key, type, value)]; tensors: [(name, ne, ggml_type, bytes)] -> GGUF v3."""
    def gstr(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    def value(t, v):
        if t == 8:
            return gstr(v)
        if t == 9:
            et, items = v
            return struct.pack("<IQ", et, len(items)) + b"".join(value(et, i) for i in items)
        return struct.pack({4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}[t], v)
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, t, v in meta:
        out += gstr(k) + struct.pack("<I", t) + value(t, v)
    off, blobs = 0, b""
    for name, ne, t, data in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", t, off)
        pad = (32 - len(data) % 32) % 32
        blobs += data + b"\0" * pad
        off += len(data) + pad
    out += b"\0" * ((32 - len(out) % 32) % 32)
    return out + blobs


def tiny_gguf():
    d, h, v = 32, 256, 16
    def f32s(n, scale=0.1):
        return b"".join(struct.pack("<f", scale * (((i * 7919) % 23) - 11) / 11) for i in range(n))
    def f16s(n):
        return b"".join(struct.pack("<e", 0.05 * (((i * 31) % 17) - 8) / 8) for i in range(n))
    def q8_0(rows, cols):  # per block of 32: f16 scale, 32 int8
        return b"".join(struct.pack("<e", 0.01) + bytes((j * 5 + r) % 256 for j in range(32))
                        for r in range(rows) for _ in range(cols // 32))
    def q4_k(rows, cols):  # per block of 256: d, dmin, 12 scale bytes, 128 nibble bytes
        return b"".join(struct.pack("<ee", 0.01, 0.002) + bytes(range(1, 13)) +
                        bytes((j * 13 + r) % 256 for j in range(128))
                        for r in range(rows) for _ in range(cols // 256))
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in (10, 32)] + \
        ["\u2581", "\u2581the", "t", "h", "e", "a", "\u2581a", "he", "th", "re", "<|user|>"]
    kinds = [2, 3, 3, 6, 6] + [1] * 10 + [4]
    meta = [("general.architecture", 8, "llama"), ("llama.context_length", 4, 16),
            ("llama.embedding_length", 4, d), ("llama.block_count", 4, 1),
            ("llama.feed_forward_length", 4, h), ("llama.attention.head_count", 4, 2),
            ("llama.attention.head_count_kv", 4, 1), ("llama.rope.freq_base", 6, 10000.0),
            ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
            ("tokenizer.ggml.model", 8, "llama"), ("tokenizer.ggml.tokens", 9, (8, pieces)),
            ("tokenizer.ggml.scores", 9, (6, [-float(i) for i in range(v)])),
            ("tokenizer.ggml.token_type", 9, (5, kinds)),
            ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2),
            ("tokenizer.chat_template", 8, "{% for m in messages %}{{ m['content'] }}{% endfor %}")]
    kv = d // 2
    tensors = [("token_embd.weight", [d, v], 1, f16s(d * v)),
               ("blk.0.attn_norm.weight", [d], 0, f32s(d, 1.0)),
               ("blk.0.attn_q.weight", [d, d], 8, q8_0(d, d)),
               ("blk.0.attn_k.weight", [d, kv], 1, f16s(d * kv)),
               ("blk.0.attn_v.weight", [d, kv], 30, f16s(d * kv)),
               ("blk.0.attn_output.weight", [d, d], 8, q8_0(d, d)),
               ("blk.0.ffn_norm.weight", [d], 0, f32s(d, 1.0)),
               ("blk.0.ffn_gate.weight", [d, h], 8, q8_0(h, d)),
               ("blk.0.ffn_up.weight", [d, h], 8, q8_0(h, d)),
               ("blk.0.ffn_down.weight", [h, d], 12, q4_k(d, h)),
               ("output_norm.weight", [d], 0, f32s(d, 1.0))]
    return gguf(meta, tensors)


def tiny_bpe_vocab(pre):
    """A byte-level BPE vocabulary alone: the 256 byte tokens as GPT-2 spells
    them, a few merges, two special tokens."""
    def byte_char(b):
        keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        if b in keep:
            return chr(b)
        return chr(256 + sorted(set(range(256)) - set(keep)).index(b))
    tokens = [byte_char(b) for b in range(256)]
    merges = []
    for a, b in [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("1", "2"), ("a", "n")]:
        merges.append(a + " " + b)
        tokens.append(a + b)
    tokens += ["<|begin_of_text|>", "<|eot_id|>"]
    kinds = [1] * (len(tokens) - 2) + [3, 3]
    meta = [("general.architecture", 8, "llama"), ("tokenizer.ggml.model", 8, "gpt2"),
            ("tokenizer.ggml.pre", 8, pre), ("tokenizer.ggml.tokens", 9, (8, tokens)),
            ("tokenizer.ggml.token_type", 9, (5, kinds)), ("tokenizer.ggml.merges", 9, (8, merges)),
            ("tokenizer.ggml.bos_token_id", 4, len(tokens) - 2),
            ("tokenizer.ggml.eos_token_id", 4, len(tokens) - 1),
            ("tokenizer.ggml.add_bos_token", 7, True)]
    return gguf(meta, [])


put("gguf", "tiny-llama", tiny_gguf())
put("gguf", "vocab-llama-bpe", tiny_bpe_vocab("llama-bpe"))
put("gguf", "vocab-qwen2", tiny_bpe_vocab("qwen2"))
put("gguf", "vocab-smollm", tiny_bpe_vocab("smollm"))

put("tokenizer_model", "fortune", (ROOT / "models/fortune/tokenizer.model").read_bytes())

# ---- tokenizer_json: prompts in many scripts, with and without specials ----

for i, case in enumerate(json.loads((ROOT / "tests/data/tokenizers/llama3_1-small.expected.json")
                                    .read_text())["cases"][::4]):
    put("tokenizer_json", "text-%02d" % i, case["text"].encode())

# ---- jinja_template: real chat templates, and one line of each Jinja feature ----

for path in sorted((ROOT / "tests/data/chat_templates").glob("*.jinja")):
    put("jinja_template", path.stem, path.read_bytes())
put("jinja_template", "features",
    "{%- set ns = namespace(n=0) -%}{% for m in messages if m.role != 'system' %}"
    "{{ loop.index }}{{ m.content|trim|tojson }}{% set ns.n = ns.n + 1 %}{% endfor %}"
    "{% macro f(x, y=2) %}{{ x ~ y }}{% endmacro %}{{ f(1) }}{{ tools[0].function|items|list }}"
    "{{ messages[-1].content.split(' ')[::-1]|join(',') }}{% raw %}{{ x }}{% endraw %}"
    "{{ 'a' if true else 'b' }}{{ 7 // 2 }}{{ none is none }}{{ raise_exception('x') if false }}")

# ---- grammar: GBNF grammars and JSON schemas (structured output) ----

put("grammar", "json-list", 'root ::= "[" ws (item ("," ws item)*)? "]"\n'
    'item ::= "\\"" [^"\\\\]* "\\"" | [0-9]+ | "true" | "null"\nws ::= [ \\t\\n]{0,3}\n')
put("grammar", "repeats", 'root ::= ("ab" | [x-z]){2,5} .? "é"* (a | "\\u00e9")+\na ::= [^a-c\\x00-\\x1F]\n')
put("grammar", "schema", json.dumps({
    "$defs": {"node": {"type": "object", "properties": {"v": {"enum": ["a", 1, None]},
                       "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                       "required": ["v"]}},
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"}, "n": {"type": ["integer", "null"]},
                   "s": {"type": "string", "minLength": 1, "maxLength": 3, "format": "date"},
                   "t": {"type": "array", "prefixItems": [{"const": "x"}, {"type": "boolean"}]},
                   "o": {"type": "object", "additionalProperties": {"type": "number"}},
                   "u": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string"}]}},
    "required": ["root"]}))
put("grammar", "choice", json.dumps({"enum": ["yes", "no", "é😀"]}))
put("grammar", "regex", r"^(?:[A-Z]{2,3}|\d+)-[^\s,\"]*(cat|dog)s?\.\u00e9x{1,3}?$")
put("grammar", "bounds", json.dumps({"type": "array", "items": {"anyOf": [
    {"type": "integer", "minimum": -42, "exclusiveMaximum": 1234},
    {"type": "integer", "exclusiveMinimum": 7}, {"type": "integer", "maximum": -3}]}}))

# ---- basp_frames: BASP streams as a proxied link carries them ----
# (fuzz_basp_frames.cpp: a 10-byte fault header, a read-size seed byte, the
# stream; the header layout is net/link_proxy.h's). The wire_messages seeds
# are written by wire_seeds (C++: CAF serializes them), not here.


def basp(op, payload=b"", flags=0, data=0, src=0, dst=0):
    return struct.pack(">BBBBIQQQ", op, 0, 0, flags, len(payload), data, src, dst) + payload


def faults(drop=None, dup=None, reorder=None, clear=False, to_client=False):
    """drop/dup/reorder: (probability 0..255, frame_ops mask, reorder wait in 10 ms)."""
    flags = (1 if drop else 0) | (2 if dup else 0) | (4 if reorder else 0) | (8 if clear else 0)
    flags |= 16 if to_client else 0
    return bytes([flags]) + b"".join(bytes(f or (0, 0, 0)) for f in (drop, dup, reorder))


# A client's side of a connection: handshake, a few messages, a heartbeat.
# Payloads are stand-ins of the sizes real ones have (a JoinRequest, a step).
session = (basp(1, b"\x00" * 40 + b"troupe-node-a", data=0x170)
           + basp(2, b"join-request " * 6, src=5, dst=1, data=1)
           + basp(2, b"\x00\x01" * 90, src=5, dst=3, data=2)
           + basp(4, b"\x00" * 24, src=5) + basp(6) + basp(3, b"routed" * 10, src=5, dst=9)
           + basp(2, b"", src=5, dst=1) + basp(5, b"\x00" * 16, dst=5))
ops = 0x0C  # direct and routed messages, as LinkFault's default frame_ops
put("basp_frames", "clean", faults() + b"\x05" + session)
put("basp_frames", "drop", faults(drop=(128, ops, 0)) + b"\x11" + session)
put("basp_frames", "duplicate", faults(dup=(128, ops, 0), to_client=True) + b"\x23" + session)
put("basp_frames", "reorder", faults(reorder=(200, ops, 20)) + b"\x37" + session)
put("basp_frames", "all-cleared", faults((60, 0x7F, 0), (60, ops, 0), (60, ops, 5), clear=True)
    + b"\x41" + session)
put("basp_frames", "cut-short", faults(reorder=(255, ops, 50)) + b"\x02" + session[:-20])
put("basp_frames", "not-basp", faults(dup=(255, ops, 0)) + b"\x09" + session[:150]
    + b"GET / HTTP/1.1\r\n\r\n" + session[150:])
