"""Progress of the two long copies of an `up`, run for real on this machine with a short interval:
the image copy (payloads/image_seeder.py serving a fake `docker save`, payloads/fetch_url.py
fetching it) and the model fan-out (payloads/model_seeder.py, slowed down, and
payloads/model_sync.py). Each prints `<what> <node>: <done> of <total> (<percent>), <rate>,
ETA <left>` to stderr while it copies and one line at 100% at the end; the numbers are checked,
never the seconds. The builders' scripts are run too, with a fake docker (and a fake python3 for
the image pull), to see the interval and the node's name reach the payload.
Everything that connects runs in a subprocess: the unit tier forbids this process the network."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hostscripts import images, models
from hostscripts.models import ModelFile
from hostscripts.paths import StackNames
from tests.unit.hostscripts.test_model_copy_scripts import (
    COMMIT,
    REPO,
    TOKEN,
    TOKEN_SUM,
    _broken,
    _cache_with,
    _manifest,
    _port_free_on,
    _repo,
    _sync_py,
    _wait_listening,
)

MIB = 1 << 20
IMAGE_TOKEN = "ab" * 32
NODE = "node-x"
# "<done> MiB[ of [~]<total> MiB (<percent>%)], <rate> MiB/s[, ETA <left>|, done in <time>]"
TICK = re.compile(r"(?P<done>[0-9.]+) MiB(?: of (?P<approx>~?)(?P<total>[0-9.]+) MiB "
                  r"\((?P<pct>\d+)%\))?, [0-9.]+ MiB/s(?P<tail>, ETA \d+(?:s|m\d\ds|h\d\dm)"
                  r"|, done in \d+(?:s|m\d\ds|h\d\dm))?")
# (an ETA in hours is what a first tick shows when the copy has hardly begun: seen on a loaded
# machine, "0.0 MiB of 4.0 MiB (0%), 0.0 MiB/s, ETA 34h47m")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parse(prefix: str, lines: list[str]) -> list[re.Match[str]]:
    """Every line `<prefix>: <progress>`, parsed (an assertion error for any other line)."""
    out = []
    for line in lines:
        assert line.startswith(prefix + ": "), line
        m = TICK.fullmatch(line[len(prefix) + 2:])
        assert m, line
        out.append(m)
    return out


def _consistent(m: re.Match[str]) -> None:
    """The percent is the done of the total (to the shown rounding), never over 100."""
    done, total, pct = float(m["done"]), float(m["total"]), int(m["pct"])
    assert done <= total and 0 <= pct <= 100, m.group(0)
    assert abs(pct - 100 * done / total) <= 100 * 0.05 / total + 1, m.group(0)


# --- the image copy --------------------------------------------------------------------------

def _image_seeder(tmp_path: Path, size_answer: str) -> tuple[subprocess.Popen, int]:
    """The real image seeder over a fake docker: `image inspect` answers `size_answer`, `save`
    writes 4 MiB in 1 MiB pieces, 0.3 s apart (the seeder forwards 1 MiB reads)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text(
        "#!/bin/sh\n"
        f"if [ \"$1 $2\" = 'image inspect' ]; then printf '%s' '{size_answer}'; exit 0; fi\n"
        "[ \"$1\" = save ] || exit 1\n"
        "for i in 1 2 3 4; do head -c 1048576 /dev/zero | tr '\\0' \"$i\"; sleep 0.3; done\n")
    (bin_ / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    port = _free_port()
    seeder = subprocess.Popen(
        [sys.executable, "-c", images._IMAGE_SEEDER_PY, "127.0.0.1", str(port), "repo:tag",
         hashlib.sha256(IMAGE_TOKEN.encode()).hexdigest(), "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_listening(seeder, "127.0.0.1", port)
    return seeder, port


def _fetch(port: int, *progress: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", images._FETCH_PY,
                           f"http://127.0.0.1:{port}/image.tar", *progress],
                          input=f"{IMAGE_TOKEN}\n".encode(), capture_output=True, timeout=60,
                          check=True)


IMAGE_BYTES = b"".join(bytes([ord(str(i))]) * MIB for i in range(1, 5))


@pytest.mark.parametrize("size_answer,total", [
    ("4194304", 4.0),  # the image's size as docker gives it: the stream's size here
    ("", None),        # docker gives none: bytes and rate only, no made-up total
    ("2097152", 2.0),  # docker's size is below the stream's: the total goes once reached
])
def test_the_image_copy_prints_its_progress_and_copies_the_same_bytes(tmp_path, size_answer,
                                                                      total):
    seeder, port = _image_seeder(tmp_path, size_answer)
    try:
        out = _fetch(port, "0.1", "image copy", NODE)
    finally:
        seeder.kill()
        seeder.wait()
    assert out.stdout == IMAGE_BYTES  # what docker load gets: the stream, byte for byte
    err = out.stderr.decode()
    assert IMAGE_TOKEN not in err and "127.0.0.1" not in err and "http" not in err
    lines = _parse(f"image copy {NODE}", err.splitlines())
    ticks, last = lines[:-1], lines[-1]
    # the end: everything that came, at 100%
    assert (last["done"], last["total"], last["approx"], last["pct"]) == ("4.0", "4.0", "", "100")
    assert last["tail"].startswith(", done in "), last.group(0)
    # on the way: 4 pieces 0.3 s apart, a line every 0.1 s
    assert len(ticks) >= 3, err
    done = [float(t["done"]) for t in ticks]
    assert done == sorted(done) and done[-1] <= 4.0, err
    assert any(0 < d < 4 for d in done), err  # one line mid-copy at least
    assert all(t["pct"] != "100" for t in ticks), err  # 100% is the end's alone
    for t in ticks:
        if total is not None and float(t["done"]) < total:
            assert float(t["total"]) == total and t["approx"] == "~", t.group(0)
            _consistent(t)
            if t["tail"]:
                assert t["tail"].startswith(", ETA "), t.group(0)
        else:  # no total known, or an estimate reached: bytes and rate, no percent, no ETA
            assert t["total"] is None and t["pct"] is None and t["tail"] is None, t.group(0)
    if total == 2.0:
        assert any(d > 2.0 for d in done), err  # the case this asks about was seen


def test_the_image_fetch_without_an_interval_prints_nothing(tmp_path):
    seeder, port = _image_seeder(tmp_path, "4194304")
    try:
        out = _fetch(port)
    finally:
        seeder.kill()
        seeder.wait()
    assert out.stdout == IMAGE_BYTES and out.stderr == b""


# --- the model fan-out ---------------------------------------------------------------------------

# The real model seeder with a pause before each body: a copy of some seconds, not milliseconds.
_SLOW = ("import socket, time\n"
         "_send = socket.socket.sendfile\n"
         "def _slow(self, *a, **k):\n    time.sleep(0.2)\n    return _send(self, *a, **k)\n"
         "socket.socket.sendfile = _slow\n")
BIG = bytes(range(256)) * (4 * MIB // 256)  # 4 ranges of 1 MiB


@pytest.fixture
def slow_seeder(tmp_path):
    """A source cache (a 4 MiB file and an 8-byte one) served by a slowed model seeder on A."""
    src = tmp_path / "src"
    _cache_with(src, {"config.json": b'{"a": 1}', "model.safetensors": BIG})
    port = _port_free_on("127.0.0.1", "127.0.0.2")
    log = (tmp_path / "seeder.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", _SLOW + models._MODEL_SEEDER_PY, "127.0.0.1",
                             str(port), str(_repo(src)), COMMIT, TOKEN_SUM],
                            stdout=subprocess.DEVNULL, stderr=log)
    _wait_listening(proc, "127.0.0.1", port)
    yield src, port
    proc.kill()
    proc.wait()
    log.close()


def _sync(dst: Path, manifest: str, *argv: str) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-c", _sync_py(dst), *argv], input=manifest, text=True,
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p


def test_the_model_fan_out_prints_its_progress_then_100_percent(tmp_path, slow_seeder):
    src, port = slow_seeder
    dst = tmp_path / "dst"
    manifest = _manifest(src, port, [models.Seed("127.0.0.1")], chunk=MIB)
    p = _sync(dst, manifest, "0.05", NODE)
    assert json.loads(p.stdout.splitlines()[-1])["bytesMoved"] == len(BIG) + 8  # as before
    assert (_repo(dst) / "snapshots" / COMMIT / "model.safetensors").read_bytes() == BIG
    prefix = f"model fan-out {NODE}"
    lines = p.stderr.splitlines()
    assert lines[0] == f"{prefix}: 4.0 MiB to copy (2 of 2 files), over 1 seeder address"
    assert TOKEN not in p.stderr and "127.0.0.1" not in p.stderr
    parsed = _parse(prefix, lines[1:])
    ticks, last = parsed[:-1], parsed[-1]
    assert (last["done"], last["total"], last["pct"]) == ("4.0", "4.0", "100"), last.group(0)
    assert last["tail"].startswith(", done in "), last.group(0)
    # 5 pieces over 2 streams, each body 0.2 s late: several lines at 0.05 s
    assert len(ticks) >= 3, p.stderr
    done = [float(t["done"]) for t in ticks]
    assert done == sorted(done), p.stderr
    for t in ticks:
        assert t["total"] == "4.0" and t["approx"] == "", t.group(0)  # the manifest's: exact
        _consistent(t)
    assert any(0 < int(t["pct"]) < 100 for t in ticks), p.stderr
    assert any(t["tail"] and t["tail"].startswith(", ETA ") for t in ticks), p.stderr
    # a second run has nothing to copy and says so, once
    again = _sync(dst, manifest, "0.05", NODE)
    assert again.stderr.splitlines() == [f"{prefix}: nothing to copy: every file is in the cache"]


def test_a_piece_fetched_again_after_a_broken_stream_counts_once(tmp_path, slow_seeder):
    """B breaks every stream halfway: its half-pieces are counted, then taken back when the
    piece goes to A, so the copy still ends at exactly its total."""
    src, port = slow_seeder
    (_repo(src) / "snapshots" / COMMIT / "config.json").unlink()  # the broken seeder: one size
    dst = tmp_path / "dst"
    broken = _broken("127.0.0.2", port, len(BIG))
    try:
        manifest = _manifest(src, port, [models.Seed("127.0.0.1"), models.Seed("127.0.0.2")],
                             chunk=MIB)
        p = _sync(dst, manifest, "0.05", NODE)
    finally:
        broken.kill()
        broken.wait()
    assert "short read" in p.stderr, p.stderr  # B did break a stream
    assert (_repo(dst) / "snapshots" / COMMIT / "model.safetensors").read_bytes() == BIG
    parsed = _parse(f"model fan-out {NODE}", [
        line for line in p.stderr.splitlines()
        if line.startswith("model fan-out ") and " to copy " not in line])
    for t in parsed:
        _consistent(t)
    assert (parsed[-1]["done"], parsed[-1]["pct"]) == ("4.0", "100"), parsed[-1].group(0)


def test_the_sync_without_argv_names_the_host(tmp_path, slow_seeder):
    src, port = slow_seeder
    manifest = _manifest(src, port, [models.Seed("127.0.0.1")], chunk=MIB)
    p = _sync(tmp_path / "dst", manifest)
    lines = p.stderr.splitlines()
    prefix = f"model fan-out {socket.gethostname()}"
    assert lines[0] == f"{prefix}: 4.0 MiB to copy (2 of 2 files), over 1 seeder address"
    assert all(line.startswith(prefix + ": ") for line in lines), lines
    assert lines[-1].startswith(f"{prefix}: 4.0 MiB of 4.0 MiB (100%), "), lines


# --- the scripts: the interval and the node's name reach the payloads -------------------------

def _fake_bin(tmp_path: Path, name: str, body: str) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / name).write_text("#!/bin/sh\n" + body)
    (bin_ / name).chmod(0o755)


def _argv(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def test_the_image_pull_runs_the_fetch_with_the_interval_and_the_node(tmp_path):
    want = "sha256:" + "c" * 64
    # docker: the image appears once loaded; python3 (the fetch): its argv and stdin recorded
    _fake_bin(tmp_path, "docker",
              f"case \"$1\" in load) cat > /dev/null; touch {tmp_path}/loaded ;;\n"
              f"  image) [ -f {tmp_path}/loaded ] && echo {want} ;; esac\nexit 0\n")
    # python3: the fetch records its argv and stdin; the archive's check (the second python3)
    # passes
    _fake_bin(tmp_path, "python3",
              f"[ -f {tmp_path}/argv ] && exit 0\n"
              f"printf '%s\\0' \"$@\" > {tmp_path}/argv\ncat > {tmp_path}/stdin\n")
    names = StackNames("t")
    script = images.image_pull_from_head(names, "repo:tag", "192.168.177.11", want).replace(
        names.image_copy_dir, str(tmp_path / "scratch"))
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", script], input=IMAGE_TOKEN + "\n", env=env, text=True,
                         capture_output=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "image loaded", out.stderr
    node = subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip()
    assert _argv(tmp_path / "argv") == [
        "-c", images._FETCH_PY, f"http://192.168.177.11:{images.IMAGE_SEED_PORT}/image.tar",
        str(images.COPY_PROGRESS_SECONDS), "image copy", node]
    assert images.COPY_PROGRESS_SECONDS == 10
    assert (tmp_path / "stdin").read_text() == IMAGE_TOKEN + "\n"  # the token: stdin only


def test_the_model_sync_runs_the_payload_with_the_interval_and_the_node(tmp_path):
    _fake_bin(tmp_path, "docker", f"printf '%s\\0' \"$@\" > {tmp_path}/argv\n"
                                  f"cat > {tmp_path}/stdin\n")
    cache = tmp_path / "cache"
    script = models.model_sync("sha256:" + "a" * 64, str(cache), {"spark-vllm.stack": "t"},
                               str(tmp_path / "records"))
    manifest = models.model_manifest_json(
        REPO, COMMIT, "main", [ModelFile("config.json", 8, "b" * 40)],
        [models.Seed("192.168.177.11")], token=TOKEN)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", script], input=manifest, env=env, text=True,
                         capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    node = subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip()
    argv = _argv(tmp_path / "argv")
    assert argv[argv.index("-c"):] == ["-c", models._SYNC_PY,
                                       str(models.SYNC_PROGRESS_SECONDS), node], argv[-3:]
    assert models.SYNC_PROGRESS_SECONDS == 10
    assert (tmp_path / "stdin").read_text() == manifest  # the manifest (and token): stdin only
