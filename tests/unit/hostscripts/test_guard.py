"""hostscripts/guard.py, the node's guard against memory exhaustion, run for real on this machine:

* its systemd drop-ins read by systemd's own `systemd-analyze verify` over Debian's units
  (tests/fixtures/guard);
* Debian's real earlyoom with the stack's command line, in a sandbox: a PID namespace of its own
  (it sees and can kill only the test's processes, never this machine's), a private mount
  namespace with a tmpfs over /var/lib (the guard's folder) and a /proc/meminfo the test writes
  (the node's memory as earlyoom reads it). It kills the stack's vLLM first (--prefer and its
  oom_score_adj), never sshd (--avoid), and its kill hook records the kill with the node's memory;
* the hook alone, with names a process may choose;
* the scripts that write the drop-ins, start the killer and undo it, with the lab's systemctl
  stand-in as systemd (lab/standins/systemctl says what it does and does not), in the same
  sandbox with an overlay over /etc and a tmpfs over /run; recon's guard snippet reads what they
  left, and components/guard's drift judges it.

Root, unshare and Debian's earlyoom are needed (`make setup` installs earlyoom:
scripts/host_packages.sh); without them the tests fail saying so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostscripts import guard as g
from inspection import parsers as p
from tests.conftest import ROOT

SPEC = g.GuardSpec(node="spark-1", stack="dev", killer="earlyoom", reserve_bytes=1 << 30,
                   protect_score_adj=-900)
FIXTURES = ROOT / "tests" / "fixtures" / "guard"
GIB_KB = 1 << 20
# a node of 8 GiB with 768 MiB available: below the 1 GiB reserve (SIGTERM), above half of it
LOW = {"MemTotal": 8 * GIB_KB, "MemFree": 512 << 10, "MemAvailable": 768 << 10,
       "Buffers": 0, "Cached": 256 << 10, "SwapTotal": 0, "SwapFree": 0}
PLENTY = {**LOW, "MemFree": 6 * GIB_KB, "MemAvailable": 7 * GIB_KB}


def _meminfo(values: dict[str, int]) -> str:
    return "".join(f"{k}:{v:>16} kB\n" for k, v in values.items())


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None and not os.path.exists(t)]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"the guard's tests run earlyoom and the scripts in namespaces of their own: "
                    f"they need root and {', '.join(tools)} (missing: {missing}); `make setup` "
                    "as root installs earlyoom (scripts/host_packages.sh)")


def _sandbox(tmp_path: Path, script: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """`script` (bash) in a PID and mount namespace of its own, as a lab node is: /proc shows
    its processes only; /var/lib and /run are its own (tmpfs), /etc an overlay of this
    machine's, /usr/local/sbin the test's bin folder (the lab's systemctl and journalctl
    stand-ins, when the test puts them there)."""
    for d in ("etc/upper", "etc/work", "bin"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    setup = ["set -eu",
             "mount -t tmpfs guard-test-var /var/lib",
             "mount -t tmpfs guard-test-run /run",
             f"mount -t overlay guard-test-etc -o lowerdir=/etc,upperdir={tmp_path}/etc/upper,"
             f"workdir={tmp_path}/etc/work /etc",
             f"mount --bind {tmp_path}/bin /usr/local/sbin"]
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--propagation", "private",
         "bash", "-c", "\n".join([*setup, script])],
        capture_output=True, text=True, timeout=timeout,
        env={"PATH": "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "T": str(tmp_path)})


# --------------------------------------------------------------------------- the drop-ins


def _units(tmp_path: Path, spec: g.GuardSpec, **replace: str) -> Path:
    """Debian's units (the fixtures) with the stack's drop-ins, as a unit folder."""
    d = tmp_path / "units"
    d.mkdir()
    for unit in ("earlyoom.service", "ssh.service", "docker.service"):
        shutil.copy(FIXTURES / unit, d / unit)
    for path, text in {**g.daemon_files(spec), **g.killer_files(spec)}.items():
        rel = d / Path(path).relative_to(g.StackNames(spec.stack).guard_dropin(
            "ssh.service").rsplit("/", 2)[0])
        rel.parent.mkdir(parents=True, exist_ok=True)
        for old, new in replace.items():
            text = text.replace(old, new)
        rel.write_text(text)
    return d


def _verify(units: Path, unit: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", unit], capture_output=True,
                          text=True, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"})


@pytest.mark.parametrize("killer", g.KILLERS)
def test_systemd_reads_every_drop_in_without_a_complaint(tmp_path, killer):
    """Each of the stack's drop-ins over Debian's own unit: systemd-analyze verify accepts the
    unit and names no unknown key, section or value."""
    _need("systemd-analyze", g.EARLYOOM)
    spec = g.GuardSpec("spark-1", "dev", killer, 1 << 30, -900)
    units = _units(tmp_path, spec)
    checked = sorted({Path(p).parent.name.removesuffix(".d")
                      for p in {**g.daemon_files(spec), **g.killer_files(spec)}})
    assert checked, spec
    for unit in checked:
        if unit == "systemd-oomd.service":
            continue  # Debian's systemd-oomd package is not installed here: its unit is not
        done = _verify(units, unit)
        assert done.returncode == 0 and done.stdout + done.stderr == "", (unit, done)


def test_the_verify_catches_a_drop_in_systemd_would_not_read(tmp_path):
    """The check above can fail: a misspelt key is named by systemd."""
    _need("systemd-analyze", g.EARLYOOM)
    units = _units(tmp_path, SPEC, OOMScoreAdjust="OOMScoreAdjst")
    done = _verify(units, "ssh.service")
    assert "Unknown key 'OOMScoreAdjst'" in done.stderr, done


def test_the_earlyoom_drop_in_replaces_the_packages_command_line():
    text = g.killer_files(SPEC)[g.StackNames("dev").guard_dropin("earlyoom.service")]
    lines = text.splitlines()
    # ExecStart= empties the package's before this one's: /etc/default/earlyoom no longer applies
    assert lines.index("ExecStart=") == lines.index(next(ln for ln in lines
                                                          if ln.startswith("ExecStart=")))
    assert lines[-1] == "ExecStart=" + " ".join(g.earlyoom_argv(SPEC))
    assert g.earlyoom_argv(SPEC)[:5] == [g.EARLYOOM, "-M", "1048576,524288", "-s", "100"]
    assert "DynamicUser=no" in lines and f"ReadWritePaths=-{g.GUARD_DIR}" in lines
    assert "OOMScoreAdjust=-1000" in lines


# --------------------------------------------------------------------------- earlyoom, for real

# A process of a given name (the file it is run as: a link to this python) that holds `mib`
# MiB, with `adj` as its oom_score_adj; on SIGTERM it says so and gives the node its memory
# back (the test's /proc/meminfo shows plenty), then exits, as a killed vLLM frees its memory.
VICTIM = r"""
import os, shutil, signal, sys, time
name, adj, mib, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if adj:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(adj))
hold = bytearray(b"\x01") * (mib << 20)
def end(sig, frame):
    shutil.copyfile(t + "/meminfo.plenty", t + "/meminfo.now")
    with open(t + "/victims", "a") as f:
        f.write(name + " got " + str(sig) + "\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
with open(t + "/victims", "a") as f:
    f.write(name + " ready\n")
while True:
    time.sleep(1)
"""


def _earlyoom_run(tmp_path: Path, victims: list[tuple[str, int, int]]) -> tuple[str, str, str]:
    """The stack's records and killer scripts (earlyoom started from the stack's drop-in by the
    lab's systemctl stand-in, its log read by its journalctl stand-in) over `victims` (name,
    oom_score_adj, MiB held) on a node below its reserve: (the guard's kills record, its
    metrics file, what the victims said)."""
    _need("unshare", g.EARLYOOM)
    _standin(tmp_path)
    victim_bin = tmp_path / "victims-bin"
    victim_bin.mkdir()
    for name, _adj, _mib in victims:
        os.symlink(sys.executable, victim_bin / name)
    (tmp_path / "victim.py").write_text(VICTIM)
    (tmp_path / "meminfo.now").write_text(_meminfo(LOW))
    (tmp_path / "meminfo.plenty").write_text(_meminfo(PLENTY))
    (tmp_path / "records.sh").write_text(g.records_script(SPEC))
    (tmp_path / "killer.sh").write_text(g.killer_script(SPEC))
    (tmp_path / "victims").write_text("")
    start = "\n".join(f'"$T/victims-bin/{n}" "$T/victim.py" {n} {adj} {mib} "$T" &'
                      for n, adj, mib in victims)
    script = f"""
mount --bind "$T/meminfo.now" /proc/meminfo
sh "$T/records.sh" >/dev/null
{start}
for i in $(seq 100); do [ "$(grep -c ready "$T/victims")" = {len(victims)} ] && break; sleep 0.1; done
sh "$T/killer.sh" >/dev/null
for i in $(seq 200); do [ -s {g.KILLS} ] && break; sleep 0.1; done
sleep 1
systemctl stop earlyoom.service
cat {g.KILLS}; echo ===; cat {g.METRICS}
"""
    done = _sandbox(tmp_path, script)
    assert done.returncode == 0, done
    kills, _, metrics = done.stdout.partition("===\n")
    return kills, metrics, (tmp_path / "victims").read_text()


def test_earlyoom_kills_the_stacks_vllm_first_and_records_it(tmp_path):
    """Below the reserve, earlyoom sends SIGTERM to the stack's vLLM (oom_score_adj 1000 and
    --prefer) although a bigger process and a bigger sshd run beside it; the hook records one
    kill of `vllm` with the node's memory at that moment (768 MiB of 8 GiB), and the count the
    node exporter reads is 1."""
    kills, metrics, said = _earlyoom_run(
        tmp_path, [("vllm", 1000, 16), ("sshd", 0, 200), ("python3", 0, 120)])
    assert said.count("got 15") == 1 and "vllm got 15" in said, said
    (kill,) = p.parse_oom_kills(kills)
    assert (kill.name, kill.available_bytes, kill.total_bytes) == ("vllm", 768 << 20, 8 << 30)
    assert kill.pid and kill.pid > 1  # a pid of the sandbox's namespace
    assert "spark_vllm_oom_kills_total 1\n" in metrics, metrics
    assert f"spark_vllm_oom_last_kill_available_bytes {768 << 20}\n" in metrics, metrics
    assert f"spark_vllm_oom_last_kill_timestamp_seconds {int(kill.time)}\n" in metrics


def test_earlyoom_passes_over_sshd_for_a_smaller_process(tmp_path):
    """No vLLM: sshd holds the most, yet --avoid takes 300 from its score and earlyoom kills
    the next one."""
    kills, _metrics, said = _earlyoom_run(tmp_path, [("sshd", 0, 300), ("worker", 0, 120)])
    assert said.count("got 15") == 1 and "worker got 15" in said, said
    assert [k.name for k in p.parse_oom_kills(kills)] == ["worker"]


# --------------------------------------------------------------------------- the hook


def test_the_hook_records_any_name_as_one_plain_field_and_counts(tmp_path):
    """A victim's name is its owner's choice: spaces, a newline, shell syntax. The record keeps
    one line per kill that recon reads back, the count goes on, the metrics file is Prometheus's
    text format (promtool check metrics)."""
    _need("unshare")
    (tmp_path / "records.sh").write_text(g.records_script(SPEC))
    names = ["vllm", "a b\n$(touch x)", ""]
    runs = "\n".join(
        f"EARLYOOM_PID={pid} EARLYOOM_NAME={shlex.quote(n)} EARLYOOM_UID=0 {g.HOOK} >/dev/null"
        for pid, n in zip((101, 102, 103), names, strict=True))
    done = _sandbox(tmp_path, f"""sh "$T/records.sh" >/dev/null
{runs}
cat {g.KILLS}; echo ===; cat {g.METRICS}; echo ===; stat -c '%a %n' {g.GUARD_DIR} {g.KILLS} {g.HOOK} {g.METRICS}""")
    assert done.returncode == 0, done
    kills, metrics, modes = done.stdout.split("===\n")
    got = p.parse_oom_kills(kills)
    assert [(k.pid, k.name) for k in got] == [(101, "vllm"), (102, "a_b___touch_x_"),
                                              (103, "-")], kills
    # earlyoom's log is not in this sandbox: the available memory is unknown, never guessed
    assert {k.available_bytes for k in got} == {None}
    assert len(kills.splitlines()) == 3
    assert "spark_vllm_oom_kills_total 3\n" in metrics
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing (Debian's prometheus package: `make setup`)")
    lint = subprocess.run([promtool, "check", "metrics"], input=metrics, capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint
    assert modes.split("\n")[:4] == [f"755 {g.GUARD_DIR}", f"644 {g.KILLS}", f"755 {g.HOOK}",
                                     f"644 {g.METRICS}"], modes


def test_the_records_folder_is_kept_while_a_stack_uses_it(tmp_path):
    """Two stacks on a node share its guard folder: the first one's destroy keeps it (and the
    kills recorded so far, which a second run of its command keeps too), the last one's
    removes it."""
    _need("unshare")
    other = g.GuardSpec("spark-1", "staging", "earlyoom", 1 << 30, -900)
    for name, text in (("dev", g.records_script(SPEC)), ("staging", g.records_script(other)),
                       ("dev-remove", g.records_remove(SPEC)),
                       ("staging-remove", g.records_remove(other))):
        (tmp_path / f"{name}.sh").write_text(text)
    done = _sandbox(tmp_path, f"""sh "$T/dev.sh"; echo '1 2 3 4 vllm' >> {g.KILLS}
sh "$T/staging.sh"; sh "$T/dev.sh"
cat {g.KILLS}; echo ===
sh "$T/dev-remove.sh"; ls {g.GUARD_DIR}; echo ===
sh "$T/staging-remove.sh"; ls -d {g.GUARD_DIR} 2>&1 || true""")
    assert done.returncode == 0, done
    first, kept, gone = done.stdout.split("===\n")
    assert "1 2 3 4 vllm" in first and "(1 so far)" not in first
    assert "kept for the stacks staging" in kept and "kills" in kept
    assert "removed" in gone and "No such file" in gone


# --------------------------------------------------------------------------- the scripts


def _standin(tmp_path: Path) -> None:
    """The lab's systemctl and journalctl stand-ins as the sandbox's (lab/standins: THE LAB RUNS
    NO SYSTEMD; each says what it simulates)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    for tool in ("systemctl", "journalctl"):
        shutil.copy(ROOT / "lab" / "standins" / tool, tmp_path / "bin" / tool)


def _can_lower_oom_score_adj() -> bool:
    """Whether this machine's root may lower a process's oom_score_adj (CAP_SYS_RESOURCE: a
    Spark's root may; the root of a container or of some VMs, this lab machine's, may not)."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        Path(f"/proc/{p.pid}/oom_score_adj").write_text("-1")
        return True
    except OSError:
        return False
    finally:
        p.kill()
        p.wait()


def test_the_scripts_apply_the_guard_and_destroy_puts_the_node_back(tmp_path):
    """The daemons' drop-ins and the running sshd's and dockerd's oom_score_adj: lowered now
    where the kernel lets root (one already lower keeps its own), else a note that the drop-in
    applies from the next start; earlyoom started with the stack's command line; recon's
    snippet then reads no drift, and reads a drop-in edited by hand and earlyoom stopped as
    drift; the removes leave no drop-in and earlyoom as it was (stopped)."""
    _need("unshare", g.EARLYOOM)
    _standin(tmp_path)
    from components.guard import daemons_drift, killer_drift
    from inspection.facts import MemoryFacts, NodeFacts

    scripts = {"daemons": g.daemons_script(SPEC), "killer": g.killer_script(SPEC),
               "records": g.records_script(SPEC), "daemons-rm": g.daemons_remove(SPEC),
               "killer-rm": g.killer_remove(SPEC)}
    for name, text in scripts.items():
        (tmp_path / f"{name}.sh").write_text(text)
    (tmp_path / "guard.sh").write_text((ROOT / "inspection" / "snippets" / "guard.sh").read_text())
    files = " ".join(g.survey_files(g.StackNames("dev")))
    dropin = g.StackNames("dev").guard_dropin("earlyoom.service")
    survey = f'bash "$T/guard.sh" {g.GUARD_DIR} {files}'
    done = _sandbox(tmp_path, f"""
# a node's sshd (where root may: more protected than the stack asks already) and dockerd
sleep 600 & echo $! > /run/sshd.pid; echo -1000 > /proc/$!/oom_score_adj 2>/dev/null || true
sleep 600 & echo $! > /run/docker.pid
sh "$T/records.sh" >/dev/null
sh "$T/daemons.sh" 2>"$T/daemons.err"
echo "sshd $(cat /proc/$(cat /run/sshd.pid)/oom_score_adj) dockerd $(cat /proc/$(cat /run/docker.pid)/oom_score_adj)"
sh "$T/killer.sh"
pid=$(systemctl show -p MainPID --value earlyoom.service)
echo "earlyoom $(tr '\\0' ' ' < /proc/$pid/cmdline)"
echo ===; {survey}; echo ===
echo '# edited' >> {dropin}; systemctl stop earlyoom.service
{survey}; echo ===
sh "$T/killer-rm.sh" >/dev/null; sh "$T/daemons-rm.sh" >/dev/null
{survey}; echo "after: $(systemctl is-active earlyoom.service) $(systemctl is-enabled earlyoom.service)"
""")
    assert done.returncode == 0, done
    applied, first, edited, removed = done.stdout.split("===\n")
    notes = (tmp_path / "daemons.err").read_text()
    if _can_lower_oom_score_adj():
        assert "sshd -1000 dockerd -900" in applied and notes == "", (applied, notes)
    else:  # this machine: the values stay, the script says why and goes on
        assert "sshd 0 dockerd 0" in applied, applied
        assert "the kernel refused to lower the oom_score_adj of docker.service" in notes, notes
    assert "OOMScoreAdjust=-900 for ssh.service and docker.service" in applied, applied
    assert f"earlyoom {' '.join(g.earlyoom_argv(SPEC))} " in applied, applied
    mem = MemoryFacts(total_bytes=1, available_bytes=1)

    def facts(text: str) -> NodeFacts:
        return NodeFacts(node="spark-1", memory=mem, guard=p.parse_guard(text))

    ok = facts(first)
    assert ok.guard is not None and ok.guard.records_present and ok.guard.has("earlyoom")
    assert daemons_drift(SPEC, ok) == [] and killer_drift(SPEC, ok) == [], first
    drift = killer_drift(SPEC, facts(edited))
    assert drift == [f"{dropin} changed", "earlyoom.service is inactive"], drift
    gone = facts(removed.rsplit("after:", 1)[0])
    assert gone.guard is not None and all(v is None for v in gone.guard.files.values())
    assert removed.rsplit("after:", 1)[1].split() == ["inactive", "disabled"], removed


def test_the_killer_script_fails_saying_how_when_earlyoom_is_missing(tmp_path):
    """A node without earlyoom (hidden here) fails the apply naming the package and the key;
    with guard.install the install script asks apt-get (a stand-in here that fails) and fails
    with its words."""
    _need("unshare")
    _standin(tmp_path)
    (tmp_path / "killer.sh").write_text(g.killer_script(SPEC))
    (tmp_path / "install.sh").write_text(g.install_script(SPEC))
    # a FAKE apt-get: no package source in the sandbox, as on a node without one
    (tmp_path / "bin" / "apt-get").write_text("#!/bin/sh\necho \"E: Unable to locate package $*\"\n"
                                              "exit 100\n")
    (tmp_path / "bin" / "apt-get").chmod(0o755)
    done = _sandbox(tmp_path, f"""mount --bind /dev/null {g.EARLYOOM} 2>/dev/null || true
sh "$T/killer.sh" || echo "killer rc $?"
sh "$T/install.sh" || echo "install rc $?"
""")
    out = done.stdout + done.stderr
    assert "killer rc 1" in out and "earlyoom is not installed: apt-get install earlyoom" in out
    assert "spark-vllm:guard.install: true" in out
    assert "install rc 1" in out and "apt-get install earlyoom failed" in out, out
    assert "Unable to locate package" in out, out
