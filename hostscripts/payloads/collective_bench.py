# Collective bandwidth gate (components/collective.py; `spark-vllm fabric test`): one rank of a
# torch.distributed run, in the serving image's own python, on every node at once. It measures
# all_gather and all_reduce at a sweep of sizes the way nccl-tests does
# (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): `bytes` is the size of
# the whole collective (all_gather: what each rank receives, its send count x the ranks), the time
# is one iteration's, averaged over the timed iterations and then over the ranks (nccl-tests'
# default `-a 1`), algbw = bytes / time, busbw = algbw x 2(n-1)/n for all_reduce and x (n-1)/n
# for all_gather, in GB/s of 1e9 bytes. The stack judges the figures itself
# (inspection/collective.py recomputes them from bytes, seconds and ranks).
#
# Backend: NCCL on the GPU when torch sees one (the rank's device is cuda:<localRank>), else Gloo
# on the CPU (the lab): the same calls either way. The request is argv[1] (JSON); every field
# falls back to torchrun's variables, so the file also runs by itself, e.g. on one host with two
# GPUs: `torchrun --nproc-per-node 2 collective_bench.py '{"table": true}'` or, one rank:
# `MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 RANK=0 WORLD_SIZE=1 python3 collective_bench.py`.
# Fields: rank, world, localRank, master, port, sizes (bytes), ops, warmup, minIters, maxIters,
# sizeSeconds (the time one size may take, which picks the iterations), deadline (seconds for the
# whole run, then the process exits 3), connectTimeout, memoryDivisor (a size needs at most
# 1/memoryDivisor of the memory available to the rank, else it is skipped: a 16 GB test froze a
# Spark, NVIDIA/dgx-spark-playbooks issue 102), listenOnMaster (rank 0's rendezvous store listens
# on `master` only, not on every address as torch's own does), table (a nccl-tests-style table on
# stderr).
#
# Prints one JSON line per rank: {rank, world, backend, device, host, torch, ncclVersion,
# results: [{op, bytes, count, iters, seconds, algbw, busbw}], skipped: [{op, bytes, why}],
# stopped (why the sweep ended early, or null), memoryAvailable, ncclLog (NCCL's own INFO lines
# about its transport when NCCL ran, for inspection/nccl_transport.py), seconds}. Exit 1 when a
# collective failed, 3 past the deadline.
# The lines above are not sent to the node.

import json, math, os, socket, sys, tempfile, threading, time

OPS = ("all_gather", "all_reduce")
DEFAULT_SIZES = [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]
ELEMENT = 4  # float32, nccl-tests' default type
NCCL_WORDS = ("NET/", "Using network", "via ", "GPU Direct RDMA", "nranks", "plugin", "NCCL version")


def bus_factor(op, ranks):
    """nccl-tests' correction of the algorithm bandwidth (PERFORMANCE.md, "Summary")."""
    if ranks < 1:
        raise ValueError("ranks must be at least 1")
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op == "all_gather":
        return (ranks - 1) / ranks
    raise ValueError("unknown collective %r" % (op,))


def bandwidths(op, nbytes, seconds, ranks):
    """(algbw, busbw) in GB/s (1e9 bytes per second), as nccl-tests computes them."""
    algbw = nbytes / 1e9 / seconds
    return algbw, algbw * bus_factor(op, ranks)


def counts(op, nbytes, ranks):
    """(elements each rank sends, bytes of the whole collective): all_gather's send count is the
    size split over the ranks (nccl-tests' AllGatherGetCollByteCount, aligned to 16 bytes)."""
    if op == "all_gather":
        per = (nbytes // ELEMENT // ranks) & ~3
        return per, per * ELEMENT * ranks
    n = nbytes // ELEMENT
    return n, n * ELEMENT


def peak_bytes(op, nbytes, ranks):
    """What one rank holds for one size: all_gather's input and output, all_reduce's buffer."""
    return nbytes + (nbytes // ranks if op == "all_gather" else 0)


def memory_available(torch, device):
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def request():
    req = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].strip() else {}
    env = os.environ
    req.setdefault("rank", int(env.get("RANK", "0")))
    req.setdefault("world", int(env.get("WORLD_SIZE", "1")))
    req.setdefault("localRank", int(env.get("LOCAL_RANK", "0")))
    req.setdefault("master", env.get("MASTER_ADDR", "127.0.0.1"))
    req.setdefault("port", int(env.get("MASTER_PORT", "29517")))
    req.setdefault("sizes", DEFAULT_SIZES)
    req.setdefault("ops", list(OPS))
    req.setdefault("warmup", 2)
    req.setdefault("minIters", 3)
    req.setdefault("maxIters", 20)
    req.setdefault("sizeSeconds", 1.0)
    req.setdefault("deadline", 300)
    req.setdefault("connectTimeout", 120)
    req.setdefault("memoryDivisor", 8)
    req.setdefault("listenOnMaster", True)
    for op in req["ops"]:
        bus_factor(op, 1)
    return req


def watchdog(seconds):
    """The whole run's limit: a rank whose peer died waits in a collective forever otherwise."""
    def fire():
        time.sleep(seconds)
        print("collective bench: past its deadline of %d s (a peer gone, or the fabric "
              "stalled)" % seconds, file=sys.stderr, flush=True)
        os._exit(3)
    threading.Thread(target=fire, daemon=True).start()


def store(dist, req, timeout):
    """The rendezvous store: rank 0 listens on `master` only (listenOnMaster), the others
    connect to it."""
    from datetime import timedelta
    args = dict(world_size=req["world"], timeout=timedelta(seconds=timeout))
    if req["rank"] != 0:
        return dist.TCPStore(req["master"], req["port"], is_master=False, **args)
    if not req["listenOnMaster"]:
        return dist.TCPStore(req["master"], req["port"], is_master=True, **args)
    family = socket.AF_INET6 if ":" in req["master"] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((req["master"], req["port"]))
    sock.listen(128)
    st = dist.TCPStore(req["master"], req["port"], is_master=True,
                       master_listen_fd=sock.detach(), use_libuv=False, **args)
    return st


def nccl_log_lines(path_prefix):
    out = []
    folder = os.path.dirname(path_prefix)
    base = os.path.basename(path_prefix)
    for name in sorted(os.listdir(folder)):
        if not name.startswith(base):
            continue
        try:
            with open(os.path.join(folder, name), errors="replace") as fh:
                for line in fh:
                    if "NCCL INFO" in line and any(w in line for w in NCCL_WORDS):
                        out.append(line.rstrip("\n")[:1000])
        except OSError:
            pass
    return out[:200]  # the answer lands in the stack's state: bounded


def main():
    started = time.monotonic()
    req = request()
    watchdog(int(req["deadline"]))
    log_prefix = None
    if os.environ.get("NCCL_DEBUG") and not os.environ.get("NCCL_DEBUG_FILE"):
        log_prefix = os.path.join(tempfile.mkdtemp(prefix="spark-vllm-nccl-"), "nccl.")
        os.environ["NCCL_DEBUG_FILE"] = log_prefix + "%h.%p"
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", int(req["localRank"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    ranks, rank = int(req["world"]), int(req["rank"])
    timeout = int(req["connectTimeout"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # under torchrun: its agent already listens on MASTER_PORT; join its store (env://)
        dist.init_process_group(backend, rank=rank, world_size=ranks,
                                timeout=timedelta(seconds=timeout))
    else:
        dist.init_process_group(backend, store=store(dist, req, timeout), rank=rank,
                                world_size=ranks, timeout=timedelta(seconds=timeout))
    answer = {"rank": rank, "world": ranks, "backend": backend, "device": str(device),
              "host": socket.gethostname(), "torch": torch.__version__, "ncclVersion": None,
              "results": [], "skipped": [], "stopped": None, "ncclLog": []}
    if cuda:
        answer["ncclVersion"] = ".".join(map(str, torch.cuda.nccl.version()))
    avail = memory_available(torch, device)
    answer["memoryAvailable"] = avail

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def agree(value, op):
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return float(t.item())

    # torch 2.13 renamed all_gather_into_tensor (the one-tensor all_gather) all_gather_single
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    code = 0
    try:
        for nbytes in req["sizes"]:
            slowest = 0.0  # one iteration's longest time at this size
            for op in req["ops"]:
                count, total = counts(op, int(nbytes), ranks)
                if count <= 0:
                    answer["skipped"].append({"op": op, "bytes": int(nbytes),
                                              "why": "too small for %d ranks" % ranks})
                    continue
                need = peak_bytes(op, total, ranks)
                fits = avail is None or need * int(req["memoryDivisor"]) <= avail
                # every rank must skip the same sizes: the smallest memory decides
                if agree(0.0 if fits else 1.0, dist.ReduceOp.MAX) > 0:
                    answer["skipped"].append({"op": op, "bytes": total, "why": (
                        "needs %d bytes, more than 1/%d of the memory available on a rank"
                        % (need, int(req["memoryDivisor"])))})
                    continue
                if op == "all_gather":
                    src = torch.ones(count, dtype=torch.float32, device=device)
                    dst = torch.empty(count * ranks, dtype=torch.float32, device=device)
                    run = lambda: gather(dst, src)  # noqa: E731
                else:
                    buf = torch.ones(count, dtype=torch.float32, device=device)
                    run = lambda: dist.all_reduce(buf)  # noqa: E731
                for _ in range(int(req["warmup"])):
                    run()
                sync()
                t0 = time.perf_counter()
                run()
                sync()
                one = max(time.perf_counter() - t0, 1e-9)
                slowest = max(slowest, one)
                want = min(max(math.ceil(float(req["sizeSeconds"]) / one), int(req["minIters"])),
                           int(req["maxIters"]))
                iters = int(agree(float(want), dist.ReduceOp.MIN))
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                for _ in range(iters):
                    run()
                sync()
                mine = (time.perf_counter() - t0) / iters
                seconds = agree(mine, dist.ReduceOp.SUM) / ranks
                algbw, busbw = bandwidths(op, total, seconds, ranks)
                answer["results"].append({"op": op, "bytes": total, "count": count,
                                          "iters": iters, "seconds": seconds,
                                          "algbw": round(algbw, 4), "busbw": round(busbw, 4)})
                del run
            # the next size takes STEP times as long: stop once one iteration took more than
            # a size's time (a slow fabric shows at the sizes measured), or past 60% of the run
            late = time.monotonic() - started > 0.6 * float(req["deadline"])
            slow = slowest > float(req["sizeSeconds"])
            if agree(1.0 if late else 2.0 if slow else 0.0, dist.ReduceOp.MAX) > 0:
                answer["stopped"] = ("the sweep stopped after %d bytes: %s" % (int(nbytes), (
                    "past 60%% of its deadline of %s s" % req["deadline"]) if late else
                    "one iteration took %.2f s, more than sizeSeconds %s" % (
                        slowest, req["sizeSeconds"])))
                break
    except Exception as exc:  # a collective that failed: say which, exit 1
        answer["stopped"] = "%s: %s" % (type(exc).__name__, str(exc)[:500])
        code = 1
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    if log_prefix:
        answer["ncclLog"] = nccl_log_lines(log_prefix)
    answer["seconds"] = round(time.monotonic() - started, 3)
    if req.get("table"):
        print("# %d ranks, %s on %s" % (ranks, backend, device), file=sys.stderr)
        print("# %12s %12s %10s %8s %12s %10s %10s" % (
            "op", "size (B)", "count", "iters", "time (us)", "algbw", "busbw"), file=sys.stderr)
        for r in answer["results"]:
            print("  %12s %12d %10d %8d %12.1f %10.2f %10.2f" % (
                r["op"], r["bytes"], r["count"], r["iters"], r["seconds"] * 1e6, r["algbw"],
                r["busbw"]), file=sys.stderr)
    print(json.dumps(answer, sort_keys=True), flush=True)
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
