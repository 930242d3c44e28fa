"""A synth-model Llama checkpoint rewritten as Gemma 3 (gemma3_text): q/k
norms, norms before and after attention and the FFN stored as w for a
scale of 1 + w, GELU (tanh), 6 layers of which the last attends to every
position and the others to a sliding window of 16, for llama.cpp's
convert_hf_to_gguf.py. usage: to_gemma3.py SRC DST TOKENIZER_MODEL"""
import json, sys, shutil
from pathlib import Path
import numpy as np
import f32_safetensors
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(exist_ok=True)
t = f32_safetensors.read(src / 'model.safetensors')
cfg = json.load(open(src / 'config.json'))
rng = np.random.default_rng(12)
hd = cfg['hidden_size'] // cfg['num_attention_heads']
def small(*shape):
    return (rng.standard_normal(shape) * 0.2).astype(np.float32)
out = {'model.embed_tokens.weight': t['model.embed_tokens.weight'] * np.float32(0.05), 'model.norm.weight': small(cfg['hidden_size'])}
for l in range(cfg['num_hidden_layers']):
    p = f'model.layers.{l}.'
    for k in ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj',
              'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'):
        out[p + k + '.weight'] = t[p + k + '.weight']
    for k in ('input_layernorm', 'post_attention_layernorm', 'pre_feedforward_layernorm',
              'post_feedforward_layernorm'):
        out[p + k + '.weight'] = small(cfg['hidden_size'])
    out[p + 'self_attn.q_norm.weight'] = small(hd)
    out[p + 'self_attn.k_norm.weight'] = small(hd)
f32_safetensors.write(dst / 'model.safetensors', out)
g = {'architectures': ['Gemma3ForCausalLM'], 'model_type': 'gemma3_text',
     'hidden_size': cfg['hidden_size'], 'intermediate_size': cfg['intermediate_size'],
     'num_hidden_layers': cfg['num_hidden_layers'], 'num_attention_heads': cfg['num_attention_heads'],
     'num_key_value_heads': cfg['num_key_value_heads'], 'head_dim': hd, 'vocab_size': cfg['vocab_size'],
     'max_position_embeddings': cfg['max_position_embeddings'], 'rms_norm_eps': 1e-6,
     'rope_theta': 1000000.0, 'rope_local_base_freq': 10000.0, 'rope_scaling': None,
     'sliding_window': 16, 'sliding_window_pattern': 6, 'query_pre_attn_scalar': hd,
     'hidden_activation': 'gelu_pytorch_tanh', 'final_logit_softcapping': None,
     'attn_logit_softcapping': None, 'attention_bias': False, 'tie_word_embeddings': True,
     'bos_token_id': cfg.get('bos_token_id', 1), 'eos_token_id': cfg.get('eos_token_id', 2),
     'pad_token_id': 0, 'torch_dtype': 'float32'}
json.dump(g, open(dst / 'config.json', 'w'), indent=2)
shutil.copy(sys.argv[3], dst / 'tokenizer.model')
