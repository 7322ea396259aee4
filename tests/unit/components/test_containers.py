"""Ray containers per role, and the NCCL/Ray environment each node gets."""

from __future__ import annotations

import pulumi
import pytest

from components.nccl import node_env, up_hcas
from config import validate_config
from tests.conftest import config_raw, gb10_facts
from tests.unit.conftest import settled

GIB = 1024**3
LABELS = {"spark-vllm.managed": "true", "spark-vllm.stack": "spark-vllm/dev"}


def envs(inputs) -> dict[str, str]:
    return dict(e.split("=", 1) for e in inputs["envs"])


def labels(inputs) -> dict[str, str]:
    return {lbl["label"]: lbl["value"] for lbl in inputs["labels"]}


@pytest.mark.parametrize("rdma", [False, True])
@pulumi.runtime.test
def test_container_runtime_settings_per_role(build, mocks, rdma):
    h = build(3, nccl={"rdma": rdma})
    image_ids = h.image.image_ids

    def check(ids):
        for i, node in enumerate(["spark-1", "spark-2", "spark-3"], start=1):
            role = "ray-head" if i == 1 else "ray-worker"
            c = mocks.named("ray-head" if i == 1 else f"ray-worker-{node}").inputs
            assert c["name"] == ("spark-vllm-dev-ray-head" if i == 1 else "spark-vllm-dev-ray-worker")
            assert c["image"] == ids[node] and c["image"].startswith("sha256:")  # ID, not name
            assert c["networkMode"] == "host"
            assert c["gpus"] == "all"
            # an IPC namespace of the stack's own, never the host's (issue 46): the head's is
            # the one the vLLM driver joins; /dev/shm holds Ray's object store (1 GiB in the
            # dev stack file) and 8 GiB for vLLM, in MB
            assert c["ipcMode"] == ("shareable" if i == 1 else "private")
            assert c["shmSize"] == (8 << 10) + 1024
            assert c["restart"] == "unless-stopped"
            assert c["privileged"] is False
            assert c["entrypoints"] == ["/usr/bin/env"]
            ulimits = {u["name"]: (u["soft"], u["hard"]) for u in c["ulimits"]}
            assert ulimits["nofile"] == (16384, 16384)  # ray.nofile from Pulumi.dev.yaml
            assert labels(c) == {**LABELS, "spark-vllm.role": role, "spark-vllm.node": node,
                                 "spark-vllm.ray-token": "ok"}  # the token file's sha256
            assert c["mounts"] == [
                # read-only: only the model commands write it (issue 31); its hub/ only, never
                # HF_HOME with a node's token (issue 46)
                {"target": "/root/.cache/huggingface/hub", "type": "bind", "readOnly": True,
                 "source": "/root/.cache/huggingface/hub"},
                # Ray's token authentication: the token only as a root-only file, read-only
                {"target": "/run/spark-vllm/ray-auth-token", "type": "bind", "readOnly": True,
                 "source": "/var/lib/spark-vllm/stacks/dev/ray/auth-token"},
                # compile/JIT caches survive a replaced container (issue 16), the stack's own
                # (issue 31)
                {"target": "/var/cache/spark-vllm", "type": "bind",
                 "source": "/var/lib/spark-vllm/stacks/dev/compile-cache"},
            ]
            env = envs(c)
            assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == "/root/.cache/huggingface"
            assert env["RAY_AUTH_MODE"] == "token"
            assert env["RAY_AUTH_TOKEN_PATH"] == "/run/spark-vllm/ray-auth-token"
            assert "RAY_AUTH_TOKEN" not in env
            assert {k: env[k] for k in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR",
                                        "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
                                        "CUDA_CACHE_PATH")} == {
                "VLLM_CACHE_ROOT": "/var/cache/spark-vllm/vllm",
                "TORCHINDUCTOR_CACHE_DIR": "/var/cache/spark-vllm/torchinductor",
                "TRITON_CACHE_DIR": "/var/cache/spark-vllm/triton",
                "FLASHINFER_WORKSPACE_BASE": "/var/cache/spark-vllm/flashinfer",
                "CUDA_CACHE_PATH": "/var/cache/spark-vllm/cuda"}
            assert env["VLLM_HOST_IP"] == f"192.168.177.{10 + i}"
            if rdma:
                assert ulimits["memlock"] == (-1, -1)
                assert c["devices"] == [{"hostPath": "/dev/infiniband",
                                         "containerPath": "/dev/infiniband",
                                         "permissions": "rwm"}]
                assert c["capabilities"] == {"adds": ["IPC_LOCK"]}
            else:
                assert "memlock" not in ulimits
                assert "devices" not in c and "capabilities" not in c

    return settled(h, pulumi.Output.all(**image_ids)).apply(lambda v: check(v[0]))


@pulumi.runtime.test
def test_ray_start_command_lines(build, mocks):
    """Every port Ray would pick at random pinned into the stack's block (firewall.portBase,
    config/firewall.PortBlock), so the node's firewall names exactly them."""
    h = build(2, ray={"port": 6380, "objectStoreBytes": GIB, "dashboard": False},
              firewall={"portBase": 30000})
    pinned = ["--node-manager-port", "30000", "--object-manager-port", "30001",
              "--runtime-env-agent-port", "30002", "--dashboard-agent-grpc-port", "30003",
              "--dashboard-agent-listen-port", "30004", "--metrics-export-port", "30005",
              "--min-worker-port", "30100", "--max-worker-port", "30199"]

    def check(_):
        assert mocks.named("ray-head").inputs["command"] == [
            "ray", "start", "--head", "--block", "--port", "6380",
            "--node-ip-address", "192.168.177.11", "--num-gpus", "1",
            "--object-store-memory", str(GIB), "--disable-usage-stats",
            *pinned, "--ray-client-server-port", "30006",
            "--include-dashboard=false",
        ]
        assert mocks.named("ray-worker-spark-2").inputs["command"] == [
            "ray", "start", "--block", "--address", "192.168.177.11:6380",
            "--node-ip-address", "192.168.177.12", "--num-gpus", "1",
            "--object-store-memory", str(GIB), "--disable-usage-stats", *pinned,
        ]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_dashboard_binds_to_the_fabric_only(build, mocks):
    h = build(2, ray={"dashboard": True})

    def check(_):
        cmd = mocks.named("ray-head").inputs["command"]
        assert "--include-dashboard=true" in cmd
        assert "--dashboard-host=192.168.177.11" in cmd
        assert cmd[cmd.index("--dashboard-port") + 1] == "20007"  # in the block, firewalled

    return settled(h).apply(check)


@pulumi.runtime.test
def test_nccl_env_per_node_rdma_off(build, mocks):
    h = build(2, nccl={"rdma": False, "debug": "INFO"})

    def check(_):
        for i, node in [(1, "ray-head"), (2, "ray-worker-spark-2")]:
            env = envs(mocks.named(node).inputs)
            ip = f"192.168.177.{10 + i}"
            for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                      "UCX_NET_DEVICES"):
                assert env[k] == "enp1s0f1np1", k
            assert env["VLLM_HOST_IP"] == env["RAY_NODE_IP_ADDRESS"] == ip
            assert env["RAY_OVERRIDE_NODE_IP_ADDRESS"] == ip  # the community launchers' too
            assert env["NCCL_IGNORE_CPU_AFFINITY"] == "1"
            assert env["MASTER_ADDR"] == "192.168.177.11"
            assert env["RAY_memory_monitor_refresh_ms"] == "0"
            assert env["NCCL_DEBUG"] == "INFO"
            # what the transport check reads: init/network lines, every rank's unfolded
            assert env["NCCL_DEBUG_SUBSYS"] == "INIT,NET" and env["RAY_DEDUP_LOGS"] == "0"
            assert env["NCCL_IB_DISABLE"] == "1"
            assert "NCCL_IB_HCA" not in env

    return settled(h).apply(check)


@pulumi.runtime.test
def test_nccl_env_rdma_on_lists_only_carrier_up_hcas(build, mocks):
    facts = {
        "spark-1": gb10_facts("spark-1", index=1),
        # spark-2's twin on PCI domain 2 has no link: it must not be handed to NCCL
        "spark-2": gb10_facts("spark-2", index=2, roce_state={"roceP2p1s0f1": "Down"}),
    }
    h = build(2, facts=facts, nccl={"rdma": True, "extraEnv": {"NCCL_IB_GID_INDEX": "3"}})

    def check(_):
        head = envs(mocks.named("ray-head").inputs)
        worker = envs(mocks.named("ray-worker-spark-2").inputs)
        assert head["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert worker["NCCL_IB_HCA"] == "rocep1s0f1"
        assert head["NCCL_IB_DISABLE"] == worker["NCCL_IB_DISABLE"] == "0"
        assert head["NCCL_IB_GID_INDEX"] == "3"  # extraEnv reaches every node
        # policies see the same environment and the HCA state on the component
        nccl = mocks.named("nccl").inputs
        assert nccl["rdma"] is True
        n2 = next(n for n in nccl["nodes"] if n["name"] == "spark-2")
        assert n2["env"]["NCCL_IB_HCA"] == "rocep1s0f1"
        assert [f["hcaState"] for f in n2["fabric"]] == ["Up", "Down"]
        assert [f["mtu"] for f in n2["fabric"]] == [9000, 9000]

    return settled(h).apply(check)


def test_rdma_without_any_up_hca_is_a_clear_error():
    cfg = validate_config(config_raw(2, nccl={"rdma": True}))
    down = gb10_facts("spark-2", index=2, roce_state={"rocep1s0f1": "Down", "roceP2p1s0f1": "Down"})
    assert up_hcas(cfg.nodes[1], down) == []
    with pytest.raises(ValueError, match=r"node spark-2: nccl\.rdma is true but no RoCE HCA"):
        node_env(cfg.nccl, cfg.nodes[1], down, cfg.head.primary.ip)


def test_hcas_fall_back_to_every_up_device_when_config_names_none():
    raw = config_raw(2)
    for f in raw["nodes"][0]["fabric"]:
        f.pop("hca")
    cfg = validate_config(raw)
    # connect-two-sparks capture: roceP2* rows first, port 1 Up on both twins
    assert up_hcas(cfg.nodes[0], gb10_facts("spark-1")) == ["roceP2p1s0f1", "rocep1s0f1"]


@pulumi.runtime.test
def test_compile_cache_folder_made_first_and_kept_on_destroy(build, mocks, dependencies,
                                                             retained):
    h = build(2)

    def check(_):
        for node, container in (("spark-1", "ray-head"), ("spark-2", "ray-worker-spark-2")):
            cache = mocks.named(f"ray-compile-cache-{node}")
            assert "mkdir -p /var/lib/spark-vllm/stacks/dev/compile-cache" in cache.inputs["create"]
            assert not cache.inputs.get("delete") and retained[f"ray-compile-cache-{node}"]
            assert f"ray-compile-cache-{node}" in dependencies[container]
        assert not retained["ray-head"]  # (the fixture sees both kinds)

    return settled(h).apply(check)


def _qwen_raw(nodes: int, **nccl):
    import yaml

    from tests.conftest import ROOT

    prod = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["spark-vllm:vllm"]
    raw = config_raw(nodes, model={"repo": "Qwen/Qwen3.5-122B-A10B-FP8"}, nccl={"rdma": True, **nccl})
    raw["vllm"] = {**prod, "tensorParallelSize": nodes}
    return raw


@pulumi.runtime.test
def test_recipe_env_reaches_every_nodes_ray_container(build, mocks):
    """The 122B recipe's env (Pulumi.prod.yaml's recipe) is in the container of every node, so
    in the vLLM driver (docker exec inherits it) and in every Ray worker; the policies see it
    in the NcclEnvironment's per-node env. A stack-file extraEnv entry wins over the recipe's."""
    h = build(raw=_qwen_raw(3, extraEnv={"PYTORCH_ALLOC_CONF": "expandable_segments:False",
                                         "VLLM_LOGGING_LEVEL": "DEBUG"}))

    def check(_):
        nodes = {"ray-head": "spark-1", "ray-worker-spark-2": "spark-2",
                 "ray-worker-spark-3": "spark-3"}
        props = {n["name"]: n["env"] for n in mocks.named("nccl").inputs["nodes"]}
        for i, (container, node) in enumerate(nodes.items(), start=1):
            env = envs(mocks.named(container).inputs)
            assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:False"  # the stack file's
            assert env["VLLM_LOGGING_LEVEL"] == "DEBUG", container
            assert env["RAY_OVERRIDE_NODE_IP_ADDRESS"] == f"192.168.177.{10 + i}"
            assert props[node]["PYTORCH_ALLOC_CONF"] == "expandable_segments:False"

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_dev_recipe_env_reaches_the_lab_containers(build, mocks):
    h = build(2)  # Pulumi.dev.yaml: spark-lab-tiny-moe

    def check(_):
        for container in ("ray-head", "ray-worker-spark-2"):
            assert envs(mocks.named(container).inputs)["VLLM_LOGGING_LEVEL"] == "INFO"

    return settled(h).apply(check)


@pytest.mark.parametrize("rdma", [False, True])
@pulumi.runtime.test
def test_a_recipe_may_not_set_what_the_containers_get_from_the_stack(build, mocks, rdma):
    """config.recipes.STACK_ENV (refused in a recipe's env) is exactly what the Ray containers
    get from the stack rather than from nccl.extraEnv and the recipe: kept in step here."""
    from config.recipes import STACK_ENV

    h = build(2, nccl={"rdma": rdma, "debug": "INFO"})

    def check(_):
        for container in ("ray-head", "ray-worker-spark-2", "vllm-serve"):
            env = envs(mocks.named(container).inputs)
            from_stack = set(env) - {"VLLM_LOGGING_LEVEL"}  # the dev recipe's env
            assert from_stack <= STACK_ENV, from_stack - STACK_ENV
        assert STACK_ENV - set(envs(mocks.named("vllm-serve").inputs)) <= {
            "NCCL_IB_HCA" if not rdma else "", "NCCL_DEBUG_SUBSYS",
            "VLLM_API_KEY",  # set by the launcher (or only with RDMA, or INFO)
            "AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT"}  # the Ray head's only

    return settled(h).apply(check)
