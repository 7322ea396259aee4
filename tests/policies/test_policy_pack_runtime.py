"""The pack as the analyzer runs it: pulumi_policy's own servicer (no gRPC server, no CLI), the
engine's wire form of secrets and unknowns, the pack module itself, and the e2e data file."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import yaml
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_BOOLEAN_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_STRING_VALUE,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_testkit import (
    POLICIES_DIR,
    RAY_CONFIG,
    nccl_env,
    rargs,
    ray_head,
    res,
    run,
    sargs,
    secret,
    vllm_server,
)

import rules
from rules import CONTAINER, NCCL_ENV, VLLM_IMAGE, VLLM_SERVER

HERE = Path(__file__).resolve().parent
ALL_NAMES = {p.name for p in rules.POLICIES}


def servicer():
    return _PolicyAnalyzerServicer("spark-vllm", "0.1.0", list(rules.POLICIES),
                                   EnforcementLevel.MANDATORY)


def struct(props: dict) -> struct_pb2.Struct:
    return json_format.ParseDict(props, struct_pb2.Struct())


def analyze(rtype: str, props: dict):
    req = proto.AnalyzeRequest(type=rtype, urn=f"urn:pulumi:dev::p::{rtype}::r", name="r",
                               properties=struct(props))
    return list(servicer().Analyze(req, None).diagnostics)


def analyze_stack(resources: list[tuple[str, str, dict]]):
    req = proto.AnalyzeStackRequest(resources=[
        proto.AnalyzerResource(type=t, urn=f"urn:pulumi:dev::p::{t}::{n}", name=n,
                               properties=struct(p)) for t, n, p in resources])
    return list(servicer().AnalyzeStack(req, None).diagnostics)


# ------------------------------------------------------------------ secrets in pulumi_policy
def test_secrets_arrive_unwrapped_in_validate():
    """Analyze deserializes with proxy_secrets=False: a secret is its plain value in `props`."""
    seen = {}
    args = rargs(VLLM_SERVER, {"apiKey": secret("sk-1"), "envs": [secret("HF_TOKEN=hf_x")]})
    seen["apiKey"], seen["env0"] = args.props["apiKey"], args.props["envs"][0]
    assert seen == {"apiKey": "sk-1", "env0": "HF_TOKEN=hf_x"}


def test_secret_api_key_through_the_servicer_satisfies_vllm_api_key():
    with_key = vllm_server(environment="staging")
    without = vllm_server(environment="staging")
    del without["apiKey"]
    ok = analyze_stack([(VLLM_SERVER, "vllm", with_key)])
    bad = analyze_stack([(VLLM_SERVER, "vllm", without)])
    assert [d for d in ok if d.policyName == "vllm-api-key"] == []
    msgs = [d.message for d in bad if d.policyName == "vllm-api-key"]
    assert len(msgs) == 1 and "environment 'staging': vLLM serves without an API key" in msgs[0]
    assert [d.enforcementLevel for d in bad if d.policyName == "vllm-api-key"] == [proto.MANDATORY]


# -------------------------------------------------------------------- unknowns during preview
def test_an_unknown_memory_fit_falls_back_to_the_kv_floor():
    """During a first preview `memoryFit` (an apply on the commit) may be unknown, wholly or in
    part: the rule counts kvMinBytes then, and never crashes."""
    from pulumi_policy.proxy import UNKNOWN_OBJECT_VALUE

    for fit in (UNKNOWN_OBJECT_VALUE, {"kvCacheBytesPerRank": UNKNOWN_NUMBER_VALUE,
                                       "basis": UNKNOWN_STRING_VALUE}):
        props = vllm_server(memoryFit=fit, kvCacheMemoryBytes=UNKNOWN_NUMBER_VALUE)
        assert run(rules.memory_fit, rargs(VLLM_SERVER, props)) == []
        msgs = run(rules.memory_fit, rargs(VLLM_SERVER, props, config={"kvMinBytes": 40 * 2**30}))
        assert msgs and "minimum KV cache 40.0 GiB (kvMinBytes)" in msgs[0]


def test_unknowns_skip_checks_in_hand_built_args():
    props = vllm_server(modelBytes=UNKNOWN_NUMBER_VALUE, gpuMemoryUtilization=0.95,
                        apiKey=UNKNOWN_STRING_VALUE, enforceEager=UNKNOWN_BOOLEAN_VALUE,
                        nodes=UNKNOWN_ARRAY_VALUE)
    for policy in (rules.memory_fit, rules.parallelism_matches_gpus,
                   rules.gpu_memory_utilization_advisory, rules.enforce_eager_advisory):
        assert run(policy, rargs(VLLM_SERVER, props)) == [], policy.name
    assert run(rules.vllm_api_key, sargs([res(VLLM_SERVER, props, "vllm")])) == []
    nccl = nccl_env()
    nccl["nodes"][0]["env"]["NCCL_IB_HCA"] = UNKNOWN_STRING_VALUE
    nccl["nodes"][1]["fabric"] = UNKNOWN_ARRAY_VALUE
    assert run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, nccl)) == []
    assert run(rules.fabric_mtu, rargs(NCCL_ENV, nccl_env(rdma=UNKNOWN_BOOLEAN_VALUE))) == []
    head = ray_head(command=UNKNOWN_ARRAY_VALUE, privileged=UNKNOWN_BOOLEAN_VALUE,
                    image=UNKNOWN_STRING_VALUE, labels=UNKNOWN_ARRAY_VALUE)
    assert run(rules.no_privileged_containers, rargs(CONTAINER, head)) == []
    for policy in (rules.ray_not_exposed, rules.same_image_everywhere, rules.hf_token_secret,
                   rules.prod_pinned):
        stack = [res(CONTAINER, head, "h"), res(VLLM_SERVER, props, "vllm"),
                 res(VLLM_IMAGE, {"ref": UNKNOWN_STRING_VALUE,
                                  "imageIds": {"spark-1": UNKNOWN_STRING_VALUE}}, "img")]
        assert run(policy, sargs(stack, RAY_CONFIG)) == [], policy.name


def test_unknowns_through_the_servicer_give_no_cant_run_diagnostics():
    """The servicer turns an escaped UnknownValueError into an advisory "can't run policy ...
    during preview". Our rules catch unknowns themselves, so none appears, and the checks that
    can still be judged do report."""
    props = vllm_server(modelBytes=UNKNOWN_NUMBER_VALUE, tensorParallelSize=2,
                        pipelineParallelSize=2, apiKey=UNKNOWN_STRING_VALUE)
    diags = analyze(VLLM_SERVER, props)
    assert not any("can't run policy" in d.message for d in diags), diags
    assert [d.policyName for d in diags] == ["parallelism-matches-gpus"]
    stack = analyze_stack([
        (VLLM_SERVER, "vllm", props),
        (CONTAINER, "h", ray_head(command=UNKNOWN_ARRAY_VALUE, image=UNKNOWN_STRING_VALUE)),
    ])
    assert not any("can't run policy" in d.message for d in stack), stack


def test_every_policy_survives_an_all_unknown_resource():
    sentinel_props = {k: UNKNOWN_STRING_VALUE for k in (
        "environment", "tensorParallelSize", "nodes", "apiKey", "rdma", "command", "envs",
        "labels", "ports", "capabilities", "privileged", "image", "ref", "imageIds", "host",
        "hostKey", "revision", "create", "ncclBuilds")}
    for t in (VLLM_SERVER, NCCL_ENV, CONTAINER, VLLM_IMAGE, "command:remote:Command",
              rules.SPARK_NODE, rules.MODEL_CACHE, rules.COLLECTIVE_GATE):
        diags = analyze(t, sentinel_props) + analyze_stack([(t, "x", sentinel_props)])
        assert not any("can't run policy" in d.message for d in diags), (t, diags)


# -------------------------------------------------------------------------- the pack module
def contract_only_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a pack process as policies/venv gives it: contract/ importable (make
    venv installs it there), the program not (a folder holding only a link to contract/)."""
    import os
    (tmp_path / "contract").symlink_to(POLICIES_DIR.parent / "contract")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_importing_rules_starts_no_server(tmp_path):
    code = (f"import sys, threading; sys.path.insert(0, {str(POLICIES_DIR)!r}); import rules; "
            "assert threading.active_count() == 1, threading.enumerate(); print(len(rules.POLICIES))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=contract_only_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "20"


def test_main_lists_all_twenty_policies():
    tree = ast.parse((POLICIES_DIR / "__main__.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "PolicyPack"]
    assert len(calls) == 1
    policies = next(k.value for k in calls[0].keywords if k.arg == "policies")
    assert getattr(policies, "id", None) == "POLICIES"  # the list rules.py holds, not a copy
    imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "rules"
                for a in n.names}
    assert "POLICIES" in imported
    names = [p.name for p in rules.POLICIES]
    assert set(names) == ALL_NAMES and len(names) == 20
    # __main__ does nothing but build the pack: imports + one expression statement
    kinds = {type(n).__name__ for n in tree.body}
    assert kinds <= {"Expr", "ImportFrom", "Import"}


def test_pack_files():
    meta = yaml.safe_load((POLICIES_DIR / "PulumiPolicy.yaml").read_text())
    assert meta["runtime"] == {"name": "python", "options": {"virtualenv": "venv"}}
    reqs = [line.strip() for line in (POLICIES_DIR / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert reqs == ["pulumi-policy==1.21.0", "pulumi==3.272.0", "setuptools==80.9.0"]


def test_sample_pack_configs_match_the_schemas():
    import json
    for name in ("config.dev.json", "config.prod.json"):
        cfg = json.loads((POLICIES_DIR / name).read_text())
        for policy_name, value in cfg.items():
            assert policy_name in ALL_NAMES | {"all"}, (name, policy_name)
            if isinstance(value, dict):
                policy = rules.BY_NAME[policy_name]
                schema = policy.config_schema.properties if policy.config_schema else {}
                unknown = set(value) - set(schema) - {"enforcementLevel"}
                assert not unknown, (name, policy_name, unknown)


def test_dev_pack_config_accepts_the_dev_stack_on_the_lab():
    """The lab's nodes report this machine's memory (about 24 GiB; 16 GiB machines too) as GB10
    unified memory: the dev pack config must pass the dev stack's own utilization there (with the
    default 8 GiB reserve, 0.80 x 24 GiB leaves 4.7 GiB and memory-fit failed every dev preview),
    and still refuse a utilization that leaves the OS nothing."""
    import json
    cfg = json.loads((POLICIES_DIR / "config.dev.json").read_text())["memory-fit"]
    util = yaml.safe_load((POLICIES_DIR.parent / "Pulumi.dev.yaml").read_text())[
        "config"]["spark-vllm:vllm"]["gpuMemoryUtilization"]
    args = (cfg["osReserveBytes"], cfg["runtimeOverheadBytes"], cfg["kvMinBytes"])
    for gib_total in (16, 24, 128):
        node = {"name": "spark-1", "memTotalBytes": gib_total * 2**30, "unifiedMemory": True}
        props = {"gpuMemoryUtilization": util, "tensorParallelSize": 2, "pipelineParallelSize": 1,
                 "modelBytes": 600_000, "nodes": [node]}
        assert rules.memory_fit_findings(props, *args) == [], gib_total
        assert rules.memory_fit_findings({**props, "gpuMemoryUtilization": 0.99}, *args), gib_total


# ------------------------------------------------------------------ e2e data file (rules 1, 7)
def test_breaking_stack_data_file_is_well_formed():
    doc = yaml.safe_load((HERE / "stack_breaking_rules_1_7.yaml").read_text())
    assert set(doc["expectViolations"]) == {"memory-fit"}
    assert set(doc["expectViolations"]) <= ALL_NAMES
    cfg = doc["stackConfig"]["config"]
    assert cfg["spark-vllm:environment"] == "dev"
    # too little for runtime overhead + KV (a value near 1 is refused by preflight itself)
    assert cfg["spark-vllm:vllm"]["gpuMemoryUtilization"] <= 0.05
    # no fabric interface on a management address: preflight refuses that before the pack
    # (issue 33), so rule 7's former break is not in this file any more
    for node in cfg["spark-vllm:nodes"]:
        assert all(f["ip"] != node["host"] and f["interface"] != "enP7s7"
                   for f in node["fabric"]), node
    for policy_name in doc["policyPackConfig"]:
        assert policy_name in ALL_NAMES


def test_stack_config_fallbacks(monkeypatch):
    """Under the engine the pack sees the stack config in PULUMI_CONFIG (object values as JSON
    strings): nccl.fabricSubnets and environment are used when pack config does not say."""
    import json
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({
        "spark-vllm:environment": "prod",
        "spark-vllm:nccl": json.dumps({"fabricSubnets": ["192.168.177.0/24"]}),
    }))
    head = ray_head(command=["ray", "start", "--head", "--dashboard-host=192.168.200.5"])
    msgs = run(rules.ray_not_exposed, sargs([res(CONTAINER, head, "w")]))
    assert msgs == ["container w: the Ray dashboard listens on --dashboard-host 192.168.200.5 (not "
                    "a fabric address); disable it (--include-dashboard=false) or bind 127.0.0.1 "
                    "or the fabric address"]
    inside = ray_head(command=["ray", "start", "--head", "--dashboard-host=192.168.177.5"])
    assert run(rules.ray_not_exposed, sargs([res(CONTAINER, inside, "w")])) == []
    img = res(VLLM_IMAGE, {"ref": "vllm-spark:latest", "imageIds": {}}, "img")
    assert any("not pinned by digest" in m for m in run(rules.prod_pinned, sargs([img])))


def test_analyzer_info_serializes_every_schema():
    info = servicer().GetAnalyzerInfo(None, None)
    policies = {p.name: p for p in info.policies}
    assert set(policies) == ALL_NAMES
    assert policies["fabric-mtu"].configSchema.properties["minMtu"]["default"] == 9000
    assert policies["enforce-eager-advisory"].enforcementLevel == proto.ADVISORY
    assert policies["memory-fit"].enforcementLevel == proto.MANDATORY


def test_pack_serves_over_grpc_like_the_engine_starts_it(tmp_path):
    """`python -m pulumi.policy <engine> <packdir>` is what pulumi-analyzer-policy-python runs:
    start it, ask for the analyzer info and one analysis over gRPC, stop it."""
    import grpc
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import analyzer_pb2_grpc

    proc = subprocess.Popen([sys.executable, "-m", "pulumi.policy", "127.0.0.1:1", "."],
                            cwd=POLICIES_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=contract_only_env(tmp_path))
    try:
        port = proc.stdout.readline().strip()
        assert port.isdigit(), proc.stderr.read() if proc.poll() is not None else port
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = analyzer_pb2_grpc.AnalyzerStub(channel)
            info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
            assert {p.name for p in info.policies} == ALL_NAMES
            req = proto.AnalyzeRequest(type=VLLM_SERVER, urn="urn:pulumi:dev::p::x::vllm",
                                       name="vllm", properties=struct(vllm_server(
                                           tensorParallelSize=1)))
            diags = stub.Analyze(req, timeout=30).diagnostics
            assert {d.policyName for d in diags} == {"memory-fit", "parallelism-matches-gpus"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


# ------------------------------------------------- secrets in env values, in the engine's wire form
def test_secret_env_values_are_reported_through_the_servicer():
    """nccl.extraEnv reaches the NcclEnvironment's nodes[].env and every Ray container's envs; a
    token there is reported by the secret rules, naming resource and key, masked, whether the
    engine sends the value marked secret or not."""
    token, key = "hf_" + "a1B2c3D4" * 4 + "xy", "sk-" + "0123456789abcdefghij"
    nccl = nccl_env()
    nccl["nodes"][0]["env"]["HF_TOKEN"] = secret(token)
    nccl["nodes"][1]["env"]["MY_KEY"] = key
    head = ray_head(envs=["NCCL_DEBUG=WARN", secret(f"VLLM_API_KEY={key}"), f"X={token}"])
    cmd = {"create": "true", "environment": {"HF_TOKEN": secret(token)}}
    diags = analyze_stack([(NCCL_ENV, "nccl", nccl), (CONTAINER, "ray-head", head),
                           ("command:remote:Command", "fetch", cmd)])
    by_rule: dict[str, list[str]] = {}
    for d in diags:
        by_rule.setdefault(d.policyName, []).append(d.message)
        assert token not in d.message and key not in d.message, d.message
    hf, api = by_rule.get("hf-token-secret", []), by_rule.get("vllm-api-key", [])
    assert any("NcclEnvironment nccl: node spark-1 env HF_TOKEN carries the HF token (hf_*** "
               "37 chars)" in m for m in hf), hf
    assert any("container ray-head: env X carries the HF token" in m for m in hf), hf
    assert any("command fetch: environment HF_TOKEN carries the HF token" in m for m in hf), hf
    assert any("NcclEnvironment nccl: node spark-2 env MY_KEY carries an API key (sk-*** 23 chars)"
               in m for m in api), api
    assert any("container ray-head: env VLLM_API_KEY carries an API key" in m for m in api), api
    assert all(d.enforcementLevel == proto.MANDATORY for d in diags
               if d.policyName in ("hf-token-secret", "vllm-api-key"))
