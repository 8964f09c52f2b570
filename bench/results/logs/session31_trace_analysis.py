"""Session 31: the per-wave / per-SM summaries of bench/results/logs/session31_h200.txt section 4,
from the --trace CSVs of bench_decode and bench_quantize. A record of how the numbers were made
(not part of the build):  python3 session31_trace_analysis.py decode.csv quantize.csv"""
import sys
DECODE, QUANT = sys.argv[1], sys.argv[2]
import csv, collections, statistics as st, sys
rows=list(csv.DictReader(open(DECODE)))
by=collections.OrderedDict()
for r in rows: by.setdefault(r['shape'],[]).append(r)
def ctas(rs, kernel):
    d=collections.defaultdict(dict)
    for r in rs:
        if r['kernel']==kernel: d[int(r['cta'])][r['mark']]=(float(r['us']),int(r['sm']))
    return d
for shape, rs in by.items():
    print('==',shape)
    i2=ctas(rs,'decode_int2'); w=ctas(rs,'decode_window'); m=ctas(rs,'decode_merge') or ctas(rs,'decode_merge_head'); p=ctas(rs,'decode_prep')
    ent=sorted(v['entry'][0] for v in i2.values())
    first=[c for c,v in i2.items() if v['entry'][0] < ent[0]+15]
    second=[c for c in i2 if c not in first]
    def span(cs, a, b):
        x=[i2[c][b][0]-i2[c][a][0] for c in cs if a in i2[c] and b in i2[c]]
        return '%.1f / %.1f / %.1f'%(min(x), st.median(x), max(x)) if x else '-'
    print('  INT2 first wave %d CTAs, second %d; first wave waited->loop_end %s, loop_end->done %s'%(len(first),len(second),span(first,'waited','loop_end'), span(first,'loop_end','done')))
    if second: print('  second wave entry %.1f-%.1f, entry->loop_end %s'%(min(i2[c]['entry'][0] for c in second), max(i2[c]['entry'][0] for c in second), span(second,'entry','loop_end')))
    sm_n=collections.Counter(i2[c]['entry'][1] for c in first)
    ends=collections.defaultdict(list)
    for c in first: ends[sm_n[i2[c]['entry'][1]]].append(i2[c]['done'][0])
    print('  first-wave INT2 CTAs per SM -> SMs: %s; done by CTAs on the SM: %s'%(dict(sorted(collections.Counter(sm_n.values()).items())), {k:'%.1f / %.1f / %.1f'%(min(v),st.median(v),max(v)) for k,v in sorted(ends.items())}))
    dn=sorted(v['done'][0] for v in i2.values())
    print('  INT2 done p10 / p50 / p90 / max %.1f / %.1f / %.1f / %.1f; prep done max %.1f; last window done %.1f; last merge done %.1f'%(dn[len(dn)//10],dn[len(dn)//2],dn[9*len(dn)//10],dn[-1], max(v['done'][0] for v in p.values()), max(v['done'][0] for v in w.values()) if w else 0, max(v['done'][0] for v in m.values())))
    wd=[v['done'][0]-v['entry'][0] for v in w.values()]
    if wd: print('  window CTA entry->done %.1f / %.1f / %.1f; window CTAs entering after the last INT2 entry: %d of %d'%(min(wd),st.median(wd),max(wd), sum(1 for v in w.values() if v['entry'][0]>ent[-1]), len(w)))

rows=[r for r in csv.DictReader(open(QUANT))]
for case in sorted(set(r['case'] for r in rows)):
    c=collections.defaultdict(dict)
    for r in rows:
        if r['case']==case: c[int(r['cta'])][r['mark']]=(float(r['us']),int(r['sm']))
    gx=max(1,(max(c)+1+71)//72)
    side={k:(k//(gx*36)) for k in c}
    sm_sides=collections.defaultdict(list)
    for k,v in c.items(): sm_sides[v['entry'][1]].append(side[k])
    comp=collections.defaultdict(list)
    for k,v in c.items():
        key=('K' if side[k]==0 else 'V')+' CTA on an SM with '+'+'.join(sorted('K' if x==0 else 'V' for x in sm_sides[v['entry'][1]]))
        comp[key].append(v['done'][0])
    w=[v['waited'][0]-v['entry'][0] for v in c.values()]
    print('== %s: %d CTAs (grid x %d); entry->waited (R and table staged) %.2f / %.2f / %.2f us'%(case,len(c),gx,min(w),st.median(w),max(w)))
    for key,v in sorted(comp.items()): print('  %-28s %4d  done %.1f / %.1f / %.1f'%(key,len(v),min(v),st.median(v),max(v)))
