"""Helpers for the recon tests: recorded real outputs (tests/fixtures/gb10, line 1 = source note)
and the labelled samples in tests/unit/inspection/samples (formats without a published GB10 capture)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GB10 = FIXTURES / "gb10"
SAMPLES = Path(__file__).resolve().parent / "samples"


def _body(path: Path) -> str:
    text = path.read_text()
    first, _, rest = text.partition("\n")
    assert first.startswith("# source:"), f"{path.name}: line 1 must be the '# source:' note"
    return rest


def gb10(name: str) -> str:
    """The raw output recorded in tests/fixtures/gb10/<name> (without its source line)."""
    return _body(GB10 / name)


def fixture(path: str) -> str:
    """The raw output recorded in tests/fixtures/<path> (without its source line), e.g.
    `nccl/...` or `rdma/...`."""
    return _body(FIXTURES / path)


def fixtures(folder: str) -> list[str]:
    """Every recorded output under tests/fixtures/<folder>, as `<folder>/<name>`."""
    return sorted(f"{folder}/{p.name}" for p in (FIXTURES / folder).glob("*.txt"))


def sample(name: str) -> str:
    return _body(SAMPLES / name)


def docker_stats_json(text: str) -> dict[str, int]:
    """`docker stats --no-stream --format '{{json .}}'` -> {container name or ID: memory bytes}.

    Recon reads container memory from the cgroups (inspection/parsers.parse_container_memory);
    the recorded docker stats of the same containers are what the tests hold it against.
    MemUsage is '45.2GiB / 121.7GiB' (binary units)."""
    import json

    from inspection.parsers import parse_size

    usage: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        used = row["MemUsage"].split("/")[0].strip()
        value = 0 if used in {"--", ""} else parse_size(used, kind="docker stats")
        usage[row.get("Name") or row["Container"]] = value
        if row.get("ID"):
            usage[row["ID"]] = value
    return usage


# --------------------------------------------------------------------------- configs and outputs

import copy  # noqa: E402

from config import StackConfig, validate_config  # noqa: E402
from hostscripts.paths import StackNames  # noqa: E402

NAMES = StackNames("dev")  # the stack whose own files recon looks for

KEY_1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHn0deKeyOneForSpark1xxxxxxxxxxxxxxxxxxxxxx"
KEY_2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHn0deKeyTwoForSpark2xxxxxxxxxxxxxxxxxxxxxx"
GIB = 1024**3
MODEL_BYTES = 119 * 10**9  # Qwen3.5-122B-A10B-FP8 is ~119 GB


def raw_config(**sections) -> dict:
    """The contract's reference config (two Sparks, port 1 cabled), with sections overridden."""
    raw = {
        "environment": "staging",
        "nodes": [
            {"name": f"spark-{i}", "host": f"10.77.0.1{i}", "port": 22, "user": "root",
             "hostKey": key, "fabric": [
                 {"interface": "enp1s0f1np1", "ip": f"192.168.177.1{i}", "hca": "rocep1s0f1"},
                 {"interface": "enP2p1s0f1np1", "ip": f"192.168.178.1{i}", "hca": "roceP2p1s0f1"}]}
            for i, key in ((1, KEY_1), (2, KEY_2))
        ],
        "ssh": {"privateKeyPath": "/tmp/spark-vllm-test-key", "connectTimeoutSeconds": 5},
        "image": {"ref": "registry.example:5000/vllm-spark@sha256:" + "1" * 64},
        "model": {"repo": "Qwen/Qwen3.5-122B-A10B-FP8", "cacheDir": "/root/.cache/huggingface"},
        "nccl": {"rdma": True, "fabricSubnets": ["192.168.177.0/24", "192.168.178.0/24"]},
        "vllm": {"servedModelName": "qwen3.5-122b", "tensorParallelSize": 2,
                 "gpuMemoryUtilization": 0.80},
        "preflight": {"foreignContainers": "fail"},
        "gateway": {"image": {"ref": "registry.example:5000/haproxy@sha256:" + "2" * 64}},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return copy.deepcopy(raw)


def config(cache_dir: str | None = None, **sections) -> StackConfig:
    """The validated config; `cache_dir` a local folder for the model cache (config refuses one
    outside the dedicated roots, config.models.cache_dir_problem: set past validation, for a
    recon script run here)."""
    cfg = validate_config(raw_config(**sections))
    if cache_dir is None:
        return cfg
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"cache_dir": cache_dir})})


# the marker nonce of the assembled outputs (a real survey makes a fresh one: recon.new_nonce)
NONCE = "5eed5eed5eed5eed"


def assemble(sections: dict, nonce: str = NONCE) -> str:
    """Recon output in the script's marker format. value: stdout | (stdout, rc) | (stdout, rc, stderr)."""
    out = []
    for name, value in sections.items():
        if isinstance(value, str):
            value = (value, 0, "")
        stdout, rc, *rest = value
        stderr = rest[0] if rest else ""
        out.append(f"=== spark-vllm:{nonce}:section:{name} ===")
        out.append(stdout.rstrip("\n") + "\n")
        out.append(f"=== spark-vllm:{nonce}:stderr:{name} ===")
        out.append(stderr + "\n")
        out.append(f"=== spark-vllm:{nonce}:end:{name} rc={rc} ===")
    return "\n".join(out) + "\n"


def nonce_of(script: str) -> str:
    """The nonce a recon script was made with (its `SV_NONCE=` line)."""
    import re

    m = re.search(r"^SV_NONCE=([0-9a-f]+)$", script, re.M)
    assert m, "no SV_NONCE line in the recon script"
    return m.group(1)


def meminfo(total_kib: int, available_kib: int) -> str:
    return (f"MemTotal:       {total_kib} kB\nMemFree:        {available_kib - 1000} kB\n"
            f"MemAvailable:   {available_kib} kB\nBuffers:            1234 kB\n")


# free-kib-obrienlabs.txt (a real Spark): total 125513720 KiB, available 120425308 KiB
SPARK_TOTAL_KIB = 125513720
SPARK_AVAILABLE_KIB = 120425308
SEED_HELD_KIB = int((68.2 + 11.4 + 11.7) * 1024**2)  # cgroup-memory-seed.txt (as docker stats), KiB


def spark_sections(n: int = 1, *, seed: bool = False, **override) -> dict:
    """One Spark's recon sections assembled from the recorded GB10 outputs (and labelled samples).

    n: node number (fabric IPs 192.168.17{7,8}.1n); seed: the reference head's foreign containers
    (vllm_node, reranker, vllm_embeddings holding ~98 GB) and the memory they take.
    """
    ip_json = sample("ip-j-addr-spark.txt").replace("192.168.177.11", f"192.168.177.1{n}") \
        .replace("192.168.178.11", f"192.168.178.1{n}")
    available = SPARK_AVAILABLE_KIB - (SEED_HELD_KIB if seed else 0)
    key = KEY_1 if n == 1 else KEY_2
    sections = {
        "clock_start": "1764480000.100000000",
        "os_release": gb10("os-release-code-monkeys-hutch.txt"),
        "dgx_release": gb10("dgx-release-sionna-rk.txt"),
        "uname": gb10("uname-a-code-monkeys-hutch.txt").replace("hutch", f"spark-{n}"),
        "meminfo": meminfo(SPARK_TOTAL_KIB, available),
        "nvidia_smi_query": gb10("nvidia-smi-query-name-cc-driver-memtotal-jethac-pgx.txt"),
        "nvidia_smi": gb10("nvidia-smi-jethac-pgx.txt"),
        "nvidia_smi_list": gb10("nvidia-smi-L-code-monkeys-hutch.txt"),
        "ip_addr": ip_json,
        "speed:enp1s0f1np1": gb10("ethtool-grep-speed-200g-playbooks-switch.txt"),
        "speed:enP2p1s0f1np1": "200000",
        "ibdev2netdev": gb10("ibdev2netdev-playbooks-connect-two-sparks.txt"),
        "rdma_link": gb10("rdma-link-sean70653-gb10.txt"),
        "docker_info": sample("docker-info-json-spark.txt"),
        "docker_ps": sample("docker-ps-json-seed.txt") if seed else "",
        "docker_labels": sample("docker-labels-json-seed.txt") if seed else "",
        "container_memory": sample("cgroup-memory-seed.txt") if seed else "",
        "docker_images": sample("docker-images-json-seed.txt"),
        "gpu_runtime": "cdi /etc/cdi/nvidia.yaml",
        "hf_cache": sample("hf-cache-listing.txt"),
        "disk": "      Avail\n500000000000",
        "host_keys": f"{key} root@spark-{n}\necdsa-sha2-nistp256 AAAAE2VjZHNh= root@spark-{n}",
        "clock_end": "1764480000.900000000",
    }
    sections.update(override)
    if "docker_ps" in override and "docker_labels" not in override:
        sections["docker_labels"] = docker_labels_of(sections["docker_ps"])
    return sections


def docker_labels_of(ps: str | tuple) -> str | tuple:
    """The docker_labels section (inspection/snippets/docker_labels.sh) for the containers of a
    docker_ps section, as `docker inspect` would print them. The samples' Labels columns hold no
    ',' inside a value (they are SYNTHETIC, samples/docker-ps-json-seed.txt says so), so here,
    and only here, splitting them is exact. A docker_ps section given as (stdout, rc, ...) keeps
    its rc. Each container's image (named by the sha256 of its docker ps Image, SYNTHETIC) is
    listed after them with no labels of its own, as `docker image inspect` prints it."""
    import hashlib
    import json

    text = ps[0] if isinstance(ps, tuple) else ps
    lines, images = [], {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("ID"), str):
            continue
        raw = row.get("Labels") or ""
        labels = dict(item.split("=", 1) for item in raw.split(",") if "=" in item) \
            if isinstance(raw, str) else {}
        image = "sha256:" + hashlib.sha256(str(row.get("Image")).encode()).hexdigest()
        images[image] = None
        lines.append(json.dumps({"ID": row["ID"], "Image": image, "Labels": labels or None}))
    lines += [json.dumps({"ImageID": image, "Labels": None}) for image in images]
    out = "\n".join(lines)
    return (out, *ps[1:]) if isinstance(ps, tuple) else out


def spark_output(n: int = 1, *, seed: bool = False, **override) -> str:
    return assemble(spark_sections(n, seed=seed, **override))


def parse(text: str, node: str = "spark-1", **kw):
    """parse_recon_output of an output assembled with NONCE."""
    from inspection import recon

    return recon.parse_recon_output(node, text, nonce=kw.pop("nonce", NONCE), **kw)
