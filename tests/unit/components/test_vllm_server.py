"""The vLLM container: its `vllm serve` command line, its runtime, and where the API key may
(not) appear."""

from __future__ import annotations

import copy
import hashlib
import json

import pulumi
import pytest
import yaml

from hostscripts import vllm
from hostscripts.common import payload
from hostscripts.guard import PREFER
from inspection.hub import ModelFile
from tests.conftest import ROOT, config_raw, is_secret, monitoring_pinned, reveal
from tests.unit.conftest import API_KEY, COMMIT, SSH_KEY, settled
from tests.unit.inspection.recon_helpers import fixture

QWEN_REPO = "Qwen/Qwen3.5-122B-A10B-FP8"
TEMPLATE = "/etc/spark-vllm/chat-template.jinja"
QWEN_RECIPE = "qwen3.5-122b-a10b-fp8"
# A chat template of the tests' own (none is shipped): quotes, $, backquotes, a backslash and
# newlines, so the shell quoting that carries it into the container is exercised.
OWN_TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{# it's \"$HOME\" `id` $(id) \\ #}\n")
OWN_TEMPLATE_SHA = hashlib.sha256(OWN_TEMPLATE.encode()).hexdigest()


def stack_vllm(name: str) -> dict:
    """The `vllm` object of Pulumi.<name>.yaml."""
    return copy.deepcopy(yaml.safe_load((ROOT / f"Pulumi.{name}.yaml").read_text())["config"][
        "spark-vllm:vllm"])


def qwen_raw(**vllm) -> dict:
    """The unit config (2 lab-shaped nodes) serving the 122B model with prod's `vllm` object,
    patched with `vllm`."""
    raw = config_raw(2, model={"repo": QWEN_REPO})
    raw["vllm"] = {**stack_vllm("prod"), **vllm}
    return raw


def recipes_with_template(folder, monkeypatch, template: str = OWN_TEMPLATE) -> None:
    """Point config.recipes at `folder`: the shipped 122B recipe with `chatTemplate:
    tool-args.jinja`, and that template (the test's own text)."""
    from config import recipe_files

    folder.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load((ROOT / "config" / "recipes_data" / f"{QWEN_RECIPE}.yaml").read_text())
    assert "chatTemplate" not in doc  # the shipped recipe serves the model's own
    (folder / f"{QWEN_RECIPE}.yaml").write_text(
        yaml.safe_dump({**doc, "chatTemplate": "tool-args.jinja"}))
    (folder / "tool-args.jinja").write_bytes(template.encode())
    monkeypatch.setattr(recipe_files, "RECIPES_DIR", folder)


@pytest.fixture
def own_template(tmp_path, monkeypatch) -> str:
    """The 122B recipe naming a chat template the test wrote; returns the template's text."""
    recipes_with_template(tmp_path / "recipes", monkeypatch)
    return OWN_TEMPLATE


def serve_argv(mocks) -> list[str]:
    """The vLLM container's command: the `vllm serve` argv."""
    return list(mocks.named("vllm-serve").inputs["command"])


def uploads(mocks) -> dict[str, str]:
    """The files uploaded into the vLLM container: {path: content}."""
    return {u["file"]: u["content"] for u in mocks.named("vllm-serve").inputs.get("uploads", [])}


PROD_ARGV = [
    "vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8",
    "--served-model-name", "qwen3.5-122b",
    "--revision", COMMIT,
    "--tensor-parallel-size", "2",
    "--pipeline-parallel-size", "1",
    "--distributed-executor-backend", "ray",
    "--gpu-memory-utilization", "0.7",
    "--max-model-len", "262144",
    "--max-num-seqs", "4",
    "--max-num-batched-tokens", "8192",
    "--kv-cache-dtype", "fp8",
    "--enable-prefix-caching",
    "--load-format", "fastsafetensors",
    "--speculative-config", json.dumps(  # the drafter pinned to the served commit
        {"method": "mtp", "num_speculative_tokens": 1, "revision": COMMIT},
        separators=(",", ":")
    ),
    "--language-model-only",
    "--enable-expert-parallel",
    "--reasoning-parser", "qwen3",
    "--enable-auto-tool-choice",
    "--tool-call-parser", "qwen3_coder",
    "--host", "127.0.0.1",  # only the gateway on the head reaches it (config/listen.py)
    "--port", "8000",
]


@pulumi.runtime.test
def test_vllm_command_line_exactly(build, mocks):
    """Pulumi.prod.yaml: the 122B recipe (config/recipes_data/qwen3.5-122b-a10b-fp8.yaml) with
    prod's own keys (name, parallelism, where it listens). No chat template is shipped: vLLM
    serves the model's own, so there is no flag and no template file."""
    h = build(raw=qwen_raw())

    def check(_):
        serve = mocks.named("vllm-serve").inputs
        assert serve_argv(mocks) == PROD_ARGV
        assert TEMPLATE not in uploads(mocks)
        # the liveness watchdog (the dev stack file's health.liveness: 5 s apart, 10 s each, 3
        # in a row) runs the launcher, which hands the key over and execs the argv; nothing
        # else is on its line
        ep = list(serve["entrypoints"])
        assert ep[:3] == ["python3", "-c", payload("vllm_liveness.py")], ep[:2]
        assert ep[3:10] == ["http://127.0.0.1:8000", "qwen3.5-122b", "generate", "5", "10",
                            "3", "/run/spark-vllm/api-key"], ep[3:10]
        # the crash-loop settings (the dev stack file's): backoff 2 s up to 30 s, more than 2
        # restarts in 300 s
        assert ep[10:15] == ["/var/lib/spark-vllm-liveness/starts", "2", "30", "2", "300"], ep[10:15]
        # the node's guard (the dev stack file's): the kills it reads, vLLM's processes as
        # earlyoom prefers them, the wait after an OOM kill; vLLM raises its oom_score_adj
        assert ep[15:18] == ["/run/spark-vllm-guard/kills", PREFER, "5"], ep[15:18]
        assert ep[18:] == ["/bin/sh", "-c", vllm.launcher(1000), "spark-vllm-serve"]
        assert vllm.launcher(1000).endswith('exec "$@"')
        assert "echo 1000 > /proc/self/oom_score_adj" in vllm.launcher(1000)
        assert {"target": "/run/spark-vllm-guard", "type": "bind",
                "source": "/var/lib/spark-vllm/guard", "readOnly": True} in serve["mounts"]
        labels = {x["label"]: x["value"] for x in serve["labels"]}
        assert labels["spark-vllm.guard-records"] == "guard-spark-1-records-id"  # its ID
        # a container of its own on the head, joined to the stack's Ray cluster
        assert serve["name"] == "spark-vllm-dev-serve" and serve["restart"] == "unless-stopped"
        # the Ray head's PID and IPC namespaces (its /dev/shm: Ray's object store), the
        # stack's own, never the host's (issue 46)
        head_id = hashlib.sha256(b"ray-head").hexdigest()
        assert serve["networkMode"] == "host" and serve["ipcMode"] == "container:" + head_id
        assert serve["pidMode"] == "container:" + head_id
        assert "RAY_ADDRESS=192.168.177.11:6379" in serve["envs"]
        assert {"hostPath": "/run/spark-vllm/stacks/dev/ray-session",
                "containerPath": "/tmp/ray"} in [
            {k: v for k, v in m.items() if k in ("hostPath", "containerPath")}
            for m in serve["volumes"]]
        # gated on health, on the head; the Ray and vLLM containers' IDs re-run the gate
        gate = mocks.named("vllm-health").inputs
        assert reveal(gate["connection"])["host"] == "10.77.0.11"
        assert "/v1/models" in gate["create"] and "/v1/completions" in gate["create"]
        assert "docker logs --tail 2000 spark-vllm-dev-serve" in gate["create"]
        ids = " ".join(hashlib.sha256(n.encode()).hexdigest()
                       for n in ("vllm-serve", "ray-head", "ray-worker-spark-2"))
        assert f"# containers: {ids}" in gate["create"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_recipes_chat_template_reaches_vllm(build, mocks, own_template):
    """The mechanism, with a template the test wrote into its recipes folder: `--chat-template
    /etc/spark-vllm/chat-template.jinja` after the recipe's flags, and the template's exact
    text uploaded there into the vLLM container (so it is in the preview's diff)."""
    h = build(raw=qwen_raw())

    def check(_):
        at_host = PROD_ARGV.index("--host")
        assert serve_argv(mocks) == [*PROD_ARGV[:at_host], "--chat-template", TEMPLATE,
                                     *PROD_ARGV[at_host:]]
        assert uploads(mocks)[TEMPLATE] == own_template

    return settled(h).apply(check)


@pulumi.runtime.test
def test_stack_file_keys_win_over_the_recipe(build, mocks, own_template):
    """Against the 122B recipe naming a template of the test's own, so the stack file's null
    has something to win over."""
    h = build(raw=qwen_raw(maxModelLen=65536, gpuMemoryUtilization=0.8, chatTemplate=None,
                           enableExpertParallel=False, max_num_batched_tokens=16384))

    def check(_):
        argv = serve_argv(mocks)
        assert argv[argv.index("--max-model-len") + 1] == "65536"
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.8"
        assert argv[argv.index("--max-num-batched-tokens") + 1] == "16384"  # snake_case too
        assert "--enable-expert-parallel" not in argv
        # null: the model's own template, so no file and no flag
        assert "--chat-template" not in argv and TEMPLATE not in uploads(mocks)
        # what the stack file leaves alone still comes from the recipe
        assert "--language-model-only" in argv and argv[argv.index("--max-num-seqs") + 1] == "4"
        assert mocks.named("vllm").inputs["maxModelLen"] == 65536  # what the policies see

    return settled(h).apply(check)


def _registered(raw: dict, monkeypatch) -> dict[str, dict]:
    """Every resource's inputs, by name, for one config: a fresh mocked program per call."""
    import asyncio

    from pulumi.runtime import settings

    from components import rerun, stack
    from config import validate_config
    from inspection.hub import ModelManifest
    from inspection.preflight import Plan
    from tests.conftest import PROJECT, RecordingMocks, _SyncExecutor, gb10_facts
    from tests.unit.conftest import MODEL_FILES, fake_manifest, secrets

    monkeypatch.setattr(rerun, "fresh_trigger", lambda now=None: "repair-fixed")
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_SyncExecutor())
    asyncio.set_event_loop(loop)
    settings.ROOT.set(None)
    recorder = RecordingMocks()
    recorder.monitor = pulumi.runtime.mocks.MockMonitor(recorder)
    pulumi.runtime.set_mocks(recorder, project=PROJECT, stack="dev", preview=False,
                             monitor=recorder.monitor)

    @pulumi.runtime.test
    def program():
        cfg = validate_config(raw)
        facts = {n.name: gb10_facts(n.name, index=i + 1) for i, n in enumerate(cfg.nodes)}
        manifest = ModelManifest(cfg.model.repo, cfg.model.revision, COMMIT, MODEL_FILES)
        services = {s.name: fake_manifest(s.repo, s.revision) for s in cfg.services}
        return settled(stack.build_stack(cfg, facts, Plan(), secrets(), manifest=manifest,
                                         service_manifests=services))

    try:
        program()
    finally:
        settings.ROOT.set(None)
        asyncio.set_event_loop(None)
        loop.close()
    return {r.name: dict(r.inputs) for r in recorder.resources}


def _changed(before: dict[str, dict], after: dict[str, dict]) -> set[str]:
    assert before.keys() == after.keys()
    return {n for n in before if json.dumps(before[n], sort_keys=True, default=str)
            != json.dumps(after[n], sort_keys=True, default=str)}


def test_a_recipe_change_is_a_serve_flag_or_an_env_change(tmp_path, monkeypatch):
    """The change table (docs/design.md): a recipe's serve setting or chat template changes
    only the vLLM container (with the component's props for a flag the policies review);
    its env changes the Ray containers' environment (and so the containers) and nothing of the
    image or the model. The recipe is the shipped 122B one naming a chat template of the
    test's own, edited in a folder of the test's."""
    name = QWEN_RECIPE
    doc = yaml.safe_load((ROOT / "config" / "recipes_data" / f"{name}.yaml").read_text())

    def variant(folder: str, template: str = OWN_TEMPLATE, **edits) -> dict[str, dict]:
        d = tmp_path / folder
        recipes_with_template(d, monkeypatch, template)
        (d / f"{name}.yaml").write_text(
            yaml.safe_dump({**doc, "chatTemplate": "tool-args.jinja", **edits}))
        raw = qwen_raw()
        raw["nccl"] = {**raw["nccl"], "rdma": True}
        return _registered(raw, monkeypatch)

    base = variant("base")
    # the serve check in the image (issue 32) runs again on every node whenever what it checks
    # changes: the argv, the chat template, the VLLM_* env; it is vLLM's, not the image's
    checks = {"vllm-serve-check-spark-1", "vllm-serve-check-spark-2"}
    serve = _changed(base, variant("serve", maxNumBatchedTokens=4096, maxModelLen=131072))
    assert serve == {"vllm", "vllm-serve", *checks}, serve  # (a new container ID re-runs its gate)
    template = _changed(base, variant("template", template=OWN_TEMPLATE + "{# edited #}"))
    assert template == {"vllm-serve", *checks}, template  # the text is an upload
    env = _changed(base, variant("env", env={**doc["env"], "VLLM_LOGGING_LEVEL": "DEBUG"}))
    # the nodes' env: the Ray containers and the vLLM container (the head's env is its too)
    assert {"nccl", "ray-head", "ray-worker-spark-2", "vllm-serve", *checks} <= env, env
    assert not {r for r in env if r.startswith(("image", "model"))}, env
    assert "vllm" not in env


@pulumi.runtime.test
def test_the_prod_recipe_fits_the_memory_budget(build, mocks):
    """The recipe's 256k context x 4 sequences at fp8 and 0.7 utilization, through the policy
    pack's memory-fit rule with its defaults and the real model's ~119 GB."""
    import sys

    sys.path.insert(0, str(ROOT / "policies"))
    import rules

    gib = 1024**3
    h = build(raw=qwen_raw())

    def check(_):
        props = {**mocks.named("vllm").inputs, "modelBytes": 119 * 10**9}
        assert props["gpuMemoryUtilization"] == 0.7 and props["maxModelLen"] == 262144
        assert rules.memory_fit_findings(props, 8 * gib, 6 * gib, 4 * gib) == []

    return settled(h).apply(check)


@pulumi.runtime.test
def test_kv_cache_bytes_when_set(build, mocks):
    """The lab's CPU vLLM sizes its KV cache in bytes (vLLM then ignores the utilization)."""
    h = build(2)

    def check(_):
        line = serve_argv(mocks)
        assert line[line.index("--kv-cache-memory-bytes") + 1] == "67108864"
        assert mocks.named("vllm").inputs["kvCacheMemoryBytes"] == 67108864

    return settled(h).apply(check)


@pulumi.runtime.test
def test_optional_flags(build, mocks):
    h = build(2, vllm={"enablePrefixCaching": False, "enforceEager": True, "maxModelLen": None,
                       "maxNumSeqs": None})

    def check(_):
        argv = serve_argv(mocks)
        assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
        assert "--enforce-eager" in argv
        assert "--max-model-len" not in argv and "--max-num-seqs" not in argv
        assert "--speculative-config" not in argv

    return settled(h).apply(check)


@pulumi.runtime.test
def test_api_key_only_as_secret_never_on_a_command_line(build, mocks):
    h = build(2, api_key=API_KEY, hf_token="hf_unit_test_token")

    def check(_):
        for r in mocks.resources:
            blob = json.dumps(
                {k: v for k, v in r.inputs.items() if k not in ("stdin", "connection", "apiKey")},
                default=str,
            )
            assert API_KEY not in blob, f"{r.name} exposes the API key"
            assert "hf_unit_test_token" not in blob, f"{r.name} exposes the HF token"
            assert SSH_KEY not in blob, f"{r.name} exposes the SSH key"
        key_file = mocks.named("vllm-api-key").inputs
        assert is_secret(key_file["stdin"]) and reveal(key_file["stdin"]) == API_KEY
        component = mocks.named("vllm").inputs
        assert is_secret(component["apiKey"]) and reveal(component["apiKey"]) == API_KEY
        fetch = mocks.named("model-fetch").inputs
        assert is_secret(fetch["stdin"]) and reveal(fetch["stdin"]) == "hf_unit_test_token"
        # its stderr is shown (the download's progress: sizes and rates); the token is read
        # from stdin by the payload and printed nowhere (tests/unit/hostscripts/
        # test_snapshot_download.py; the e2e secrets case searches the up's output for it)
        assert fetch["logging"] == "stderr"
        assert "HF_HUB_DISABLE_PROGRESS_BARS=1" in fetch["create"]
        # the key reaches vLLM through a root-only file on the head, mounted read-only into the
        # container and read by the launching shell; no environment value holds it
        serve = mocks.named("vllm-serve").inputs
        assert "VLLM_API_KEY=$(cat /run/spark-vllm/api-key)" in vllm.LAUNCHER
        assert {"target": "/run/spark-vllm/api-key",
                "source": "/var/lib/spark-vllm/stacks/dev/vllm/api-key",
                "type": "bind", "readOnly": True} in serve["mounts"]
        # the head's vLLM declares its port: another stack on the head may not take it
        labels = {x["label"]: x["value"] for x in serve["labels"]}
        assert labels["spark-vllm.port"] == "8000" and "spark-vllm.master-port" not in labels
        assert not any(e.startswith("VLLM_API_KEY=") for e in serve["envs"])
        # ...and vLLM's Ray executor is told not to copy it to the workers' processes
        keep = json.loads(uploads(mocks)[
            "/etc/spark-vllm/vllm-config/ray_non_carry_over_env_vars.json"])
        assert "VLLM_API_KEY" in keep and "NCCL_IB_HCA" in keep, keep
        assert "VLLM_CONFIG_ROOT=/etc/spark-vllm/vllm-config" in serve["envs"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_policy_props_on_vllm_server(build, mocks):
    h = build(3, api_key=None)  # dev without a configured key: the stack makes one

    def check(_):
        props = mocks.named("vllm").inputs
        assert props["environment"] == "dev"
        assert props["tensorParallelSize"] == 3 and props["pipelineParallelSize"] == 1
        assert props["clusterGpus"] == 3
        assert props["gpuMemoryUtilization"] == 0.25  # as Pulumi.dev.yaml sets it for the lab
        assert props["enforceEager"] is True  # as Pulumi.dev.yaml sets it; read by enforce-eager-advisory
        assert props["modelBytes"] == 1234 + 5_000_000 + 4_000_000 + 777
        assert props["nodes"][0] == {
            "name": "spark-1", "memTotalBytes": 125513720 * 1024, "unifiedMemory": True
        }
        # vLLM never serves without a key: the generated one, as a secret
        assert is_secret(props["apiKey"])
        assert mocks.named("secrets-vllm-api-key").inputs["create"].startswith("python3 -c")
        assert mocks.named("image").inputs["ref"] == "10.77.0.1:5000/spark-lab/vllm-spark:lab"
        node = mocks.named("spark-2").inputs
        assert node == {"name": "spark-2", "host": "10.77.0.12", "role": "worker",
                        "hostKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests"}

    return settled(h).apply(check)


@pulumi.runtime.test
def test_model_fetched_once_on_head_and_fanned_out_over_fabric(build, mocks):
    h = build(3)

    def check(_):
        fetch = mocks.named("model-fetch").inputs
        assert reveal(mocks.named("model-fetch").inputs["connection"])["host"] == "10.77.0.11"
        assert "HF_ENDPOINT=http://10.77.0.1:8090" in fetch["create"]
        assert f"spark-lab/tiny-moe {COMMIT}" in fetch["create"]
        assert "snapshot_download" in fetch["create"]
        assert [r.name for r in mocks.resources if "snapshot_download" in str(r.inputs)] == [
            "model-fetch"
        ]
        seed = mocks.named("model-seed").inputs["create"]
        # bound to the head's fabric addresses only (both twins), the cache mounted read-only
        assert ("192.168.177.11,192.168.178.11 18472 /root/.cache/huggingface/hub/" in seed
                and ":ro" in seed)
        for w, host in (("spark-2", 12), ("spark-3", 13)):
            sync = mocks.named(f"model-sync-{w}").inputs
            # the run's token (the seed's stdout) is in it: the whole stdin is a secret
            assert is_secret(sync["stdin"])
            manifest = json.loads(reveal(sync["stdin"]))
            assert manifest["token"] == hashlib.sha256(b"model-seed").hexdigest()  # (mocks)
            # each head twin paired with the worker's own twin in the same subnet
            assert manifest["seeds"] == [
                {"ip": "192.168.177.11", "via": f"192.168.177.{host}"},
                {"ip": "192.168.178.11", "via": f"192.168.178.{host}"},
            ]
            assert manifest["commit"] == COMMIT
            assert len(manifest["files"]) == 4
        verify = mocks.named("model-verify-spark-3").inputs["create"]
        checked = json.loads(verify.split("printf '%s' '", 1)[1].split("' |", 1)[0])
        assert {f["path"]: f["size"] for f in checked["files"]} == {
            "config.json": 1234, "model-00001-of-00002.safetensors": 5_000_000,
            "model-00002-of-00002.safetensors": 4_000_000, "tokenizer/tokenizer.json": 777}
        assert checked["commit"] == COMMIT

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_transport_is_read_after_the_health_gate_and_exported(build, mocks, dependencies):
    h = build(2, nccl={"rdma": True, "debug": "WARN"})

    def check(values):
        (transport,) = values
        assert "vllm-health" in dependencies["vllm-nccl-log"]
        log = mocks.named("vllm-nccl-log").inputs["create"]
        assert "docker logs spark-vllm-dev-serve" in log and "NCCL INFO" in log
        assert "P2P plugin|NET plugin" in log  # the plugin announcements are read too
        text = mocks.named("vllm-transport").inputs["create"]
        # dev: the mock log holds no NCCL lines; with RDMA on a warning, no failure
        assert "nccl transport warning: the NCCL transport cannot be verified" in text
        assert "exit 1" not in text
        assert transport == {"all": "unknown: no NCCL transport lines (nccl.debug is WARN; INFO "
                                    "shows NCCL's choice)"}

    return settled(h, h.vllm.transport).apply(check)


def _staging(**nccl):
    return {"environment": "staging", "nccl": {"rdma": True, "debug": "INFO", **nccl}}


@pulumi.runtime.test
def test_a_strict_rdma_stack_whose_log_shows_no_transport_fails_its_up(build, mocks):
    """Issue 32: a stack that requires RDMA (outside dev) whose vLLM log shows no readable
    transport fails the `up` (the transport check exits 1) with what to do; the real Spark log
    here (tests/fixtures/nccl) holds NCCL lines and none naming the transport."""
    mocks.stdouts["vllm-nccl-log"] = fixture("nccl/vllm-ray-spark-no-transport-lines-eugr.txt")
    h = build(2, **_staging())

    def check(values):
        (transport,) = values
        text = mocks.named("vllm-transport").inputs["create"]
        assert text.rstrip().endswith("exit 1")
        assert ("nccl transport failed: the NCCL transport of spark-1, spark-2 cannot be "
                "established from the vLLM log although nccl.rdma is true") in text
        assert transport == {"all": "unknown: no NCCL transport lines (the log holds no NCCL "
                                    "line that names a network, device or channel)"}

    return settled(h, h.vllm.transport).apply(check)


@pulumi.runtime.test
def test_a_strict_rdma_stack_seeing_one_node_only_fails_naming_the_other(build, mocks):
    """The real two-Spark IBext_v10 log shows the worker only: the head is not proven."""
    worker = fixture("nccl/vllm-ray-ibext-v10-two-sparks-mark-ramsey.txt").replace(
        "169.254.28.198", "192.168.177.12")
    mocks.stdouts["vllm-nccl-log"] = worker
    h = build(2, **_staging())

    def check(values):
        (transport,) = values
        text = mocks.named("vllm-transport").inputs["create"]
        assert "nccl transport failed: spark-1: no NCCL transport line from this node" in text
        assert "spark-2" not in text.split("failed:", 1)[1].split("(lines seen from")[0]
        assert transport["spark-2"].startswith("192.168.177.12: IB (IBext_v10) "
                                               "devices=rocep1s0f1,roceP2p1s0f1 gdr=on")

    return settled(h, h.vllm.transport).apply(check)


@pulumi.runtime.test
def test_a_strict_rdma_stack_seeing_ib_on_both_nodes_passes(build, mocks):
    head = ("(EngineCore_DP0 pid=2301) spark-1:2301:2301 [0] NCCL INFO NET/IB : Made virtual "
            "device [0] name=rocep1s0f1 speed=200000 ndevs=1\n")
    mocks.stdouts["vllm-nccl-log"] = head + fixture(
        "nccl/vllm-ray-ibext-v10-two-sparks-mark-ramsey.txt").replace("169.254.28.198",
                                                                       "192.168.177.12")
    h = build(2, **_staging())

    def check(values):
        (transport,) = values
        text = mocks.named("vllm-transport").inputs["create"]
        assert "exit 1" not in text and "warning" not in text
        assert set(transport) == {"spark-1", "spark-2"}

    return settled(h, h.vllm.transport).apply(check)


@pulumi.runtime.test
def test_the_lab_dev_stack_on_sockets_still_passes(build, mocks):
    """The lab's dev stack (rdma false, Socket by design): a Socket log is no finding."""
    mocks.stdouts["vllm-nccl-log"] = fixture("nccl/nccl-no-ib-device-socket-2.19.3.txt")
    h = build(2, nccl={"rdma": False, "debug": "INFO"})

    def check(values):
        (transport,) = values
        text = mocks.named("vllm-transport").inputs["create"]
        assert "exit 1" not in text and "warning" not in text
        assert transport["spark-1"].startswith("192.168.177.11: Socket TCP FALLBACK (NET/IB: no "
                                               "device found) ifs=ens7:10.128.0.32")

    return settled(h, h.vllm.transport).apply(check)


@pulumi.runtime.test
def test_with_mp_only_the_heads_transport_is_required(build, mocks):
    mocks.stdouts["vllm-nccl-log"] = ("spark-1:1:2 [0] NCCL INFO NET/IB : Using "
                                      "[0]rocep1s0f1:1/RoCE [RO]; OOB "
                                      "enp1s0f1np1:192.168.177.11<0>\n")
    h = build(2, vllm={"executor": "mp"}, **_staging())

    def check(values):
        text = mocks.named("vllm-transport").inputs["create"]
        assert "exit 1" not in text, text

    return settled(h, h.vllm.transport).apply(check)


@pulumi.runtime.test
def test_mtp_drafter_is_pinned_to_the_served_commit_offline(build, mocks):
    """Issue 16: vLLM gives the drafter the speculative config's own `revision` (default None),
    not `--revision`. With a pinned commit the fetch writes no refs/main, so the drafter must be
    told the commit or it finds nothing offline (prod after a promotion)."""
    h = build(2, model={"revision": COMMIT},
              vllm={"speculativeConfig": {"method": "mtp", "num_speculative_tokens": 1}})

    def check(_):
        argv = serve_argv(mocks)
        assert argv[argv.index("--revision") + 1] == COMMIT
        spec = argv[argv.index("--speculative-config") + 1]
        assert spec == ('{"method":"mtp","num_speculative_tokens":1,'
                        f'"revision":"{COMMIT}"}}')
        # the cache layout the drafter meets: the commit's snapshot, no refs/main written
        fetch = mocks.named("model-fetch").inputs["create"]
        assert f"spark-lab/tiny-moe {COMMIT}" in fetch and "refs/main" not in fetch

    return settled(h).apply(check)


def test_drafter_pinning_by_method():
    from hostscripts.vllm import pinned_speculative_config as pin

    c = "c" * 40
    assert pin({"method": "mtp", "num_speculative_tokens": 2}, "org/m", c)["revision"] == c
    assert pin({"method": "draft_model", "model": "org/m"}, "org/m", c)["revision"] == c
    assert pin({"model": "org/m"}, "org/m", c)["revision"] == c  # auto-detected draft_model
    assert "revision" not in pin({"method": "ngram", "prompt_lookup_max": 3}, "org/m", c)
    assert "revision" not in pin({"method": "suffix"}, "org/m", c)


# ------------------------------------------------ memory-fit's numbers (inspection/memory_fit.py)

STAGING_VLLM = {"maxModelLen": 65536, "maxNumSeqs": 4, "kvCacheDtype": "fp8",
                "kvCacheMemoryBytes": None, "gpuMemoryUtilization": 0.8,
                "speculativeConfig": {"method": "mtp", "num_speculative_tokens": 1}}


@pulumi.runtime.test
def test_memory_fit_props_for_the_122b_with_the_staging_settings(build, mocks):
    """The VllmServer carries the estimate the policy pack adds up: KV from the 122B's config.json
    (tests/unit/inspection/model_configs.py) x 65536 tokens x 4 sequences at fp8, with MTP."""
    h = build(2, model={"repo": "Qwen/Qwen3.5-122B-A10B-FP8"}, vllm=STAGING_VLLM)

    def check(_):
        props = mocks.named("vllm").inputs
        assert props["maxNumSeqs"] == 4 and "kvCacheMemoryBytes" not in props
        fit = props["memoryFit"]
        assert fit["kvBytesPerTokenPerRank"] == 6656  # 13 KV layers x 2 x 1 head x 256 x 1 B
        assert fit["kvCacheBytesPerRank"] == 1_744_830_464  # 1.625 GiB
        assert fit["stateBytesPerRank"] == 927_203_328  # 4 x 221.1 MiB of Gated DeltaNet state
        assert fit["oneSequenceBytesPerRank"] == 6656 * 65536 + 231_800_832
        assert fit["weightsBytesPerRank"] == (1234 + 5_000_000 + 4_000_000 + 777) // 2
        assert (fit["maxModelLen"], fit["maxNumSeqs"], fit["kvCacheDtype"]) == (65536, 4, "fp8")
        assert fit["basis"].startswith("13 KV layers (incl. MTP) x 1 of 2 KV heads x 256 x 1 B")

    return settled(h).apply(check)


@pulumi.runtime.test
def test_memory_fit_props_for_the_labs_tiny_model(build, mocks):
    h = build(2)  # Pulumi.dev.yaml: spark-lab/tiny-moe, 2048 tokens x 4, auto, 64 MiB KV

    def check(_):
        props = mocks.named("vllm").inputs
        assert props["kvCacheMemoryBytes"] == 67108864
        fit = props["memoryFit"]
        assert fit["kvBytesPerTokenPerRank"] == 768  # 2 layers x 2 x 3 of 6 heads x 32 x 2 B
        assert fit["kvCacheBytesPerRank"] == 768 * 2048 * 4
        assert fit["stateBytesPerRank"] == 0

    return settled(h).apply(check)


@pulumi.runtime.test
def test_memory_fit_props_say_why_when_the_config_was_not_read(build, mocks):
    h = build(2, model={"repo": "org/unknown-model"})

    def check(_):
        fit = mocks.named("vllm").inputs["memoryFit"]
        assert fit.get("kvCacheBytesPerRank") is None
        assert fit["basis"] == "model shape unknown: the model's config.json was not read"

    return settled(h).apply(check)


def _memory_fit_rule():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "policies"))
    import rules

    gib = 1024**3
    # the pack's defaults: osReserveBytes, runtimeOverheadBytes, kvMinBytes
    return lambda props: rules.memory_fit_findings(props, 8 * gib, 6 * gib, 4 * gib)


@pulumi.runtime.test
def test_the_policy_pack_passes_the_122b_with_the_staging_settings(build, mocks):
    """End to end without the CLI: the registered props through the memory-fit rule, with the
    real model's ~119 GB in place of the fixture's 9 MB."""
    rule = _memory_fit_rule()
    h = build(2, model={"repo": "Qwen/Qwen3.5-122B-A10B-FP8"}, vllm=STAGING_VLLM)

    def check(_):
        props = {**mocks.named("vllm").inputs, "modelBytes": 119 * 10**9}
        assert rule(props) == []  # 55.4 + 6 + max(4, 2.5) GiB within 0.8 x 119.7 GiB

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_policy_pack_refuses_a_kv_cache_that_cannot_fit(build, mocks):
    rule = _memory_fit_rule()
    big = {**STAGING_VLLM, "maxModelLen": 262144, "maxNumSeqs": 64}
    h = build(2, model={"repo": "Qwen/Qwen3.5-122B-A10B-FP8"}, vllm=big)

    def check(_):
        props = {**mocks.named("vllm").inputs, "modelBytes": 119 * 10**9}
        msgs = rule(props)
        assert len(msgs) == 2 and msgs[0].startswith(
            "node spark-1: weights per GPU 55.4 GiB (modelBytes 110.8 GiB / (tp 2 x pp 1)) + "
            "runtime overhead 6.0 GiB + KV cache 117.8 GiB for 64 x 262144 tokens at fp8 (13 KV "
            "layers (incl. MTP)")
        assert msgs[0].endswith("= 179.2 GiB exceeds the vLLM budget 95.8 GiB "
                                "(gpuMemoryUtilization 0.80 x memTotal 119.7 GiB); short by "
                                "83.5 GiB")

    return settled(h).apply(check)


def _request(mocks, node: str) -> dict:
    """The serve check's request on `node` (the JSON after the payload in its command)."""
    import shlex

    create = mocks.named(f"vllm-serve-check-{node}").inputs["create"]
    words = shlex.split(create.split("\n", 1)[1])
    assert words[:2] == ["docker", "run"] and "--network" in words and "none" in words
    return json.loads(words[-1])


@pulumi.runtime.test
def test_the_serve_command_is_checked_in_the_image_on_every_node_before_vllm(
        build, mocks, dependencies):
    """Issue 32, item 5: the exact argv and every VLLM_* variable of the prod recipe go
    through the serving image's own vLLM on every node; the vLLM container waits for every
    check, so a rejected flag or unknown variable fails the `up` with the old one serving."""
    raw = qwen_raw()
    raw["nccl"] = {**raw["nccl"], "extraEnv": {"VLLM_LOGGING_LEVEL": "DEBUG"}}
    h = build(raw={**raw, "environment": "staging"})

    def check(values):
        argv, serve_check = values
        for node in ("spark-1", "spark-2"):
            r = _request(mocks, node)
            assert r["argv"] == argv[2:]  # the exact words after `vllm serve` (Ray: the head's)
            assert r["strict"] is True and r["timeout"] == 300
            assert r["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG"  # the stack file's
            assert all(k.startswith("VLLM_") for k in r["env"])
            assert f"vllm-serve-check-{node}" in dependencies["vllm-serve"]
            assert mocks.named(f"vllm-serve-check-{node}").inputs["create"].count(
                "--label spark-vllm.role=serve-check") == 1
            # vLLM's engine arguments resolve the served snapshot offline: the node's model
            # cache's hub/ (never its token), read-only, after the model is in place
            assert ("-v /root/.cache/huggingface/hub:/root/.cache/huggingface/hub:ro -e "
                    "HF_HOME=/root/.cache/huggingface -e HF_HUB_OFFLINE=1 --entrypoint"
                    in mocks.named(f"vllm-serve-check-{node}").inputs["create"])
            assert {"model-verify-spark-1", "model-verify-spark-2"} <= dependencies[
                f"vllm-serve-check-{node}"]
        assert _request(mocks, "spark-1")["env"]["VLLM_CONFIG_ROOT"] == "/etc/spark-vllm/vllm-config"
        assert "VLLM_CONFIG_ROOT" not in _request(mocks, "spark-2")["env"]
        # the mock's stdout is no probe answer: the output says so, never "accepted"
        assert all(line.startswith("unreadable:") for line in serve_check.values())

    return settled(h, h.vllm.argv, h.vllm.serve_check).apply(check)


@pulumi.runtime.test
def test_dev_checks_too_but_only_a_rejected_flag_or_value_stops_it(build, mocks):
    h = build(2)

    def check(_):
        assert _request(mocks, "spark-1")["strict"] is False

    return settled(h).apply(check)


@pulumi.runtime.test
def test_with_mp_each_node_checks_its_own_argv(build, mocks):
    h = build(2, vllm={"executor": "mp"})

    def check(_):
        head, worker = _request(mocks, "spark-1")["argv"], _request(mocks, "spark-2")["argv"]
        assert "--headless" in worker and "--headless" not in head
        assert worker[worker.index("--node-rank") + 1] == "1"

    return settled(h).apply(check)


PROBE = {"libibverbs": True, "python": "3.12.3", "ray": "2.60.0", "torch": "2.13.0",
         "torchCuda": "13.0", "vllm": "0.32.0", "fastsafetensors": "0.1.15"}


@pytest.mark.parametrize(("environment", "cluster", "fails"), [
    ("prod", False, True), ("prod", None, True), ("prod", True, False),
    ("staging", False, False),
])
def test_fastsafetensors_across_nodes_is_an_error_in_prod_unless_the_loader_handles_it(
        build, mocks, environment, cluster, fails):
    """Issue 32, item 6: the stock loader uses torch's WORLD group (the known multi-node
    failure); in prod that stops the `up` before Ray starts unless the probe shows the
    patched loader; elsewhere it warns."""
    answer = json.dumps({**PROBE, "fastsafetensorsCluster": cluster})
    for node in ("spark-1", "spark-2"):
        mocks.stdouts[f"image-probe-{node}"] = answer
    raw = qwen_raw()  # the recipe's loadFormat fastsafetensors
    raw["environment"] = environment
    if environment == "prod":
        raw["nccl"] = {**raw["nccl"], "rdma": True}
        raw["image"] = {"ref": "registry.example:5000/vllm@sha256:" + "a" * 64,
                        "plainHttpRegistry": False}
        raw["model"] = {**raw["model"], "revision": COMMIT}
        raw["gateway"] = {"image": {"ref": "registry.example:5000/haproxy@sha256:" + "b" * 64}}
        raw["monitoring"] = monitoring_pinned(raw["monitoring"])

    @pulumi.runtime.test
    def body():
        h = build(raw=raw)

        def check(_):
            text = mocks.named("image-check").inputs["create"]
            assert ("exit 1" in text) is fails, text
            assert "fastsafetensors across 2 nodes" in text or cluster is True
            if fails:
                assert "image check failed: spark-1: loadFormat fastsafetensors" in text
            elif cluster is not True:
                assert "image check warning: spark-1: loadFormat fastsafetensors" in text

        return settled(h).apply(check)

    body()


# ---------------------------------------------------------------------- issue 44 and 46
@pulumi.runtime.test
def test_the_serve_check_judges_extra_args_and_declared_variables_in_the_image(build, mocks):
    """The request tells the image's check which tokens are extraArgs and which destinations
    they may not set (config/serve.py OWNED_FLAGS and FORBIDDEN_FLAGS: the image resolves the
    option strings to its own parser's destinations), and which VLLM_* names the stack file or
    recipe declared (an unknown one fails the `up` in dev too)."""
    from config.serve import FORBIDDEN_FLAGS, OWNED_FLAGS

    raw = config_raw(2)
    raw["vllm"] = {**raw["vllm"], "extraArgs": ["--cudagraph-capture-sizes", "1", "2", "4"]}
    raw["nccl"] = {**raw["nccl"], "extraEnv": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
                                               "OMP_NUM_THREADS": "4"}}
    h = build(raw=raw)

    def check(values):
        (argv,) = values
        for node in ("spark-1", "spark-2"):
            r = _request(mocks, node)
            assert r["extraArgs"] == ["--cudagraph-capture-sizes", "1", "2", "4"]
            assert r["argv"][-4:] == r["extraArgs"] == argv[-4:]
            assert r["owned"] == OWNED_FLAGS and r["forbidden"] == FORBIDDEN_FLAGS
            # the recipe's VLLM_LOGGING_LEVEL and the stack file's own, VLLM_* only
            assert r["declaredEnv"] == ["VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_LOGGING_LEVEL"]

    return settled(h, h.vllm.argv).apply(check)


@pulumi.runtime.test
def test_remote_code_runs_only_pinned_and_is_shown_to_the_policy_pack(build, mocks):
    raw = config_raw(2)
    raw["model"] = {**raw["model"], "revision": COMMIT}
    raw["vllm"] = {**raw["vllm"], "trustRemoteCode": True}
    h = build(raw=raw)

    def check(values):
        (argv,) = values
        assert "--trust-remote-code" in argv
        props = mocks.named("vllm").inputs
        assert props["trustRemoteCode"] is True
        assert props["remoteCode"] == [{"repo": "spark-lab/tiny-moe", "commit": COMMIT}]

    return settled(h, h.vllm.argv).apply(check)


@pulumi.runtime.test
def test_without_remote_code_the_props_say_nothing_of_it(build, mocks):
    h = build(2)

    def check(_):
        assert "trustRemoteCode" not in mocks.named("vllm").inputs

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_plugin_of_the_model_repo_is_read_from_the_served_snapshot(build, monkeypatch):
    """reasoningParserPlugin: a file of the served repo at the served commit, where the stack
    put it (the HF cache, read-only in the container); a file the commit does not hold stops
    the program before any resource, naming the key."""
    from hostscripts.vllm import model_file
    from tests.unit import conftest as unit

    raw = config_raw(2)
    raw["model"] = {**raw["model"], "revision": COMMIT}
    raw["vllm"] = {**raw["vllm"], "trustRemoteCode": True,
                   "reasoningParserPlugin": "nano_v3_reasoning_parser.py"}
    with pytest.raises(ValueError, match=r"spark-vllm:vllm.reasoningParserPlugin: got "
                                         r"'nano_v3_reasoning_parser.py'; expected a file of "
                                         r"spark-lab/tiny-moe at 0123456789"):
        build(raw=raw)
    monkeypatch.setattr(unit, "MODEL_FILES", (*unit.MODEL_FILES, ModelFile(
        path="nano_v3_reasoning_parser.py", size=5000, etag="e" * 40)))
    h = build(raw=raw)
    path = model_file("spark-lab/tiny-moe", COMMIT, "nano_v3_reasoning_parser.py")
    assert path == ("/root/.cache/huggingface/hub/models--spark-lab--tiny-moe/snapshots/"
                    f"{COMMIT}/nano_v3_reasoning_parser.py")

    def check(values):
        (argv,) = values
        assert argv[argv.index("--reasoning-parser-plugin") + 1] == path

    return settled(h, h.vllm.argv).apply(check)
