# Step-trace A/B by time slice (twentieth session): python slice_ab.py TRACE PERIOD_S
import json, sys, statistics, collections
period = float(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1])]
dec = [r for r in rows if r["kind"] == "decode"]
res = collections.defaultdict(list)
for prev, cur in zip(dec, dec[1:]):
    s = cur.get("sample")
    if not s or prev["pid"] != cur["pid"]:
        continue
    t0 = prev["t"]; t1 = cur["t"]
    m0 = int(t0 / period) % 2; m1 = int(t1 / period) % 2
    if m0 != m1 or int(t0/period) != int(t1/period):
        continue
    res[(s[0], s[1], "new" if m0 == 1 else "old")].append(s[2])
keys = sorted({(w, b) for w, b, _ in res})
for w, b in keys:
    o, n = res.get((w, b, "old"), []), res.get((w, b, "new"), [])
    if len(o) < 5 or len(n) < 5: continue
    print(f"W={w} bs={b}: old {statistics.median(o):.1f} ms (n={len(o)})  new {statistics.median(n):.1f} ms (n={len(n)})  new/old median {statistics.median(n)/statistics.median(o):.3f}  mean {statistics.fmean(n)/statistics.fmean(o):.3f}")
