import re, sys, statistics as st
from collections import defaultdict
rows = defaultdict(list)
for fn in sys.argv[1:]:
    for line in open(fn):
        m = dict(re.findall(r'(\w+)=([\w.]+)', line))
        if 'transport' not in m: continue
        if m['active'] != m['n']: print("WARN incomplete", fn, line.strip()); continue
        key = (int(m['n']), m['transport'] + ('+prehs' if m.get('prehs') == 'true' else '') + ('+inlinerecv' if m.get('inlinerecv') == 'true' else ''))
        rows[key].append(m)
print("| N | transport | runs | heap/stream KiB | stacks/stream KiB | heap+stacks KiB | goroutines/stream | RSS/stream KiB |")
print("|---|---|---|---|---|---|---|---|")
for (n, t), ms in sorted(rows.items()):
    def f(k):
        v = [float(x[k]) / 1024 for x in ms]
        return "%.1f (%.1f–%.1f)" % (st.median(v), min(v), max(v))
    hs = [(float(x['heap_per']) + float(x['stack_per'])) / 1024 for x in ms]
    print("| %d | %s | %d | %s | %s | %.1f | %s | %s |" % (n, t, len(ms), f('heap_per'), f('stack_per'), st.median(hs), ms[0]['goroutines_per'], f('rss_per')))
