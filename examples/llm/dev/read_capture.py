#!/usr/bin/env python3
"""Read a capture file written by `llm_eval --capture FILE` (format in capture.h).

  python3 dev/read_capture.py FILE            # prints a summary
  from read_capture import load; hdr, q, k, v = load(FILE)
      q: {layer: [tokens, num_heads, head_dim]}, k, v: {layer: [tokens, num_kv_heads, head_dim]}
      (float32; tokens in (seq, pos) order; dims in RoPE NORM order, see kv_backend.h)"""
import sys
import numpy as np


def load(path):
    raw = np.fromfile(path, dtype=np.uint8)
    assert raw[:8].tobytes() == b"QKVCAP1\0", "not a QKVCAP1 file"
    L, H, HKV, D, dtype = (int(x) for x in raw[8:28].view(np.uint32))
    n = int(raw[40:48].view(np.uint64)[0])
    es = 2 if dtype == 1 else 4
    row = (H + 2 * HKV) * D
    rec = np.dtype([("layer", "<u4"), ("seq", "<u4"), ("pos", "<i8"), ("x", "<u2" if es == 2 else "<f4", (row,))])
    r = raw[64:64 + n * rec.itemsize].view(rec)
    x = r["x"]
    if es == 2:
        x = (x.astype(np.uint32) << 16).view(np.float32)
    q, k, v = {}, {}, {}
    for l in range(L):
        sel = np.nonzero(r["layer"] == l)[0]
        sel = sel[np.lexsort((r["pos"][sel], r["seq"][sel]))]
        xl = x[sel]
        q[l] = xl[:, :H * D].reshape(-1, H, D)
        k[l] = xl[:, H * D:(H + HKV) * D].reshape(-1, HKV, D)
        v[l] = xl[:, (H + HKV) * D:].reshape(-1, HKV, D)
    return dict(layers=L, heads=H, kv_heads=HKV, head_dim=D, dtype=dtype, records=n), q, k, v


if __name__ == "__main__":
    hdr, q, k, v = load(sys.argv[1])
    print(hdr)
    for l in (0, hdr["layers"] // 2, hdr["layers"] - 1):
        print(f"layer {l}: tokens {q[l].shape[0]}; |q| rms {np.sqrt((q[l]**2).mean()):.3f}, "
              f"|k| rms {np.sqrt((k[l]**2).mean()):.3f}, |v| rms {np.sqrt((v[l]**2).mean()):.3f}")
