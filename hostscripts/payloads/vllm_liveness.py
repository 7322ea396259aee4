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
# argv = url name task interval deadline failures key_file starts_file backoff backoff_max
#        restarts window command...
# Built by hostscripts/vllm.py; the lines above are not sent to the node.

import json, os, re, signal, subprocess, sys, time, urllib.request
url, name, task = sys.argv[1], sys.argv[2], sys.argv[3]
interval, deadline, failures = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
key_file, starts_file = sys.argv[7], sys.argv[8]
backoff, backoff_max = float(sys.argv[9]), float(sys.argv[10])
loop_restarts, window = int(sys.argv[11]), float(sys.argv[12])
argv = sys.argv[13:]
def say(text):
    print("spark-vllm liveness: " + text, flush=True)
def history():
    """[(time, "start" | "serving")] of this container, oldest first."""
    try:
        with open(starts_file) as f:
            lines = f.read().split("\n")
    except OSError:
        return []
    out = []
    for line in lines:
        part = line.split()
        if len(part) == 2 and part[1] in ("start", "serving"):
            try:
                out.append((float(part[0]), part[1]))
            except ValueError:
                pass
    return out
def record(what, keep):
    # at most 100 lines, always with the container's first start (every later one is a restart)
    keep = keep if len(keep) < 100 else keep[:1] + keep[-98:]
    try:
        os.makedirs(os.path.dirname(starts_file), exist_ok=True)
        lines = ["%.3f %s" % e for e in keep] + ["%.3f %s" % (time.time(), what)]
        with open(starts_file + ".new", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(starts_file + ".new", starts_file)
    except OSError as e:
        say("cannot record the %s in %s: %r" % (what, starts_file, e))
child, starting, pending = None, False, []
def forward(sig, _frame):
    if child is not None:
        child.send_signal(sig)
    elif starting:  # between Popen's fork and `child`: forwarded right after
        pending.append(sig)
    else:  # docker stop during the backoff: nothing started yet
        sys.exit(128 + sig)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
past = history()
now = time.time()
# every start but the container's first is a restart (as inspection/recon.recent_restarts)
starts = [t for t, w in past if w == "start"] + [now]
restarts = sum(1 for t in starts[1:] if t > now - window)
unready = 0
for t, w in reversed(past):
    if w == "serving":
        break
    unready += 1
if restarts > loop_restarts:
    say("crash-looping: %d restarts in the last %gs (more than %d)" % (restarts, window,
                                                                   loop_restarts))
elif restarts:
    say("restart %d in the last %gs" % (restarts, window))
record("start", past)
if unready:
    wait = min(backoff * 2 ** (unready - 1), backoff_max)
    say("vLLM did not answer in its last %d start(s): waiting %gs before starting it" % (
        unready, wait))
    time.sleep(wait)
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
        sys.exit(code if code >= 0 else 128 - code)  # killed by a signal: the shell's code
    except subprocess.TimeoutExpired:
        pass
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
