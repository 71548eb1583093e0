# gdb script: goroutine stack sizes of a running muster, grouped by the
# function each goroutine started in (docs/performance.md, "What is not
# measured yet"). Usage, as root, against a running authority:
#   gdb -p "$(cat DIR/authority.lock)" -batch -ex "source scripts/gstacks.py"
# Each line: start function, {stack size in bytes: goroutines}. Reads
# runtime.allgs through the binary's DWARF; the process is paused while
# gdb reads it.
import gdb
from collections import defaultdict
v = gdb.parse_and_eval("'runtime.allgs'")
arr = v['array']; n = int(v['len'])
sizes = defaultdict(lambda: defaultdict(int))
names = {}
for i in range(n):
    g = arr[i].dereference()
    st = int(g['atomicstatus']['value'])
    if st == 6:  # _Gdead
        continue
    size = int(g['stack']['hi']) - int(g['stack']['lo'])
    pc = int(g['startpc'])
    if pc not in names:
        s = gdb.execute("info symbol 0x%x" % pc, to_string=True).split(' in section')[0]
        names[pc] = s.strip()
    sizes[names[pc]][size] += 1
for name, d in sorted(sizes.items(), key=lambda x: -sum(x[1].values())):
    print("%-70s %s" % (name[:70], dict(sorted(d.items()))))
