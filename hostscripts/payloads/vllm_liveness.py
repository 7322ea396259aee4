# The main process of the head's vLLM container and of each service's (health.liveness): runs
# vLLM (the launcher) and restarts it when it is alive but no longer serving. Docker's restart
# policy acts only when the process exits, and a vLLM whose engine hangs (a frozen engine
# process, a rank stuck in a collective) keeps its API server up and /health answering 200.
# Once vLLM has answered, every `interval` seconds one probe, each call within `deadline`:
#   - /health answers 200;
#   - vLLM's metrics: with requests running or waiting, one of its counters (tokens, iterations,
#     requests) or its KV cache use moved since the last probe; with none, one request (a
#     1-token completion, a 1-input embedding; a score model: /health alone) answers 200.
# `failures` probes failing in a row: vLLM's whole process group is stopped (SIGTERM, with SIGCONT
# for a stopped process, then SIGKILL after 30 s: with the Ray executor the container shares the
# Ray head's process namespace, so a hung engine process would outlive this one) and this process
# exits 70, so Docker starts the container again (for mp the headless ranks follow: vllm_rank_watch.py). vLLM
# exiting ends it too, with vLLM's exit code. SIGTERM/SIGINT (docker stop) go to vLLM.
# The API key is read from key_file for each request (never argv or environment).
# Crash loops: every start of vLLM, and the moment it first answers /health, is appended to
# starts_file (in the container's own writable layer: it lives as long as the container, across
# Docker's restarts, and a replaced container starts a new one). A start that follows starts that
# never answered waits first: backoff seconds, doubling with each such start in a row, at most
# backoff_max. More than `restarts` restarts within `window` seconds is a crash loop: said here at
# each start, and read by `spark-vllm status` (inspection/status.py) and the next `up`'s recon.
# OOM kills (the node's guard, config/guard.py): when vLLM ends without this process or Docker
# asking, and the node's early OOM killer recorded the kill of a vLLM process (one whose name
# matches `prefer`, the guard's --prefer) since this start, in kills_file (the guard's record,
# mounted read-only; "-": none), or the container's memory cgroup counted a kill by the kernel,
# the end is recorded as an OOM kill with the node's available memory then:
# "<time> oom <earlyoom|kernel> <available bytes|-> <total bytes|-> <victim>". The next start
# that follows an OOM kill waits oom_backoff seconds first, doubling with each OOM kill within
# `window`, at most the larger of oom_backoff and backoff_max, and says so.
# argv = url name task interval deadline failures key_file starts_file backoff backoff_max
#        restarts window kills_file prefer oom_backoff command...
# Built by hostscripts/vllm.py; the lines above are not sent to the node.

import json, os, re, signal, subprocess, sys, time, urllib.request
url, name, task = sys.argv[1], sys.argv[2], sys.argv[3]
interval, deadline, failures = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
key_file, starts_file = sys.argv[7], sys.argv[8]
backoff, backoff_max = float(sys.argv[9]), float(sys.argv[10])
loop_restarts, window = int(sys.argv[11]), float(sys.argv[12])
kills_file, prefer, oom_backoff = sys.argv[13], re.compile(sys.argv[14]), float(sys.argv[15])
argv = sys.argv[16:]
def say(text):
    print("spark-vllm liveness: " + text, flush=True)
def history():
    """[(time, "start" | "serving" | "oom", [what follows])] of this container, oldest first."""
    try:
        with open(starts_file) as f:
            lines = f.read().split("\n")
    except OSError:
        return []
    out = []
    for line in lines:
        part = line.split()
        if ((len(part) == 2 and part[1] in ("start", "serving"))
                or (len(part) == 6 and part[1] == "oom")):
            try:
                out.append((float(part[0]), part[1], part[2:]))
            except ValueError:
                pass
    return out
def record(what, keep, rest=(), at=None):
    # at most 100 lines, always with the container's first start (every later one is a restart)
    keep = keep if len(keep) < 100 else keep[:1] + keep[-98:]
    try:
        os.makedirs(os.path.dirname(starts_file), exist_ok=True)
        lines = [" ".join(["%.3f %s" % e[:2], *e[2]]) for e in keep]
        lines.append(" ".join(["%.3f %s" % (time.time() if at is None else at, what), *rest]))
        with open(starts_file + ".new", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(starts_file + ".new", starts_file)
    except OSError as e:
        say("cannot record the %s in %s: %r" % (what, starts_file, e))
child, starting, pending, forwarded = None, False, [], False
def forward(sig, _frame):
    global forwarded
    forwarded = True  # Docker asked: an end that follows is no OOM kill
    if child is not None:
        child.send_signal(sig)
    elif starting:  # between Popen's fork and `child`: forwarded right after
        pending.append(sig)
    else:  # docker stop during the backoff: nothing started yet
        sys.exit(128 + sig)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
def gib(n):
    return "?" if n in (None, "-") else "%.1f GiB" % (float(n) / 2 ** 30)
def oom_text(t, source, avail, total, victim):
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    return "OOM-killed at %s (node available %s of %s; %s)" % (
        when, gib(avail), gib(total), "earlyoom killed " + victim if source == "earlyoom"
        else "the kernel killed a process of this container")
past = history()
now = time.time()
# every start but the container's first is a restart (as inspection/recon.recent_restarts)
starts = [t for t, w, _ in past if w == "start"] + [now]
restarts = sum(1 for t in starts[1:] if t > now - window)
ooms = [e for e in past if e[1] == "oom" and e[0] > now - window]
unready = 0
for t, w, _ in reversed(past):
    if w == "serving":
        break
    unready += w == "start"
if restarts > loop_restarts:
    say("crash-looping: %d restarts in the last %gs (more than %d)%s" % (
        restarts, window, loop_restarts,
        ", %d of them OOM kills: the node runs out of memory" % len(ooms) if ooms else ""))
elif restarts:
    say("restart %d in the last %gs" % (restarts, window))
record("start", past)
if past and past[-1][1] == "oom":  # the last vLLM was OOM-killed: memory first, then a start
    t, _, (source, avail, total, victim) = past[-1]
    wait = min(oom_backoff * 2 ** (len(ooms) - 1), max(backoff_max, oom_backoff))
    say("vLLM was %s: %d OOM kill(s) in the last %gs; waiting %gs before starting it again "
        "(guard.oomBackoffSeconds)" % (oom_text(t, source, avail, total, victim), len(ooms),
                                       window, wait))
    time.sleep(wait)
elif unready:
    wait = min(backoff * 2 ** (unready - 1), backoff_max)
    say("vLLM did not answer in its last %d start(s): waiting %gs before starting it" % (
        unready, wait))
    time.sleep(wait)
def oom_count():
    """The kernel's OOM kills in this container's memory cgroup (cgroup v2, then v1), or None."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    part = line.split()
                    if len(part) == 2 and part[0] == "oom_kill":
                        return int(part[1])
        except (OSError, ValueError):
            continue
    return None
def meminfo():
    got = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                part = line.split()
                if len(part) >= 2 and part[0] in ("MemAvailable:", "MemTotal:"):
                    got[part[0]] = str(int(part[1]) * 1024)
    except (OSError, ValueError):
        pass
    return got.get("MemAvailable:", "-"), got.get("MemTotal:", "-")
def earlyoom_kill(since):
    """(time, available, total, victim) of the node's last recorded kill of a vLLM process
    since `since`, or None."""
    try:
        with open(kills_file, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode("ascii", "replace").split("\n")
    except OSError:
        return None
    for line in reversed(lines):
        part = line.split()
        if len(part) != 5 or not prefer.match(part[4]):
            continue
        try:
            t = float(part[0])
            avail, total = str(int(part[1])), str(int(part[2]))
        except ValueError:
            continue
        if t >= since - 1:
            return t, avail, total, part[4]
    return None
def oom_kill(since, code):
    """The OOM kill that ended this vLLM, as an "oom" record's fields, or None. earlyoom records
    a kill once the victim is gone (its hook): a vLLM killed by a signal waits up to 12 s for the
    record, one that exited (its engine was the victim) 3 s."""
    after = oom_count()
    if at_start is not None and after is not None and after > at_start:
        avail, total = meminfo()
        return time.time(), ["kernel", avail, total, "-"]
    if kills_file == "-":
        return None
    end = time.time() + (12 if code < 0 else 3)
    while True:
        found = earlyoom_kill(since)
        if found is not None:
            t, avail, total, victim = found
            return t, ["earlyoom", avail, total, victim]
        if time.time() >= end:
            return None
        time.sleep(0.2)
at_start = oom_count()
started = time.time()
starting = True
child = subprocess.Popen(argv, start_new_session=True)  # its own group: stop_all
for sig in pending:
    child.send_signal(sig)
MOVES = re.compile(r"^(vllm:[a-z_:]*(_total|_count)|vllm:kv_cache_usage_perc)(\{[^}]*\})? (\S+)$",
                   re.M)
QUEUE = re.compile(r"^vllm:num_requests_(running|waiting)(\{[^}]*\})? (\S+)$", re.M)
def stop_all():
    for sig in (signal.SIGTERM, signal.SIGCONT):
        try:
            os.killpg(child.pid, sig)
        except OSError:
            pass
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(child.pid, signal.SIGKILL)  # whatever of the group is left
    except OSError:
        pass
    child.wait()
def call(path, body=None):
    hdr = {"Content-Type": "application/json"}
    try:
        with open(key_file) as f:
            key = f.read().strip()
    except OSError:
        key = ""
    if key:
        hdr["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=hdr)
    with urllib.request.urlopen(req, timeout=deadline) as r:
        return r.status, r.read()
last = None
def probe():
    """None when vLLM serves, else why not."""
    global last
    try:
        if call("/health")[0] != 200:
            return "/health did not answer 200"
    except Exception as e:
        return "/health: %r" % (e,)
    if task == "score":
        return None
    try:
        text = call("/metrics")[1].decode()
    except Exception as e:
        return "/metrics: %r" % (e,)
    moves = sorted((m.group(1) + (m.group(3) or ""), m.group(4)) for m in MOVES.finditer(text))
    queued = sum(float(m.group(3)) for m in QUEUE.finditer(text))
    before, last = last, moves
    if queued > 0:
        if before is not None and moves == before:
            return "%g requests running or waiting and no counter moved in %gs" % (queued, interval)
        return None
    try:
        if task == "embed":
            call("/v1/embeddings", {"model": name, "input": ["ok"]})
        else:
            call("/v1/completions", {"model": name, "prompt": "ok", "max_tokens": 1})
    except Exception as e:
        return "idle, and a 1-token request failed within %gs: %r" % (deadline, e)
    return None
armed, missed = False, 0
while True:
    try:
        code = child.wait(timeout=interval)
    except subprocess.TimeoutExpired:
        code = None
    if code is not None:
        killed = None if forwarded else oom_kill(started, code)
        if killed is not None:
            t, rest = killed
            say("vLLM was " + oom_text(t, *rest))
            record("oom", history(), rest, at=t)
        sys.exit(code if code >= 0 else 128 - code)  # killed by a signal: the shell's code
    if not armed:
        try:
            armed = call("/health")[0] == 200
        except Exception:
            pass
        if armed:
            say("vLLM answers at %s; probing every %gs" % (url, interval))
            record("serving", history())
        continue
    why = probe()
    if why is None:
        missed = 0
        continue
    missed += 1
    say("probe %d of %d failed: %s" % (missed, failures, why))
    if missed >= failures:
        say("vLLM is alive but does not serve; stopping it so that Docker starts it again")
        stop_all()
        sys.exit(70)
