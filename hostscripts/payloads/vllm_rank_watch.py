# The main process of a `--headless` vLLM container (vllm.executor mp): runs vLLM and watches
# the head's. vLLM's headless ranks wait on the head forever (their workers block on the head's
# message queue): when the head's vLLM restarts (a crash, a reboot, vllm-ranks-restart restarting
# it), they keep the old head's queues and the new head waits for ranks that never come. So this
# process ends the container when the head's /health stopped answering after it had answered;
# Docker's restart policy then starts this rank afresh, to meet the head's next start. vLLM
# exiting ends it too, with vLLM's exit code. SIGTERM/SIGINT (docker stop) go to vLLM.
# argv = health_url interval_s misses command... Built by hostscripts/vllm.py; the lines above
# are not sent to the node.

import signal, subprocess, sys, urllib.request
url, interval, misses, argv = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
child = subprocess.Popen(argv)
signal.signal(signal.SIGTERM, lambda s, _f: child.send_signal(s))
signal.signal(signal.SIGINT, lambda s, _f: child.send_signal(s))
def answers():
    try:
        with urllib.request.urlopen(url, timeout=max(interval, 5)) as r:
            return r.status == 200
    except Exception:
        return False
armed, missed = False, 0
while True:
    try:
        code = child.wait(timeout=interval)
        sys.exit(code if code >= 0 else 128 - code)  # killed by a signal: the shell's code
    except subprocess.TimeoutExpired:
        pass
    if answers():
        if not armed:
            print("spark-vllm: the head's vLLM answers at %s; this rank follows it" % url, flush=True)
        armed, missed = True, 0
        continue
    if armed:
        missed += 1
    if missed >= misses:
        print("spark-vllm: the head's vLLM at %s stopped answering (%d checks, %gs apart); this "
              "rank stops so that Docker starts it again for the head's next start"
              % (url, missed, interval), flush=True)
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        sys.exit(75)
