"""Helpers to drive the policy rules the way the analyzer does, without the CLI.

Props go through pulumi_policy's own `deserialize_properties` + `unknown_checking_proxy`, exactly as
`_PolicyAnalyzerServicer.Analyze/AnalyzeStack` prepare them, so secrets arrive unwrapped and
unknown sentinels raise on access just like in a real preview.
"""
from __future__ import annotations

import asyncio
import copy
import sys
from inspect import isawaitable
from pathlib import Path

from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.deserialize import SPECIAL_SECRET_SIG, SPECIAL_SIG_KEY, deserialize_properties
from pulumi_policy.proxy import unknown_checking_proxy

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
if str(POLICIES_DIR) not in sys.path:
    sys.path.insert(0, str(POLICIES_DIR))

GIB = 1024 ** 3


def secret(value):
    """The wire form of a secret, as the engine sends it (MarshalOptions{KeepSecrets: true})."""
    return {SPECIAL_SIG_KEY: SPECIAL_SECRET_SIG, "value": value}


def engine_props(props: dict):
    return unknown_checking_proxy(deserialize_properties(copy.deepcopy(props)))


def opts(additional_secret_outputs=None):
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0),
                                 list(additional_secret_outputs or []), None)


def urn(rtype: str, name: str) -> str:
    return f"urn:pulumi:dev::spark-vllm::{rtype}::{name}"


def rargs(rtype: str, props: dict, name: str = "r", config=None, **kw) -> ResourceValidationArgs:
    return ResourceValidationArgs(rtype, engine_props(props), urn(rtype, name), name,
                                  kw.get("opts") or opts(), kw.get("provider"), config)


def res(rtype: str, props: dict, name: str = "r", aso=None, provider_host=None) -> PolicyResource:
    provider = None
    if provider_host:
        provider = PolicyProviderResource("pulumi:providers:docker",
                                          engine_props({"host": provider_host}),
                                          urn("pulumi:providers:docker", f"{name}-p"), f"{name}-p")
    return PolicyResource(rtype, engine_props(props), urn(rtype, name), name, opts(aso), provider,
                          None, [], {})


def sargs(resources, config=None) -> StackValidationArgs:
    return StackValidationArgs(list(resources), config)


def run(policy, args) -> list[str]:
    """policy.validate with a recording report_violation; returns the messages."""
    seen: list[tuple[str, object]] = []

    def report(message, urn=None):
        seen.append((message, urn))

    result = policy.validate(args, report)
    if isawaitable(result):
        asyncio.run(result)
    return [m for m, _ in seen]


# ---- a healthy two-node stack, in the props the components pass (docs/contract.md) ----------
MEM = 128_000_000_000  # GB10 MemTotal is about 119 GiB


# What components/vllm_server.py registers as `memoryFit` for Qwen3.5-122B-A10B-FP8 with the
# staging/prod settings (TP 2, maxModelLen 65536, maxNumSeqs 4, fp8 KV, MTP 1, prefix caching):
# inspection/memory_fit.estimate(...).props(); test_policy_rules checks these are its numbers.
QWEN_122B_FIT = {
    "weightsBytesPerRank": 62_500_000_000,
    "kvBytesPerTokenPerRank": 6656,
    "kvCacheBytesPerRank": 1_744_830_464,
    "stateBytesPerRank": 927_203_328,
    "oneSequenceBytesPerRank": 668_008_448,
    "maxModelLen": 65536,
    "maxNumSeqs": 4,
    "kvCacheDtype": "fp8",
    "basis": "13 KV layers (incl. MTP) x 1 of 2 KV heads x 256 x 1 B (fp8) = 6656 B/token/rank; "
             "65536 tokens x 4 seqs; 36 linear-attention layers keep 221.1 MiB state per "
             "sequence",
}


def vllm_server(**over):
    props = {
        "environment": "prod", "tensorParallelSize": 2, "pipelineParallelSize": 1,
        "clusterGpus": 2, "gpuMemoryUtilization": 0.80, "modelBytes": 125_000_000_000,
        "maxModelLen": 65536, "maxNumSeqs": 4, "kvCacheDtype": "fp8",
        "memoryFit": dict(QWEN_122B_FIT), "enforceEager": False, "host": "127.0.0.1",
        "nodes": [{"name": "spark-1", "memTotalBytes": MEM, "unifiedMemory": True},
                  {"name": "spark-2", "memTotalBytes": MEM, "unifiedMemory": True}],
        "apiKey": secret("sk-test-key"),
    }
    props.update(over)
    return props


def fabric(iface, hca, carrier=True, mtu=9000, state="ACTIVE"):
    return {"interface": iface, "mtu": mtu, "carrier": carrier, "hca": hca, "hcaState": state}


def nccl_env(**over):
    node = lambda n: {
        "name": n,
        "env": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
                "NCCL_IB_HCA": "=rocep1s0f1,roceP2p1s0f1"},
        "fabric": [fabric("enp1s0f1np1", "rocep1s0f1"), fabric("enP2p1s0f1np1", "roceP2p1s0f1")],
    }
    props = {"rdma": True, "nodes": [node("spark-1"), node("spark-2")]}
    props.update(over)
    return props


RAY_TOKEN_PATH = "/run/spark-vllm/ray-auth-token"  # in the container; a read-only bind mount
HF_MOUNT = {"target": "/root/.cache/huggingface/hub", "type": "bind",
            "source": "/root/.cache/huggingface/hub", "readOnly": True}
RAY_TOKEN_MOUNT = {"target": RAY_TOKEN_PATH, "type": "bind",
                   "source": "/var/lib/spark-vllm/stacks/dev/ray/auth-token", "readOnly": True}


def ray_head(**over):
    """The program's head container: no secret in envs (the HF token and API key go on stdin),
    Ray token authentication from a file mounted read-only."""
    props = {
        "image": "sha256:" + "a" * 64, "networkMode": "host", "privileged": False,
        "capabilities": {"adds": ["IPC_LOCK"], "drops": []},
        "command": ["ray", "start", "--head", "--node-ip-address=192.168.177.11", "--port=6379",
                    "--include-dashboard=false", "--block"],
        "envs": ["HF_HOME=/root/.cache/huggingface", "HF_HUB_OFFLINE=1",
                 "NCCL_SOCKET_IFNAME=enp1s0f1np1", "RAY_AUTH_MODE=token",
                 f"RAY_AUTH_TOKEN_PATH={RAY_TOKEN_PATH}"],
        "mounts": [HF_MOUNT, RAY_TOKEN_MOUNT],
        "labels": [{"label": "spark-vllm.managed", "value": "true"},
                   {"label": "spark-vllm.role", "value": "ray-head"}],
        "ports": [],
    }
    props.update(over)
    return props


def ray_worker(**over):
    props = ray_head(command=["ray", "start", "--address=192.168.177.11:6379",
                              "--node-ip-address=192.168.177.12", "--block"],
                     labels=[{"label": "spark-vllm.managed", "value": "true"},
                             {"label": "spark-vllm.role", "value": "ray-worker"}])
    props.update(over)
    return props


def spark_node(name, host, key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample"):
    return {"name": name, "host": host, "hostKey": key, "role": "head"}


RAY_CONFIG = {"fabricSubnets": ["192.168.177.0/24", "192.168.178.0/24"]}


FIREWALL = "spark-vllm:firewall:NodeFirewall"
STACK_FABRIC = ["192.168.177.11", "192.168.177.12", "192.168.178.11", "192.168.178.12"]
HEAD_FABRIC = ["192.168.177.11", "192.168.178.11"]


def fw_rule(what, *ports, sources=tuple(STACK_FABRIC)):
    """A NodeFirewall rule as components/firewall.py writes it: ports as [first, last]."""
    return {"what": what, "ports": [[p, p] if isinstance(p, int) else list(p) for p in ports],
            "sources": list(sources)}


def node_firewall(node="spark-1", rules=(), public=(), ssh=22, host=None, **over):
    """A NodeFirewall's props (components/firewall.py)."""
    index = int(node.rsplit("-", 1)[1])
    props = {"environment": "prod", "node": node, "host": host or f"10.77.0.{10 + index}",
             "managementInterface": "enP7s7", "table": "inet spark-vllm-prod",
             "unit": "spark-vllm-prod-firewall.service", "sshPort": ssh, "public": list(public),
             "rules": rules if isinstance(rules, str) else list(rules),
             "dataPlane": {"ports": [32768, 60999], "sources": list(STACK_FABRIC)}}
    props.update(over)
    return props
