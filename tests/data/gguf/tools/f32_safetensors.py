"""Reads and writes the f32 model.safetensors that `troupe synth-model
--dtype f32` writes, for the scripts here that rewrite one as another
architecture."""
import json, struct
from pathlib import Path
import numpy as np


def read(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack('<Q', raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); base = 8 + n
    t = {}
    for k, v in hdr.items():
        if k == '__metadata__': continue
        a, b = v['data_offsets']
        t[k] = np.frombuffer(raw[base + a:base + b], dtype=np.float32).reshape(v['shape'])
    return t


def write(path: Path, tensors: dict) -> None:
    h, off, blobs = {}, 0, []
    for k in sorted(tensors):
        b = np.ascontiguousarray(tensors[k]).tobytes()
        h[k] = {'dtype': 'F32', 'shape': list(tensors[k].shape), 'data_offsets': [off, off + len(b)]}
        off += len(b); blobs.append(b)
    hj = json.dumps(h).encode(); hj += b' ' * ((8 - len(hj) % 8) % 8)
    path.write_bytes(struct.pack('<Q', len(hj)) + hj + b''.join(blobs))
