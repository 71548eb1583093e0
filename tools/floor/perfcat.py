#!/usr/bin/env python3
# perfcat.py REPORT: the shares of a `perf report --no-children --sort sym -g none`
# output by category (crypto primitives, TLS/x509/ASN.1, kernel, GC +
# allocation, runtime, gRPC, SQLite, muster, other), each leaf symbol by
# its package; the categories of docs/performance.md, "The floor".
import re, sys, collections
rules = [
 ('stack growth', r'^runtime\.(newstack|copystack|adjust\w+|morestack\w*|stackalloc|stackfree|stackcacherefill|stackpoolalloc)$'),
 ('GC + allocation', r'^runtime\.(mallocgc\w*|newobject|makeslice\w*|growslice|makemap\w*|rawbyteslice|rawstring\w*|slicebytetostring|concatstring\w*|nextFreeFast|memclrNoHeapPointers\w*|heapSetType\w*|heapBits\w*|typePointers\w*|\(\*mcache\).*|\(\*mcentral\).*|\(\*mheap\).*|\(\*mspan\).*|\(\*pageAlloc\).*|\(\*pallocBits\).*|\(\*gcWork\).*|\(\*gcControllerState\).*|\(\*gcBits\).*|\(\*sweepLocked\).*|\(\*sweepLocker\).*|\(\*wbBuf\).*|gc\w*|scan\w*|greyobject|findObject|markBits\w*|markroot\w*|sweepone|bgsweep|bgscavenge|wbBuf\w*|bulkBarrier\w*|spanOf\w*|pageIndexOf|deductSweepCredit|typedmemmove|typedslicecopy|(\w+\.)?gcWriteBarrier\w*|wbMove|wbZero|memclrNoHeapPointersChunked|(\(\*\w+\)\.)?(tryGetObj|tryGet|put\w*|empty)|shade|heapSetTypeNoHeader|heapSetTypeSmallHeader|\(\*mSpanList\).*|\(\*spanSet\).*|\(\*headTailIndex\).*|markrootSpans|assistAlloc|\(\*gcCPULimiterState\).*|freeSomeWbufs|getempty|handoff|\(\*lfstack\).*|tryDeferToSpanScan|\(\*spanSet\).*|\(\*spanInlineMarkBits\).*|\(\*gcMarkWorker\w*\).*|spanInlineMarkBits\w*)$'),
 ('gRPC + HTTP/2 + protobuf', r'^(google\.golang\.org/grpc|golang\.org/x/net/http2|google\.golang\.org/protobuf)'),
 ('crypto primitives', r'^(p256\w*|crypto/internal/fips140|crypto/ecdsa|crypto/sha256|crypto/sha512|crypto/hmac|crypto/aes|crypto/cipher|crypto/ecdh|crypto/mlkem|crypto/internal/|crypto/elliptic|crypto/rand|crypto/subtle|math/big|vendor/golang\.org/x/crypto/(chacha|internal|sha3)|golang\.org/x/crypto/(chacha|sha3))'),
 ('TLS, x509, ASN.1 (not primitives)', r'^(crypto/tls|crypto/x509|encoding/asn1|encoding/pem|encoding/base64|vendor/golang\.org/x/crypto/cryptobyte|golang\.org/x/crypto/cryptobyte|net/url|unicode/utf8|crypto/internal/hpke)'),
 ('SQLite (modernc)', r'^(modernc\.org|_?sqlite3|_[a-z]\w*$)'),
 ('Go net, poll, syscall wrappers', r'^(internal/poll|net\.|net/|syscall\.|os\.|internal/syscall|golang\.org/x/sys|runtime\.netpoll\w*|internal/runtime/syscall)'),
 ('runtime (scheduler, locks, memmove, other)', r'^(__vdso_\w+|runtime|internal/runtime|sync|internal/sync|internal/abi|internal/bytealg|aeshash|memeqbody|indexbytebody|cmpbody|gogo|mcall|systemstack|rt0|time\.|context\.)'),
 ('muster', r'^github\.com/muster-dev'),
]
cats = collections.OrderedDict((c, 0.0) for c, _ in rules)
cats['kernel'] = 0.0; cats['other'] = 0.0
top_other = collections.Counter()
kern = collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r'\s+([\d.]+)%\s+\[(.)\]\s+(.*\S)', line)
    if not m: continue
    pct, kind, sym = float(m.group(1)), m.group(2), m.group(3)
    if kind == 'k':
        cats['kernel'] += pct; kern[sym] += pct; continue
    for c, rx in rules:
        if re.search(rx, sym):
            cats[c] += pct; break
    else:
        cats['other'] += pct; top_other[sym] += pct
tot = sum(cats.values())
for c, v in cats.items(): print(f'{100*v/tot:6.1f}%  {c}')
print('100.0%  total (shares of all samples)')
print('top other:', ', '.join(f'{s} {p:.1f}' for s, p in top_other.most_common(12)))
print('top kernel:', ', '.join(f'{s} {p:.1f}' for s, p in kern.most_common(10)))
