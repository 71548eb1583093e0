#!/usr/bin/env python3
"""summarize.py OUT: the table of a rounds.sh run: per round, the server CPU
per renewal of the floor and muster, the floor's efficiency against
muster's bound of the same round, and floor / muster."""
import glob, json, os, sys

out = sys.argv[1]
load = {}
for line in open(os.path.join(out, 'load.txt')):
    f = line.split()
    load[f[0]] = f[1]
print('| round | connection | floor µs (user) | muster µs | muster bound µs | efficiency floor | muster | floor / muster |')
print('|---|---|---|---|---|---|---|---|')
for mf in sorted(glob.glob(os.path.join(out, 'm-*.json'))):
    name = os.path.basename(mf)[:-5]
    _, mode, r = name.split('-')
    m = json.load(open(mf))
    mcpu = m['run']['authority']['cpu_per_request_ns'] / 1e3
    bound = m['bound']['per_op_ns'] / 1e3
    for fname, label in ([(f'f-new-{r}', 'new')] if mode == 'new' else
                         [(f'f-kept1-{r}', 'kept, a connection per renewal'), (f'f-kept-{r}', 'kept, 16 reused')]):
        path = os.path.join(out, fname + '.json')
        if not os.path.exists(path):
            continue
        f = json.load(open(path))
        fcpu = f['server_cpu_per_renewal_ns'] / 1e3
        print(f"| {r} (load {load.get(fname)}/{load.get(name)}) | {label} | {fcpu:,.0f} ({100*f['server_user_share']:.0f} %) "
              f"| {mcpu:,.0f} | {bound:,.0f} | {bound/fcpu:.2f} | {m['cpu_efficiency']:.2f} | {fcpu/mcpu:.2f} |")
