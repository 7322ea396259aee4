"""inspection/status.py: the status script a node runs, its output read back, and each model's
state, on outputs recorded on the lab (tests/fixtures/status) and assembled ones."""

from __future__ import annotations

import json
import re
import subprocess

from config import validate_config
from hostscripts.paths import LIVENESS_STARTS, StackNames
from inspection import status as st
from tests.conftest import ROOT, config_raw
from tests.unit.inspection.recon_helpers import NONCE, assemble

NAMES = StackNames("dev")
FIXTURES = ROOT / "tests" / "fixtures" / "status"


def config(**sections):
    """The lab's dev stack (Pulumi.dev.yaml: tiny-moe, the dev liveness settings)."""
    return validate_config(config_raw(**sections))


def _recorded() -> dict[str, str]:
    return {n: (FIXTURES / f"lab-dev-{n}-serving.txt").read_text() for n in ("spark-1", "spark-2")}


def _nodes(cfg, outputs: dict[str, str]) -> dict[str, st.NodeStatus]:
    return {n.name: st.parse_node(cfg, NAMES, n, outputs[n.name], NONCE) for n in cfg.nodes}


def test_the_script_is_valid_bash_and_reads_only():
    cfg = config()
    for node in cfg.nodes:
        script = st.node_script(cfg, NAMES, node, NONCE)
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
        # nothing that changes a container: only inspect, ps, exec of the probe, cp out
        code = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
        verbs = set(re.findall(r"docker (\w+)", code))
        assert verbs <= {"ps", "inspect", "exec", "cp"}, verbs
    head = st.node_script(cfg, NAMES, cfg.head, NONCE)
    # the probe runs in the API container with the key on stdin from the root-only file
    assert "docker exec -i spark-vllm-dev-serve python3 -c" in head
    assert f"< {NAMES.vllm_key_file}" in head
    assert f"spark-vllm-dev-serve {LIVENESS_STARTS}" in head
    worker = st.node_script(cfg, NAMES, cfg.nodes[1], NONCE)
    assert "state:spark-vllm-dev-ray-worker" in worker and "probe:" not in worker


def test_the_recorded_lab_outputs_read_as_serving_with_figures():
    cfg = config()
    nodes = _nodes(cfg, _recorded())
    assert all(not n.problems and not n.error for n in nodes.values()), nodes
    head = nodes["spark-1"]
    assert head.memory_total and head.memory_available and head.memory_total > head.memory_available
    assert set(head.memory) == {NAMES.serve, NAMES.ray_head, NAMES.gateway}
    assert head.memory[NAMES.serve] and head.memory[NAMES.serve] > 1024**3
    assert set(nodes["spark-2"].memory) == {NAMES.ray_worker}
    serve = head.containers[NAMES.serve]
    # no starts file: the container predates the watchdog's record
    assert serve.restarts_in_window is None and serve.exists and serve.status == "running"
    (main,) = st.model_states(cfg, NAMES, nodes)
    assert main.state == "serving", main
    assert main.name == "tiny-moe" and main.running == 0 and main.waiting == 0
    assert main.kv_cache == 0 and main.tokens_per_second is not None and main.restarts == 0
    assert main.since.startswith("2026-12-02T20:25:17")
    assert main.ranks == {"spark-1/spark-vllm-dev-serve": "running",
                          "spark-1/spark-vllm-dev-ray-head": "running",
                          "spark-2/spark-vllm-dev-ray-worker": "running"}


def _state(count: int, status: str, code: int = 0) -> str:
    return f"{count} " + json.dumps({"Status": status, "ExitCode": code,
                                     "StartedAt": "2026-12-02T20:25:17.68Z"})


def _probe(health, models=("tiny-moe",), running=0.0, waiting=0.0, kv=0.0, gen=(10, 30)):
    samples = [{"t": 1000.0 + i, "m": {"vllm:num_requests_running": running,
                                       "vllm:num_requests_waiting": waiting,
                                       "vllm:kv_cache_usage_perc": kv,
                                       "vllm:generation_tokens_total": float(g),
                                       "vllm:prompt_tokens_total": 5.0}}
               for i, g in enumerate(gen)]
    return json.dumps({"health": health, "models": list(models), "samples": samples})


def _head(**override) -> str:
    sections = {
        "clock": "2000.5",
        "meminfo": "MemTotal: 1000 kB\nMemAvailable: 500 kB\n",
        "docker_ps": "", "container_memory": "",
        f"state:{NAMES.serve}": _state(0, "running"),
        f"starts:{NAMES.serve}": "",
        f"probe:{NAMES.serve}": _probe(200),
        f"state:{NAMES.ray_head}": _state(0, "running"),
        f"state:{NAMES.gateway}": _state(0, "running"),
    }
    sections.update(override)
    return assemble({k: v for k, v in sections.items() if v is not None})


def _worker(status="running") -> str:
    return assemble({"clock": "2000.5", "meminfo": "MemTotal: 1000 kB\nMemAvailable: 500 kB\n",
                     "docker_ps": "", "container_memory": "",
                     f"state:{NAMES.ray_worker}": _state(0, status)})


def _main(head: str, worker: str | None = None) -> st.ModelStatus:
    cfg = config()
    nodes = _nodes(cfg, {"spark-1": head, "spark-2": worker or _worker()})
    return st.model_states(cfg, NAMES, nodes)[0]


def test_figures_running_waiting_kv_cache_and_tokens_per_second():
    m = _main(_head(**{f"probe:{NAMES.serve}": _probe(200, running=2, waiting=3, kv=0.25,
                                                      gen=(100, 160))}))
    assert (m.state, m.running, m.waiting, m.kv_cache) == ("serving", 2, 3, 0.25)
    assert m.tokens_per_second == 60.0  # 60 generated tokens in the 1 s between the samples


def test_more_restarts_than_the_limit_in_the_window_is_a_crash_loop():
    # dev: crashLoopRestarts 2 in crashLoopWindowSeconds 300; the node's clock is 2000.5
    starts = "".join(f"{t} start\n" for t in (1690, 1800, 1900, 1950, 1990))
    m = _main(_head(**{f"state:{NAMES.serve}": _state(4, "running"),
                       f"starts:{NAMES.serve}": starts,
                       f"probe:{NAMES.serve}": ("", 1, "Error: connection refused")}))
    assert m.state == "crash-looping", m
    # each start after the first is a restart: 1800 restarted the one of 1690 (out of the window)
    assert m.restarts_in_window == 4 and m.restarts == 4
    assert "4 restarts in the last 300 s (more than 2)" in m.why


def test_restarts_at_the_limit_are_not_a_crash_loop():
    starts = "1800 start\n1900 serving\n1950 start\n1990 start\n"
    m = _main(_head(**{f"starts:{NAMES.serve}": starts,
                       f"probe:{NAMES.serve}": _probe("URLError: refused")}))
    assert m.state == "starting" and m.restarts_in_window == 2, m
    assert "/health URLError: refused" in m.why


def test_serving_wins_over_past_restarts():
    starts = "".join(f"{t} start\n" for t in (1800, 1900, 1950, 1990)) + "1995 serving\n"
    m = _main(_head(**{f"starts:{NAMES.serve}": starts}))
    assert m.state == "serving" and m.restarts_in_window == 3


def test_a_rank_not_running_is_not_serving():
    m = _main(_head(), _worker("exited"))
    assert m.state == "starting" and "spark-2/spark-vllm-dev-ray-worker is exited" in m.why
    assert m.ranks["spark-2/spark-vllm-dev-ray-worker"] == "exited"


def test_a_model_not_listed_by_vllm_is_not_serving():
    m = _main(_head(**{f"probe:{NAMES.serve}": _probe(200, models=("other",))}))
    assert m.state == "starting", m


def test_missing_stopped_and_unreadable():
    gone = ("", 1, "Error: No such object: spark-vllm-dev-serve")
    m = _main(_head(**{f"state:{NAMES.serve}": gone}))
    assert m.state == "missing" and "no container spark-vllm-dev-serve on spark-1" in m.why
    m = _main(_head(**{f"state:{NAMES.serve}": _state(0, "exited", 137)}))
    assert m.state == "stopped" and "exited (exit code 137)" in m.why
    # docker did not answer: nothing is known, and nothing is taken for good news
    m = _main(_head(**{f"state:{NAMES.serve}": ("", 124, "")}))
    assert m.state == "unknown" and "docker inspect: exit code 124" in m.why
    m = _main(_head(**{f"state:{NAMES.serve}": None}))
    assert m.state == "unknown" and "no answer" in m.why


def test_a_node_that_cannot_be_reached_makes_its_models_unknown():
    cfg = config()
    nodes = {"spark-1": st.NodeStatus("spark-1", error="unreachable: refused"),
             "spark-2": st.parse_node(cfg, NAMES, cfg.nodes[1], _worker(), NONCE)}
    (m,) = st.model_states(cfg, NAMES, nodes)
    assert m.state == "unknown" and "spark-1: unreachable: refused" in m.why


def test_services_and_mp_ranks_are_watched_where_they_run():
    cfg = config(vllm={"executor": "mp"}, services=[{
        "name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8100,
        "gpuMemoryUtilization": 0.1, "nodes": ["spark-2"]}])
    head = [w.container for w in st.watched(cfg, NAMES, cfg.head)]
    worker = st.watched(cfg, NAMES, cfg.nodes[1])
    assert head == [NAMES.serve, NAMES.gateway]
    assert [w.container for w in worker] == [NAMES.serve, NAMES.service("embed")]
    assert worker[0].url == "" and worker[1].url == "http://192.168.177.12:8100"
    assert worker[1].key_file == NAMES.service_key_file("embed")
    main, embed = st.models(cfg, NAMES)
    assert main.needs == (("spark-2", NAMES.serve),) and embed.api == ("spark-2", NAMES.service("embed"))


def test_the_next_up_warns_of_a_crash_loop_from_recons_record():
    """Recon reads the same starts file (section `starts:<container>`, in the node's clock) and
    preflight warns of a container restarted more than crashLoopRestarts times in the window;
    a container with no record (Docker: no such file) is no news."""
    from inspection import preflight, recon
    from tests.unit.inspection.recon_helpers import parse, spark_sections

    cfg = config()
    head = cfg.head
    script = recon.recon_script(cfg, head, NONCE, NAMES)
    assert f"sv_bg starts:{NAMES.serve} " in script
    assert "starts:" not in recon.recon_script(cfg, cfg.nodes[1], NONCE, NAMES)
    # the node's clock is 1764480000.1-.9; offset about +0.5 s from the control machine
    now_node = 1764480000.5
    record = "".join(f"{now_node - age:.3f} start\n" for age in (250, 200, 120, 60, 10))
    sections = spark_sections(1, **{f"starts:{NAMES.serve}": record,
                                    "starts:spark-vllm-dev-embed": ("", 1, "Could not find")})
    facts = parse(assemble(sections), sent_at=now_node - 0.3, received_at=now_node + 0.3)
    assert list(facts.liveness_starts) == [NAMES.serve]
    (warning,) = preflight.check_crash_loops(cfg, facts, now=now_node)
    assert warning.check == "crash_loop" and warning.node == "spark-1"
    assert "spark-vllm-dev-serve is crash-looping: 4 restarts in the last 300 s (more than 2)" \
        in warning.fact
    # two restarts are within the limit; and restarts older than the window do not count
    assert preflight.check_crash_loops(cfg, facts, now=now_node + 190) == []
