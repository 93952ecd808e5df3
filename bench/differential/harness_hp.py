def _int(n, prefix, first=0):
    mx = (1 << prefix) - 1
    if n < mx: return bytes([first | n])
    out = [first | mx]; n -= mx
    while n >= 128: out.append((n % 128) + 128); n //= 128
    out.append(n); return bytes(out)
def s(v):
    v = v.encode() if isinstance(v, str) else v
    return _int(len(v), 7) + v
def lit(n, v): return b"\x00" + s(n) + s(v)
def inc(n, v): return b"\x40" + s(n) + s(v)
def idx(i): return _int(i, 7, 0x80)
