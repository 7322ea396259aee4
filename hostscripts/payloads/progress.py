# Sizes and times as the copies' progress lines show them (a prelude: hostscripts/common.py
# `payload()` joins this text in front of fetch_url.py's and model_sync.py's): `size(bytes)` is
# "<x.y> GiB" from 1 GiB up, else "<x.y> MiB"; `clock(seconds)` is "42s", "3m07s" or "1h05m".
# The lines above are not sent to the node.


def size(n):
    return "%.1f GiB" % (n / 2**30) if n >= 2**30 else "%.1f MiB" % (n / 2**20)


def clock(s):
    s = int(round(s))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % divmod(s, 60)
    return "%dh%02dm" % (s // 3600, s % 3600 // 60)
