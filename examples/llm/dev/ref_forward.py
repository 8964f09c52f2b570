#!/usr/bin/env python3
"""Dev-only cross-check of model.c: an independent numpy forward pass (float64) of the GGUF
llama model, weights dequantized by the `gguf` package. Compares the logits that
`llm_eval --kv f32 --dump-logits FILE --dump-n N` wrote for the first N tokens of the text.

  llm_eval -m MODEL -f TEXT --kv f32 --dump-logits /tmp/c.f32 --dump-n 64
  python3 dev/ref_forward.py MODEL TEXT /tmp/c.f32 64 [norm|neox]   (pip install gguf numpy tokenizers)

Tokens come from dev/ref_tokenize.py's Hugging Face tokenizer, so the tokenizer is checked too."""
import subprocess
import sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

model, text, dump, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
style = sys.argv[5] if len(sys.argv) > 5 else "norm"
r = GGUFReader(model)
kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml")}
W = {t.name: dequantize(t.data, t.tensor_type).reshape(tuple(int(x) for x in reversed(t.shape))).astype(np.float64)
     for t in r.tensors}
L, D = kv["llama.block_count"], kv["llama.embedding_length"]
H, HKV = kv["llama.attention.head_count"], kv["llama.attention.head_count_kv"]
hd, theta, eps = D // H, kv["llama.rope.freq_base"], kv["llama.attention.layer_norm_rms_epsilon"]
ids = [int(x) for x in subprocess.run([sys.executable, __file__.replace("ref_forward", "ref_tokenize"), model, text],
                                      capture_output=True, text=True, check=True).stdout.split()][:n]
T = len(ids)


def rms(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


inv = theta ** (-np.arange(0, hd, 2) / hd)           # [hd/2]
ang = np.arange(T)[:, None] * inv[None, :]            # [T, hd/2]
cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]


def rope(x):                                          # x [T, heads, hd]
    if style == "norm":
        a, b = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2], y[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        y = np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)
    return y


x = W["token_embd.weight"][ids]
mask = np.triu(np.full((T, T), -np.inf), 1)
for l in range(L):
    p = f"blk.{l}."
    h = rms(x, W[p + "attn_norm.weight"])
    q = rope((h @ W[p + "attn_q.weight"].T).reshape(T, H, hd))
    k = rope((h @ W[p + "attn_k.weight"].T).reshape(T, HKV, hd))
    v = (h @ W[p + "attn_v.weight"].T).reshape(T, HKV, hd)
    k, v = np.repeat(k, H // HKV, 1), np.repeat(v, H // HKV, 1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", s, v).reshape(T, D)
    x = x + o @ W[p + "attn_output.weight"].T
    h = rms(x, W[p + "ffn_norm.weight"])
    g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
    x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
out = W.get("output.weight", W["token_embd.weight"])
ref = rms(x, W["output_norm.weight"]) @ out.T

c = np.fromfile(dump, dtype=np.float32).reshape(-1, ref.shape[1])[:T]
err = np.abs(c - ref).max(-1)
lp_ref = ref - np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True)) - ref.max(-1, keepdims=True)
nll = -np.mean([lp_ref[t, ids[t + 1]] for t in range(T - 1)])
print(f"tokens {T}; max |logit diff| per position: max {err.max():.3g}, mean {err.mean():.3g} "
      f"(logit scale {np.abs(ref).max():.1f}); argmax agree {np.mean(c.argmax(-1) == ref.argmax(-1)):.3f}; "
      f"reference ppl over these tokens {np.exp(nll):.4f}")
