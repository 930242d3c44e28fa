"""A synth-model Llama checkpoint rewritten as Phi-3 (fused qkv_proj and
gate_up_proj, vocabulary padded past the SentencePiece model with Phi-3's
added tokens), for llama.cpp's convert_hf_to_gguf.py."""
import json, sys, shutil
from pathlib import Path
import numpy as np
import f32_safetensors
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(exist_ok=True)
t = f32_safetensors.read(src / 'model.safetensors')
rng = np.random.default_rng(11)
VOCAB = 2008
out = {}
for k, v in t.items():
    if k in ('model.embed_tokens.weight', 'lm_head.weight'):
        extra = (rng.standard_normal((VOCAB - v.shape[0], v.shape[1])) * v.std()).astype(np.float32)
        out[k] = np.concatenate([v, extra])
    elif any(s in k for s in ('q_proj', 'k_proj', 'v_proj', 'gate_proj', 'up_proj')):
        continue
    else:
        out[k] = v
layers = json.load(open(src / 'config.json'))['num_hidden_layers']
for l in range(layers):
    p = f'model.layers.{l}.'
    out[p + 'self_attn.qkv_proj.weight'] = np.concatenate([t[p + 'self_attn.q_proj.weight'], t[p + 'self_attn.k_proj.weight'], t[p + 'self_attn.v_proj.weight']])
    out[p + 'mlp.gate_up_proj.weight'] = np.concatenate([t[p + 'mlp.gate_proj.weight'], t[p + 'mlp.up_proj.weight']])
f32_safetensors.write(dst / 'model.safetensors', out)
cfg = json.load(open(src / 'config.json'))
cfg.update({'architectures': ['Phi3ForCausalLM'], 'model_type': 'phi3', 'vocab_size': VOCAB,
            'original_max_position_embeddings': 256, 'sliding_window': 128,
            'eos_token_id': 2000, 'pad_token_id': 2000})
cfg.pop('head_dim', None)
json.dump(cfg, open(dst / 'config.json', 'w'), indent=2)
added = {2000: ('<|endoftext|>', False), 2001: ('<|assistant|>', True), 2002: ('<|end|>', True), 2003: ('<|user|>', True)}
json.dump({'tokenizer_class': 'LlamaTokenizer', 'bos_token': '<s>', 'eos_token': '<|endoftext|>',
           'added_tokens_decoder': {str(i): {'content': c, 'special': True, 'rstrip': r, 'lstrip': False,
                                             'normalized': False, 'single_word': False}
                                    for i, (c, r) in added.items()}},
          open(dst / 'tokenizer_config.json', 'w'), indent=2)
shutil.copy(sys.argv[3], dst / 'tokenizer.model')
