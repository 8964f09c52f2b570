#!/usr/bin/env python3
"""Session 32: session 31's decode trace re-read (docs/decode.md, "Session 32").
   usage: python3 session32_trace_reread.py [session31_decode_trace.csv]
Per shape: INT2 loop times (waited -> loop_end) per SM and their rank correlation
across shapes, the loop time's correlation with start time and CTA index, the
order effect on 4-CTA SMs, and the INT2 tail (max - mean of each SM's last done)."""
import collections, csv, os, statistics as st, sys

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "session31_decode_trace.csv")
rows = list(csv.DictReader(open(path)))


def int2(shape):
    d = collections.defaultdict(dict)
    for r in rows:
        if r["shape"] == shape and r["kernel"] == "decode_int2":
            d[int(r["cta"])][r["mark"]] = (float(r["us"]), int(r["sm"]))
    return {c: v for c, v in d.items() if all(m in v for m in ("entry", "waited", "loop_end", "done"))}


def corr(xs, ys):
    mx, my = st.mean(xs), st.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / len(xs) / (st.pstdev(xs) * st.pstdev(ys))


def spearman(a, b):
    ks = sorted(set(a) & set(b))
    ra = {k: i for i, k in enumerate(sorted(ks, key=a.get))}
    rb = {k: i for i, k in enumerate(sorted(ks, key=b.get))}
    return corr([ra[k] for k in ks], [rb[k] for k in ks])


shapes = sorted(set(r["shape"] for r in rows))
sm_mean = {}
for sh in shapes:
    d = int2(sh)
    loop = {c: v["loop_end"][0] - v["waited"][0] for c, v in d.items()}
    per = collections.defaultdict(list)
    for c, v in d.items():
        per[v["entry"][1]].append(c)
    sm_mean[sh] = {s: st.mean(loop[c] for c in cs) for s, cs in per.items()}
    last = [max(d[c]["done"][0] for c in cs) for cs in per.values()]
    line = f"{sh:22s} CTAs {len(d):4d} SMs {len(per):3d} INT2 tail {max(last) - st.mean(last):4.1f} us"
    if len(d) > len(per):
        cs = list(loop)
        line += (f"  corr(loop, start) {corr([d[c]['waited'][0] for c in cs], [loop[c] for c in cs]):5.2f}"
                 f"  corr(loop, cta) {corr(cs, [loop[c] for c in cs]):5.2f}")
        order = collections.defaultdict(list)
        for cs4 in per.values():
            if len(cs4) == 4:
                for i, c in enumerate(sorted(cs4, key=lambda c: d[c]["entry"][0])):
                    order[i].append(loop[c])
        if order:
            line += "  loop by arrival on 4-CTA SMs " + " / ".join(f"{st.mean(order[i]):.1f}" for i in range(4))
    print(line)
multi = [sh for sh in shapes if len(int2(sh)) > 132]
print("Spearman of per-SM mean loop times between shapes:")
for a in multi:
    print(f"  {a:22s}", " ".join(f"{spearman(sm_mean[a], sm_mean[b]):5.2f}" for b in multi))
