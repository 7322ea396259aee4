"""Each recon snippet of inspection/snippets/ runs here against a fake tree or fake tools, as a
node's bash would run it (`bash -c <snippet> _ <args>`), and its output parses."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from inspection import parsers as p
from inspection.recon import snippet


def run(name: str, *args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LC_ALL="C")
    if path is not None:
        env["PATH"] = f"{path}:/usr/bin:/bin"
    # bytes decoded as recon decodes them: UTF-8 with replacement, only '\n' breaks a line
    proc = subprocess.run(["bash", "-c", snippet(name), "_", *args], capture_output=True,
                          env=env, timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       proc.stdout.decode("utf-8", "replace"),
                                       proc.stderr.decode("utf-8", "replace"))


def fake_tool(bin_: Path, name: str, script: str) -> None:
    bin_.mkdir(exist_ok=True)
    (bin_ / name).write_text("#!/bin/sh\n" + script)
    (bin_ / name).chmod(0o755)


def test_hf_cache_lists_refs_snapshots_and_complete_blob_bytes(tmp_path):
    commit = "a" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "x").write_bytes(b"12345")
    (repo / "blobs" / "y.incomplete").write_bytes(b"123")  # a download in progress: not counted
    out = run("hf_cache.sh", str(tmp_path))
    assert out.returncode == 0, out.stderr
    [facts] = p.parse_hf_cache(out.stdout)
    assert (facts.repo_id, facts.refs, facts.snapshots, facts.size_bytes) == (
        "org/tiny", {"main": commit}, [commit], 5)
    assert run("hf_cache.sh", str(tmp_path / "absent")).stdout == ""


def test_hf_cache_lists_the_files_each_snapshot_of_the_stacks_repos_holds(tmp_path):
    """The repos named after the cache folder: every file of each snapshot, through its link,
    with its size; a link whose blob is gone is no file (the seed scenario: config and
    tokenizer linked, the weights not, another revision's blobs in the folder). Other repos'
    files are not looked at; a file name that is not printable is skipped, never printed."""
    commit, other = "a" * 40, "b" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / commit
    (snap / "tok").mkdir(parents=True)
    (repo / "snapshots" / other).mkdir()
    (repo / "blobs").mkdir()
    (repo / "blobs" / "c1").write_bytes(b"{}" * 10)
    (repo / "blobs" / "w-other-revision").write_bytes(b"w" * 999)
    (snap / "config.json").symlink_to("../../blobs/c1")
    (snap / "tok" / "tokenizer.json").symlink_to("../../../blobs/c1")
    (snap / "model.safetensors").symlink_to("../../blobs/w-gone")  # its blob is not there
    (snap / "bad\tname").symlink_to("../../blobs/c1")
    unlisted = tmp_path / "hub" / "models--org--other" / "snapshots" / other
    unlisted.mkdir(parents=True)
    (unlisted / "f").write_text("x")
    out = run("hf_cache.sh", str(tmp_path), "", "models--org--tiny")
    assert out.returncode == 0, out.stderr
    _printable_lines(out.stdout)
    repos = {r.repo_id: r for r in p.parse_hf_cache(out.stdout)}
    assert repos["org/tiny"].snapshot_files == {
        commit: {"config.json": 20, "tok/tokenizer.json": 20}, other: {}}
    assert repos["org/tiny"].size_bytes == 1019
    assert repos["org/other"].snapshot_files is None
    # without names, no repo's files
    assert all(r.snapshot_files is None
               for r in p.parse_hf_cache(run("hf_cache.sh", str(tmp_path)).stdout))


def test_disk_reports_the_nearest_existing_parent(tmp_path):
    out = run("disk.sh", str(tmp_path / "not" / "yet" / "made"))
    assert out.returncode == 0, out.stderr
    assert p.parse_df_avail(out.stdout) > 0


def test_speed_prefers_ethtool_then_sysfs(tmp_path):
    fake_tool(tmp_path / "bin", "ethtool", 'echo "Settings for $1:"; echo "	Speed: 200000Mb/s"\n')
    out = run("speed.sh", "enp1s0f1np1", path=tmp_path / "bin")
    assert p.parse_ethtool_speed(out.stdout) == 200000
    fake_tool(tmp_path / "nothing", "true", "exit 0\n")
    out = run("speed.sh", "lo", path=tmp_path / "nothing")  # no ethtool: sysfs (lo has none)
    assert "Speed" not in out.stdout


def test_gpu_runtime_finds_the_hook_on_path(tmp_path):
    fake_tool(tmp_path / "bin", "nvidia-container-runtime-hook", "exit 0\n")
    out = run("gpu_runtime.sh", path=tmp_path / "bin")
    assert out.returncode == 0
    assert p.parse_gpu_runtime(out.stdout) == [f"hook {tmp_path / 'bin' / 'nvidia-container-runtime-hook'}"]



def test_stopped_lists_the_markers_with_their_stack(tmp_path):
    (tmp_path / "vllm_node").write_text("spark-vllm/prod\n")
    (tmp_path / "reranker").write_text("spark-vllm/dev\nignored second line\n")
    out = run("stopped.sh", str(tmp_path))
    assert out.returncode == 0
    assert p.parse_stopped_markers(out.stdout) == {"vllm_node": "spark-vllm/prod",
                                                   "reranker": "spark-vllm/dev"}
    assert run("stopped.sh", str(tmp_path / "none")).stdout == ""


GOLDEN_NONCE = "0123456789abcdef"  # a real survey makes a fresh one (recon.new_nonce)


def test_recon_script_matches_its_golden_copy():
    """The whole script a node runs for recon, for the dev stack's head: a change to it shows in
    review as a diff of tests/unit/inspection/golden/recon-dev-spark-1.sh
    (GOLDEN_UPDATE=1 rewrites it)."""
    from config import validate_config
    from hostscripts.paths import StackNames
    from inspection.recon import recon_script
    from tests.conftest import config_raw

    cfg = validate_config(config_raw(2))
    text = recon_script(cfg, cfg.nodes[0], GOLDEN_NONCE, StackNames("dev"))
    golden = Path(__file__).parent / "golden" / "recon-dev-spark-1.sh"
    if os.environ.get("GOLDEN_UPDATE") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


# --------------------------------------------------------------------------- names that are not text

UNPRINTABLE = ["a\nb", "a\tb", "a\rb", "a\x1b[2Jb", "a\x85b", "caf\xe9", "a\x7fb", "a\x1cb"]


def _printable_lines(stdout: str) -> None:
    """Every line the snippet printed is printable ASCII with tabs as the only separators."""
    for line in stdout.split("\n"):
        assert all(ch == "\t" or 32 <= ord(ch) < 127 for ch in line), repr(line)


def _mkdir_bytes(parent: Path, name: str) -> Path:
    raw = os.fsencode(parent) + b"/" + name.encode("latin-1")
    os.makedirs(raw)
    return Path(os.fsdecode(raw))


def test_hf_cache_never_prints_a_name_raw(tmp_path):
    """A folder name with a newline, tab, CR, escape sequence or non-ASCII byte could add or
    change records (and, before the nonce, whole recon sections)."""
    commit = "b" * 40
    hub = tmp_path / "hub"
    good = hub / "models--org--good"
    (good / "snapshots" / commit).mkdir(parents=True)
    (good / "refs").mkdir()
    (good / "refs" / "main").write_text(commit)
    for i, bad in enumerate(UNPRINTABLE):
        _mkdir_bytes(hub, f"models--org--x{i}{bad}")
        _mkdir_bytes(good / "snapshots", f"{i}{bad}")
    (good / "refs" / "evil\nsnapshot\tforged").write_text(commit)
    (good / "refs" / "crlf").write_text(commit[:20] + "\x1b" + commit[20:])  # content, not name
    forged = "x\nrepo\tmodels--forged--repo\nblobs\t1"
    _mkdir_bytes(hub, f"models--org--{forged}")
    out = run("hf_cache.sh", str(tmp_path))
    assert out.returncode == 0, out.stderr
    _printable_lines(out.stdout)
    repos = p.parse_hf_cache(out.stdout)
    assert [r.repo_id for r in repos] == ["org/good"]
    assert repos[0].snapshots == [commit] and repos[0].refs == {"main": commit}


def test_stopped_never_prints_a_name_raw(tmp_path):
    (tmp_path / "vllm_node").write_text("spark-vllm/prod\n")
    # a marker whose name forges a second marker line for a container that was never stopped
    (tmp_path / "x\nevil\tspark-vllm").mkdir()
    (tmp_path / "y\nother\tspark-vllm").write_text("spark-vllm/prod\n")
    (tmp_path / "reranker").write_text("spark-vllm/prod\x1b[2J\n")  # content with an escape
    out = run("stopped.sh", str(tmp_path))
    assert out.returncode == 0, out.stderr
    _printable_lines(out.stdout)
    assert p.parse_stopped_markers(out.stdout) == {"vllm_node": "spark-vllm/prod"}


def test_gpu_runtime_never_prints_a_path_raw(tmp_path):
    """`command -v` prints the PATH entry it found; one with a newline forged a second line."""
    bad_dir = _mkdir_bytes(tmp_path, "bin\nhook /forged")
    fake_tool(bad_dir, "nvidia-container-runtime-hook", "exit 0\n")
    out = run("gpu_runtime.sh", path=bad_dir)
    assert out.returncode == 0
    _printable_lines(out.stdout)
    assert p.parse_gpu_runtime(out.stdout) == []




def test_docker_labels_asks_docker_inspect_for_every_container_and_parses(tmp_path):
    """Issue 31, item 8: one `docker inspect` of every container ID `docker ps -aq` lists, each
    a JSON object whose labels keep a ',' (and an escaped newline) inside a value. Issue 46,
    item 7: then one `docker image inspect` of the images they run, once each: an image's own
    LABEL spark-vllm.managed=true (inherited by its containers) counts for nothing."""
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    i1, i2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    fake_tool(tmp_path, "docker", f"""
case "$1" in
  ps) [ "$*" = "ps -aq --no-trunc" ] && printf '%s\\n%s\\n%s\\n' {a} {b} {c} ;;
  inspect) shift 4; for id in "$@"; do
      case $id in
        {a}) echo '{{"ID":"{a}","Image":"{i1}","Labels":{{"description":"fast,spark-vllm.managed=true","x":"1\\\\n2"}}}}' ;;
        {b}) echo '{{"ID":"{b}","Image":"{i2}","Labels":{{"spark-vllm.managed":"true","spark-vllm.stack":"spark-vllm/dev"}}}}' ;;
        {c}) echo '{{"ID":"{c}","Image":"{i1}","Labels":{{"spark-vllm.managed":"true","spark-vllm.stack":"spark-vllm/dev"}}}}' ;;
      esac; done ;;
  image) echo "$*" >> {tmp_path}/image-args; shift 4; for id in "$@"; do
      case $id in
        {i1}) echo '{{"ImageID":"{i1}","Labels":null}}' ;;
        {i2}) echo '{{"ImageID":"{i2}","Labels":{{"spark-vllm.managed":"true","spark-vllm.stack":"spark-vllm/dev"}}}}' ;;
      esac; done ;;
esac
""")
    out = run("docker_labels.sh", path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert p.parse_docker_labels_json(out.stdout) == {
        a: {"description": "fast,spark-vllm.managed=true", "x": "1\n2"},
        b: {},  # its image's own labels: not the stack's
        c: {"spark-vllm.managed": "true", "spark-vllm.stack": "spark-vllm/dev"}}  # set by --label
    assert (tmp_path / "image-args").read_text().split()[-2:] == [i1, i2]  # each image once
    fake_tool(tmp_path, "docker", "exit 0\n")  # no container at all: nothing, and no inspect
    assert run("docker_labels.sh", path=tmp_path).stdout == ""
