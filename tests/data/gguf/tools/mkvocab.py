# Vocabulary-only GGUFs from the tokenizer.json fixtures, written with
# llama.cpp's gguf-py as its converter writes a byte-level BPE vocabulary.
# Usage: PYTHONPATH=LLAMA_CPP/gguf-py python3 mkvocab.py TOKENIZER.json OUT.gguf PRE ADD_BOS(0|1)
import json, sys
import gguf
src, out, pre, add_bos = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == '1'
j = json.load(open(src))
vocab = j['model']['vocab']
added = {a['id']: a for a in j['added_tokens']}
n = max(list(vocab.values()) + list(added.keys())) + 1
tokens = [''] * n; types = [gguf.TokenType.UNUSED] * n
for t, i in vocab.items():
    tokens[i] = t; types[i] = gguf.TokenType.NORMAL
for i, a in added.items():
    tokens[i] = a['content']
    types[i] = gguf.TokenType.CONTROL if a.get('special') else gguf.TokenType.USER_DEFINED
for i in range(n):
    if not tokens[i]: tokens[i] = '[PAD%d]' % i
merges = [m if isinstance(m, str) else m[0] + ' ' + m[1] for m in j['model'].get('merges', [])]
w = gguf.GGUFWriter(out, 'llama')
w.add_context_length(256); w.add_embedding_length(64); w.add_block_count(1)
w.add_feed_forward_length(128); w.add_head_count(1); w.add_layer_norm_rms_eps(1e-5)
w.add_tokenizer_model('gpt2'); w.add_tokenizer_pre(pre)
w.add_token_list(tokens); w.add_token_types(types); w.add_token_merges(merges)
def find(s):
    for i, a in added.items():
        if a['content'] == s: return i
    return None
bos = find('<|begin_of_text|>'); eos = find('<|eot_id|>') or find('<|endoftext|>') or find('<|im_end|>')
if bos is not None: w.add_bos_token_id(bos)
if eos is not None: w.add_eos_token_id(eos)
w.add_add_bos_token(add_bos)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print(out, n, 'tokens', len(merges), 'merges', 'bos', bos, 'eos', eos)
