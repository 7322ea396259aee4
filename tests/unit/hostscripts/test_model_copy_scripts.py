"""The model seeder and sync programs (hostscripts/payloads/) run for real on this machine:
the seeder serves a snapshot of an HF cache on 127.0.0.1 (and 127.0.0.2 standing in for the
head's second twin: Linux routes all of 127.0.0.0/8 to lo), the sync fills another cache from it.
(On the nodes both run inside the serving image; here the local python stands in for it.)
Everything that connects runs in a subprocess: the unit tier forbids this process the network."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from hostscripts import common, images, models
from hostscripts.models import ModelFile

COMMIT = "c" * 40
REPO = "org/model"
TOKEN = "5eed" * 16  # the run's token (model_seeder_start makes one per run)
TOKEN_SUM = __import__("hashlib").sha256(TOKEN.encode()).hexdigest()
A, B, DEAD = "127.0.0.1", "127.0.0.2", "127.0.0.3"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free_on(*ips: str) -> int:
    for _ in range(20):
        port = _free_port()
        try:
            for ip in ips:
                with socket.socket() as s:
                    s.bind((ip, port))
            return port
        except OSError:
            continue
    raise AssertionError("no port free on " + ", ".join(ips))


def _repo(root: Path) -> Path:
    return root / "hub" / common.repo_dir(REPO)


def _cache_with(root: Path, files: dict[str, bytes]) -> None:
    repo = _repo(root)
    for path, data in files.items():
        etag = f"{abs(hash(path)):064x}"[:64]
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / etag).write_bytes(data)
        link = repo / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / etag, link.parent))


def _manifest(root: Path, port: int, seeds: list[models.Seed], chunk: int | None = None,
              wait: int | None = None, sizes: dict[str, int] | None = None) -> str:
    snap = _repo(root) / "snapshots" / COMMIT
    files = []
    for p in sorted(snap.rglob("*")):
        if p.is_symlink():
            path = str(p.relative_to(snap))
            files.append(ModelFile(path=path, size=(sizes or {}).get(path, p.stat().st_size),
                                   etag=os.path.basename(os.readlink(p))))
    m = json.loads(models.model_manifest_json(REPO, COMMIT, "main", files, seeds, token=TOKEN))
    m["seedPort"] = port
    if chunk is not None:
        m["chunkBytes"] = chunk
    if wait is not None:
        m["waitSeconds"] = wait
    return json.dumps(m)


def _wait_listening(proc: subprocess.Popen, ip: str, port: int, log: Path | None = None) -> None:
    deadline = time.monotonic() + 10
    probe = f"import socket; socket.create_connection(({ip!r}, {port}), 1).close()"
    while True:
        assert proc.poll() is None, log.read_text() if log else proc.returncode
        if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
            return
        assert time.monotonic() < deadline, f"nothing listened on {ip}:{port}"
        time.sleep(0.05)


class Seeder:
    """The real model_seeder.py on `ips`, its stderr (one line per body sent) in a file."""

    def __init__(self, tmp: Path, src: Path, ips: list[str], port: int):
        self.log = tmp / f"seeder-{port}.log"
        self._err = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", models._MODEL_SEEDER_PY, ",".join(ips), str(port),
             str(_repo(src)), COMMIT, TOKEN_SUM],
            stdout=subprocess.DEVNULL, stderr=self._err,
        )
        for ip in ips:
            if ip.startswith("127."):  # (the others are addresses it must fail to bind)
                _wait_listening(self.proc, ip, port, self.log)

    def sent(self, path: str | None = None) -> Counter[str]:
        """Bytes of bodies sent per listening address (of `path` only, when given)."""
        out: Counter[str] = Counter()
        for line in self.log.read_text().splitlines():
            parts = line.split(" ", 4)
            if parts[0] == "sent" and (path is None or parts[4].endswith("/" + path)):
                out[parts[1]] += int(parts[3])
        return out

    def ranges(self) -> Counter[str]:
        return Counter(line.split()[1] for line in self.log.read_text().splitlines()
                       if line.startswith("sent ") and line.split()[2] == "206")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._err.close()


def _sync_py(dst: Path) -> str:
    return models._SYNC_PY.replace('"/root/.cache/huggingface/hub/"', repr(str(dst / "hub") + "/"))


def _run_sync(dst: Path, manifest: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _sync_py(dst)], input=manifest, text=True,
                          capture_output=True, timeout=120)


def _ok(p: subprocess.CompletedProcess[str]) -> dict:
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _blobs(root: Path) -> list[str]:
    d = _repo(root) / "blobs"
    return sorted(os.listdir(d)) if d.is_dir() else []


@pytest.fixture
def served(tmp_path):
    """A source cache with a big file and two small ones; the seeders started, then killed."""
    src = tmp_path / "src"
    big = os.urandom(5 << 20) + b"tail"  # several sendfile/readinto rounds, 6 ranges of 1 MiB
    _cache_with(src, {"config.json": b'{"a": 1}', "model.safetensors": big, "sub/t.json": b"x"})
    started: list[Seeder] = []

    def start(ips: list[str], port: int) -> Seeder:
        started.append(Seeder(tmp_path, src, ips, port))
        return started[-1]

    yield src, big, start
    for s in started:
        s.close()


def test_seeder_serves_the_snapshot_and_sync_copies_only_what_is_missing(tmp_path, served):
    src, big, start = served
    dst = tmp_path / "dst"
    port = _free_port()
    start([A], port)
    manifest = _manifest(src, port, [models.Seed(A)])
    t0 = time.monotonic()
    first = _ok(_run_sync(dst, manifest))
    assert first == {"files": 3, "bytesMoved": len(big) + 8 + 1,
                     "bytesBySeed": {A: len(big) + 8 + 1}}, first
    snap = _repo(dst) / "snapshots" / COMMIT
    assert (snap / "model.safetensors").read_bytes() == big
    assert (snap / "sub" / "t.json").read_bytes() == b"x"
    assert (snap / "model.safetensors").is_symlink()  # HF cache layout: snapshot -> blob
    assert _ok(_run_sync(dst, manifest))["bytesMoved"] == 0  # already there: nothing moves
    print(f"sync of {len(big)} B: {time.monotonic() - t0:.2f} s")


def test_a_big_file_moves_as_ranges_over_both_twins(tmp_path, served):
    src, big, start = served
    dst = tmp_path / "dst"
    port = _port_free_on(A, B)
    seeder = start([A, B], port)  # one seeder, a listener on each "twin"
    manifest = _manifest(src, port, [models.Seed(A, A), models.Seed(B, A)], chunk=1 << 20)
    p = _run_sync(dst, manifest)
    out = _ok(p)
    snap = _repo(dst) / "snapshots" / COMMIT
    assert (snap / "model.safetensors").read_bytes() == big  # byte-identical
    assert (snap / "config.json").read_bytes() == b'{"a": 1}'
    # the big file: 6 ranges dealt 3 and 3, so each address sent half of it
    per_ip = seeder.sent("model.safetensors")
    assert set(per_ip) == {A, B} and sum(per_ip.values()) == len(big), per_ip
    assert abs(per_ip[A] - per_ip[B]) <= 1 << 20, per_ip
    assert seeder.ranges() == {A: 3, B: 3}
    # the small files are whole GETs (200), each to the seed with the fewest bytes dealt so far
    whole = [line.split() for line in seeder.log.read_text().splitlines()
             if line.startswith("sent ") and line.split()[2] == "200"]
    assert sorted(w[4].rsplit("/", 1)[-1] for w in whole) == ["config.json", "t.json"], whole
    assert out["bytesMoved"] == len(big) + 9 and out["bytesBySeed"] == dict(seeder.sent())
    # the operator sees a line per file with bytes and rate per twin
    done = [line for line in p.stdout.splitlines() if " done (" in line]
    assert len(done) == 3 and all(f"{A} " in line and f"{B} " in line and "MB/s" in line
                                  for line in done), p.stdout
    assert not [b for b in _blobs(dst) if b.endswith(".incomplete")]


def test_a_twin_that_does_not_answer_is_dropped_for_the_other(tmp_path, served):
    src, big, start = served
    dst = tmp_path / "dst"
    port = _port_free_on(A, DEAD)
    seeder = start([A], port)  # nothing listens on DEAD: connection refused
    manifest = _manifest(src, port, [models.Seed(DEAD, A), models.Seed(A, A)], chunk=1 << 20)
    p = _run_sync(dst, manifest)
    out = _ok(p)
    assert f"seeder {DEAD}:{port} (from {A}) does not answer" in p.stderr, p.stderr
    assert "fetching over the other twins" in p.stderr
    assert (_repo(dst) / "snapshots" / COMMIT / "model.safetensors").read_bytes() == big
    assert seeder.sent() == Counter({A: len(big) + 9})
    assert out["bytesBySeed"] == {DEAD: 0, A: len(big) + 9}


def test_no_seed_answering_fails_clearly_and_leaves_nothing(tmp_path, served):
    src, _big, _start = served
    dst = tmp_path / "dst"
    port = _port_free_on(A, DEAD)
    manifest = _manifest(src, port, [models.Seed(A), models.Seed(DEAD)], wait=1)
    p = _run_sync(dst, manifest)
    assert p.returncode != 0
    assert "no seeder address answers after 1 s" in p.stderr, p.stderr
    assert f"{A}:{port}" in p.stderr and f"{DEAD}:{port}" in p.stderr
    assert _blobs(dst) == []


# A seeder whose streams break: headers right, half the body, then the connection closes.
_BROKEN = r'''
import re, socket, sys, threading
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
size = int(sys.argv[3])
def one(c):
    req = b""
    while b"\r\n\r\n" not in req:
        more = c.recv(4096)
        if not more:  # a probe: connected, then closed
            c.close()
            return
        req += more
    m = re.search(rb"Range: bytes=(\d+)-(\d+)", req)
    a, b = (int(m.group(1)), int(m.group(2))) if m else (0, size - 1)
    head = "HTTP/1.0 %s\r\nContent-Length: %d\r\n" % ("206 Partial" if m else "200 OK", b - a + 1)
    if m:
        head += "Content-Range: bytes %d-%d/%d\r\n" % (a, b, size)
    c.sendall(head.encode() + b"\r\n" + b"\0" * ((b - a + 1) // 2))
    c.close()
while True:
    threading.Thread(target=one, args=(srv.accept()[0],)).start()
'''


def _broken(ip: str, port: int, size: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _BROKEN, ip, str(port), str(size)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_listening(proc, ip, port)
    return proc


def _big_only(src: Path, big: bytes) -> None:
    """Leave only the big file in the source snapshot (the broken seeder knows one size)."""
    snap = _repo(src) / "snapshots" / COMMIT
    for p in ("config.json", "sub/t.json"):
        (snap / p).unlink()


def test_a_stream_that_breaks_mid_file_falls_back_to_the_other_twin(tmp_path, served):
    src, big, start = served
    _big_only(src, big)
    dst = tmp_path / "dst"
    port = _port_free_on(A, B)
    seeder = start([A], port)
    broken = _broken(B, port, len(big))
    try:
        manifest = _manifest(src, port, [models.Seed(A, A), models.Seed(B, A)], chunk=1 << 20)
        p = _run_sync(dst, manifest)
    finally:
        broken.kill()
        broken.wait()
    _ok(p)
    assert f"seeder {B}:{port} (from {A}) failed" in p.stderr, p.stderr
    assert "short read" in p.stderr
    # the half-written ranges were fetched again from A: the file is exact
    assert (_repo(dst) / "snapshots" / COMMIT / "model.safetensors").read_bytes() == big
    assert seeder.sent() == Counter({A: len(big)})


def test_a_failed_sync_leaves_no_partial_file_under_a_blob_name(tmp_path, served):
    src, big, _start = served
    _big_only(src, big)
    dst = tmp_path / "dst"
    port = _port_free_on(A)
    broken = _broken(A, port, len(big))
    try:
        manifest = _manifest(src, port, [models.Seed(A)], chunk=1 << 20)
        p = _run_sync(dst, manifest)
    finally:
        broken.kill()
        broken.wait()
    assert p.returncode != 0
    assert "no seeder address left" in p.stderr and f"{A}:{port}" in p.stderr, p.stderr
    assert _blobs(dst) == []  # neither the blob nor its .incomplete
    assert not (_repo(dst) / "snapshots" / COMMIT / "model.safetensors").exists()


def test_a_size_the_seeder_does_not_have_fails_without_a_blob(tmp_path, served):
    """The manifest says more bytes than the head has: the range is refused or clipped, the sync
    fails naming the file (another twin would answer the same), nothing lands as the blob."""
    src, big, start = served
    dst = tmp_path / "dst"
    port = _port_free_on(A, B)
    start([A, B], port)
    manifest = _manifest(src, port, [models.Seed(A), models.Seed(B)], chunk=1 << 20,
                         sizes={"model.safetensors": len(big) + 5})
    p = _run_sync(dst, manifest)
    assert p.returncode != 0
    assert "model.safetensors" in p.stderr, p.stderr
    etag = os.path.basename(os.readlink(_repo(src) / "snapshots" / COMMIT / "model.safetensors"))
    assert etag not in _blobs(dst) and etag + ".incomplete" not in _blobs(dst)


_CLIENT = r'''
import http.client, json, sys
ip, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = []
for method, rng in json.loads(sys.argv[4]):
    c = http.client.HTTPConnection(ip, port, timeout=10)
    auth = {"Authorization": "Bearer " + sys.argv[5]}
    c.request(method, path, headers=dict(auth, Range=rng) if rng else auth)
    r = c.getresponse()
    body = r.read()
    out.append([r.status, r.getheader("Content-Range"), r.getheader("Content-Length"),
                body.hex()])
    c.close()
print(json.dumps(out))
'''


def test_the_seeder_answers_byte_ranges_exactly_and_refuses_bad_ones(tmp_path, served):
    _src, big, start = served
    port = _free_port()
    start([A], port)
    path = f"/snapshots/{COMMIT}/model.safetensors"
    n = len(big)
    asks = [
        ("GET", None), ("GET", "bytes=0-9"), ("GET", "bytes=10-"), ("GET", "bytes=-5"),
        ("GET", f"bytes={n - 3}-{n + 100}"), ("GET", f"bytes={n - 1}-{n - 1}"),
        ("HEAD", "bytes=0-9"),
        ("GET", f"bytes={n}-"), ("GET", "bytes=9-3"), ("GET", "bytes=-0"), ("GET", "bytes=abc"),
        ("GET", "bytes=0-1,4-5"), ("GET", "items=0-9"),
    ]
    p = subprocess.run([sys.executable, "-c", _CLIENT, A, str(port), path, json.dumps(asks),
                        TOKEN],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = [(s, cr, int(cl) if cl else None, bytes.fromhex(b)) for s, cr, cl, b in
           json.loads(p.stdout)]
    assert got[0] == (200, None, n, big)
    assert got[1] == (206, f"bytes 0-9/{n}", 10, big[:10])
    assert got[2] == (206, f"bytes 10-{n - 1}/{n}", n - 10, big[10:])
    assert got[3] == (206, f"bytes {n - 5}-{n - 1}/{n}", 5, big[-5:])
    assert got[4] == (206, f"bytes {n - 3}-{n - 1}/{n}", 3, big[-3:])  # clipped to the end
    assert got[5] == (206, f"bytes {n - 1}-{n - 1}/{n}", 1, big[-1:])
    assert got[6] == (206, f"bytes 0-9/{n}", 10, b"")  # HEAD: the headers only
    for i, (status, content_range, length, body) in enumerate(got[7:], 7):
        assert (status, content_range, length, body) == (416, f"bytes */{n}", 0, b""), asks[i]


def test_the_seeder_is_read_only_and_listens_on_each_address(tmp_path, served):
    _src, _big, start = served
    port = _port_free_on(A, B)
    seeder = start([A, B, "192.0.2.1"], port)  # an address it cannot bind is skipped
    client = r'''
import http.client, sys
c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=10)
c.request(sys.argv[3], "/snapshots/%s/config.json" % sys.argv[4], body=b"x",
          headers={"Authorization": "Bearer " + sys.argv[5]})
print(c.getresponse().status)
'''
    for ip in (A, B):
        for method, want in (("GET", "200"), ("PUT", "501"), ("POST", "501"), ("DELETE", "501")):
            p = subprocess.run([sys.executable, "-c", client, ip, str(port), method, COMMIT,
                                TOKEN],
                               capture_output=True, text=True, timeout=30)
            assert p.stdout.strip() == want, (ip, method, p.stderr)
    log = seeder.log.read_text()
    assert f"listening on {A}:{port}" in log and f"listening on {B}:{port}" in log
    assert f"cannot listen on 192.0.2.1:{port}" in log


def test_a_seeder_with_no_address_to_listen_on_exits(tmp_path):
    p = subprocess.run([sys.executable, "-c", models._MODEL_SEEDER_PY, "127.0.0.300", "1",
                        str(tmp_path), COMMIT, TOKEN_SUM], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode != 0 and "no address to listen on" in p.stderr


def test_seeders_listen_without_a_reverse_dns_lookup(tmp_path):
    """http.server's stock bind calls socket.getfqdn on the bind address; where no resolver
    answers for the fabric subnet that costs ~10 s per seeder start (measured on the lab).
    Both seeders run here with getfqdn made fatal and must still answer."""
    guard = ("import socket, sys\n"
             "def _no(*a):\n    sys.exit('getfqdn called')\n"
             "socket.getfqdn = _no\n")
    (tmp_path / "f.txt").write_text("x")
    for program, rest in ((models._MODEL_SEEDER_PY, [str(tmp_path), COMMIT, TOKEN_SUM]),
                          (images._IMAGE_SEEDER_PY, ["some/ref:tag", TOKEN_SUM, "1"])):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-c", guard + program, "127.0.0.1", str(port),
                                 *rest],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_listening(proc, "127.0.0.1", port)
        finally:
            proc.kill()
            proc.wait()
