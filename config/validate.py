"""validate_config: the whole config, single values (config/models.py) and the rules that span
keys (uniqueness, subnets, parallelism, what prod demands), every problem listed at once.

A recipe (`vllm.recipe`, config/recipes.py) is applied first: its serve settings fill in the
`vllm` keys the stack file does not set (VllmConfig), its env the `nccl.extraEnv` entries the
stack file does not set (`with_recipe_env`); the rules below judge the result."""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import ValidationError

from config.errors import ConfigError, describe, key_path
from config.forms import SEEDER_PORTS, clip
from config.models import StackConfig, home_cache_user
from config.ports import declared_ports
from config.recipes import with_recipe_env


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _cross_checks(cfg: StackConfig) -> list[str]:
    """Rules that span keys: uniqueness, subnets, parallelism, what prod demands."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, node in enumerate(cfg.nodes):
        if node.name in seen:
            problems.append(
                f"{key_path(('nodes', i, 'name'))}: got {node.name!r}; expected a unique node name "
                f"(also used by nodes[{seen[node.name]}])"
            )
        seen.setdefault(node.name, i)

    hosts: dict[tuple[str, int], int] = {}
    for i, node in enumerate(cfg.nodes):
        where = (node.host, node.port)
        if where in hosts:
            problems.append(
                f"{key_path(('nodes', i, 'host'))}: got {node.host!r} port {node.port}; expected "
                f"a management address of its own (also nodes[{hosts[where]}])"
            )
        hosts.setdefault(where, i)
        names = [f.interface for f in node.fabric]
        for j, name in enumerate(names):
            if name in names[:j]:
                problems.append(
                    f"{key_path(('nodes', i, 'fabric', j, 'interface'))}: got {name!r}; expected "
                    "each fabric interface once per node"
                )

    nets = cfg.nccl.networks()
    fabric_ips: dict[str, str] = {}
    for i, node in enumerate(cfg.nodes):
        for j, fab in enumerate(node.fabric):
            ip = ipaddress.IPv4Address(fab.ip)
            if not any(ip in n for n in nets):
                problems.append(
                    f"{key_path(('nodes', i, 'fabric', j, 'ip'))}: got {fab.ip!r}; expected "
                    "an address "
                    f"inside spark-vllm:nccl.fabricSubnets {cfg.nccl.fabric_subnets}"
                )
            if fab.ip in fabric_ips:
                problems.append(
                    f"{key_path(('nodes', i, 'fabric', j, 'ip'))}: got {fab.ip!r}; expected "
                    "a fabric "
                    f"address not already used by {fabric_ips[fab.ip]}"
                )
            fabric_ips.setdefault(fab.ip, node.name)
        # the management address (the one ssh and the docker provider use) is never a fabric
        # address, nor inside a fabric subnet: configuring the fabric would take its route
        if _is_ipv4(node.host):
            mgmt = ipaddress.IPv4Address(node.host)
            inside = [str(n) for n in nets if mgmt in n]
            if inside:
                problems.append(
                    f"{key_path(('nodes', i, 'host'))}: got {node.host!r}; expected a management "
                    f"address outside spark-vllm:nccl.fabricSubnets (it is inside {inside[0]}): "
                    "the fabric's configuration would take the management route"
                )
        # the twins of a node: each in a subnet of its own
        twin_nets: dict[str, int] = {}
        for j, fab in enumerate(node.fabric):
            net = next((str(n) for n in nets if ipaddress.IPv4Address(fab.ip) in n), None)
            if net is None:
                continue
            if net in twin_nets:
                problems.append(
                    f"{key_path(('nodes', i, 'fabric', j, 'ip'))}: got {fab.ip!r}; expected "
                    f"each fabric interface of a node in a subnet of its own ({net} is also "
                    f"fabric[{twin_nets[net]}]'s): two interfaces in one subnet make the "
                    "kernel's route between them a guess"
                )
            twin_nets.setdefault(net, j)
    if cfg.fabric.manage and cfg.fabric.mtu < cfg.nccl.min_mtu:
        problems.append(
            f"{key_path(('fabric', 'mtu'))}: got {cfg.fabric.mtu}; expected at least "
            f"spark-vllm:nccl.minMtu {cfg.nccl.min_mtu} (the MTU the fabric check pings at)"
        )

    pp = cfg.vllm.pipeline_parallel_size
    tp = cfg.tensor_parallel_size
    if tp * pp != cfg.cluster_gpus:
        problems.append(
            f"{key_path(('vllm', 'tensorParallelSize'))}: got tensorParallelSize={tp} x "
            f"pipelineParallelSize={pp} = {tp * pp}; expected the product to equal the GPUs in the "
            f"cluster: {len(cfg.nodes)} node(s) x ray.gpusPerNode {cfg.ray.gpus_per_node} = "
            f"{cfg.cluster_gpus}"
        )
    if cfg.vllm.port == cfg.ray.port:
        problems.append(
            f"{key_path(('vllm', 'port'))}: got {cfg.vllm.port}; expected a port other than "
            "spark-vllm:ray.port (both bind on the head's host network)"
        )
    if cfg.vllm.executor == "mp" and cfg.vllm.master_port in (cfg.vllm.port, cfg.ray.port):
        problems.append(
            f"{key_path(('vllm', 'masterPort'))}: got {cfg.vllm.master_port}; expected a port "
            "other than spark-vllm:vllm.port and spark-vllm:ray.port (they bind on the head's "
            "host network)"
        )
    for key, port in ((("vllm", "port"), cfg.vllm.port), (("ray", "port"), cfg.ray.port),
                      (("vllm", "masterPort"), cfg.vllm.master_port)):
        if port in SEEDER_PORTS:
            problems.append(
                f"{key_path(key)}: got {port}; expected a port other than the stack's seeders' "
                f"{SEEDER_PORTS} (they listen on the head's fabric address)"
            )

    gate = cfg.fabric.collective.port
    held = {cfg.vllm.port: "spark-vllm:vllm.port", cfg.ray.port: "spark-vllm:ray.port",
            **({cfg.vllm.master_port: "spark-vllm:vllm.masterPort"}
               if cfg.vllm.executor == "mp" else {}),
            **{p: "the stack's seeders" for p in SEEDER_PORTS},
            **{s.port: f"spark-vllm:services ({s.name})" for s in cfg.services}}
    if cfg.fabric.collective.enabled and gate in held:
        problems.append(
            f"{key_path(('fabric', 'collective', 'port'))}: got {gate}; expected a port other "
            f"than {held[gate]}'s (the gate's rendezvous binds it on the head's fabric address "
            "while the stack serves)"
        )

    problems += _service_checks(cfg)
    problems += _gateway_checks(cfg)
    problems += _monitoring_checks(cfg)
    problems += _firewall_checks(cfg)

    problems += _drafter_checks(cfg)
    problems += _remote_code_checks(cfg)

    if cfg.vllm.enable_auto_tool_choice and not cfg.vllm.tool_call_parser:
        problems.append(
            f"{key_path(('vllm', 'enableAutoToolChoice'))}: got True; expected "
            f"{key_path(('vllm', 'toolCallParser'))} too (vLLM refuses --enable-auto-tool-choice "
            "without --tool-call-parser)"
        )

    if cfg.environment == "prod":
        if not cfg.image.by_digest:
            problems.append(
                f"{key_path(('image', 'ref'))}: got {cfg.image.ref!r}; expected an image pinned by "
                "digest (<name>@sha256:<64 hex>) in prod"
            )
        if not cfg.model.pinned:
            problems.append(
                f"{key_path(('model', 'revision'))}: got {cfg.model.revision!r}; expected a 40-hex "
                "commit in prod (promote the commit resolved in staging)"
            )
        for i, node in enumerate(cfg.nodes):
            if node.host_key_is_placeholder:
                problems.append(
                    f"{key_path(('nodes', i, 'hostKey'))}: got {node.host_key!r}; expected "
                    "the real "
                    "host key (ssh-keyscan -t ed25519 <host>) in prod, not a placeholder"
                )
        drafter = cfg.model.drafter
        if drafter is not None and not drafter.pinned:
            problems.append(
                f"{key_path(('model', 'drafter', 'revision'))}: got {drafter.revision!r}; "
                "expected a 40-hex commit in prod (promote the commit resolved in staging)"
            )
        for i, svc in enumerate(cfg.services):
            if not svc.pinned:
                problems.append(
                    f"{key_path(('services', i, 'revision'))}: got {svc.revision!r}; expected "
                    "a 40-hex commit in prod (promote the commit resolved in staging)"
                )
        if not cfg.nccl.rdma:
            problems.append(
                f"{key_path(('nccl', 'rdma'))}: got False; expected true in prod (NCCL over RoCE; "
                "TCP sockets cost most of the interconnect bandwidth)"
            )
    owner = home_cache_user(cfg.model.cache_dir)
    others = sorted({n.user for n in cfg.nodes if n.user != owner})
    if owner is not None and others:
        problems.append(
            f"{key_path(('model', 'cacheDir'))}: got {cfg.model.cache_dir!r}; expected a cache "
            f"in the home of the nodes' ssh user only ({owner} is not the user of every node: "
            f"{', '.join(others)}): the model commands write it as that user, and another user "
            "could plant links in it for them to follow (the nodes check it again)"
        )
    return problems


def _drafter_checks(cfg: StackConfig) -> list[str]:
    """The speculative drafter: the served repo's (MTP heads) at the served commit, or
    `model.drafter` (another repo) at its own; the stack pins either, so no config names a
    revision. A service's drafter is its own repo's."""
    problems: list[str] = []
    spec = cfg.vllm.speculative_config or {}
    spec_key = key_path(("vllm", "speculativeConfig"))
    drafter = cfg.model.drafter
    named = spec.get("model")
    if named is not None and named != cfg.model.repo and (drafter is None
                                                           or named != drafter.repo):
        declared = (f"spark-vllm:model.drafter.repo is {drafter.repo!r}" if drafter is not None
                    else "declare it as spark-vllm:model.drafter {repo: " + str(named)
                    + ", revision: <40-hex commit>}")
        problems.append(
            f"{spec_key}.model: got {clip(named)}; expected the served repo "
            f"{cfg.model.repo!r}, no model (MTP) or the declared drafter ({declared}): the stack "
            "fetches, verifies and pins only the repos it declares, and the nodes serve offline"
        )
    if drafter is not None and named != drafter.repo:
        problems.append(
            f"{key_path(('model', 'drafter'))}: got repo {drafter.repo!r}; expected "
            f"{spec_key}.model to name it (got {clip(named)}): a drafter no speculative config "
            "uses would be fetched to every node for nothing"
        )
    if drafter is not None and drafter.repo == cfg.model.repo:
        problems.append(
            f"{key_path(('model', 'drafter', 'repo'))}: got {drafter.repo!r}, the served repo; "
            "expected another repo (the served repo's drafter is served at its commit: leave "
            "model.drafter out)"
        )
    if "revision" in spec:
        problems.append(
            f"{spec_key}.revision: got {clip(spec['revision'])}; expected no revision: the "
            "stack pins the drafter to its commit (spark-vllm:model.revision, or "
            "spark-vllm:model.drafter.revision)"
        )
    for i, svc in enumerate(cfg.services):
        sspec = svc.speculative_config or {}
        where = key_path(("services", i, "speculativeConfig"))
        if sspec.get("model", svc.repo) != svc.repo:
            problems.append(
                f"{where}.model: got {clip(sspec['model'])}; expected the service's repo "
                f"{svc.repo!r} or no model: a service's drafter from another repo is not "
                "fetched (spark-vllm:model.drafter is the main model's)"
            )
        if "revision" in sspec:
            problems.append(f"{where}.revision: got {clip(sspec['revision'])}; expected no "
                            "revision: the stack pins the drafter to the service's commit")
    return problems


def _remote_code_checks(cfg: StackConfig) -> list[str]:
    """trustRemoteCode runs a model repo's own Python code: only from a commit (the code that
    was reviewed), never a branch or tag that can move to code nobody looked at."""
    problems: list[str] = []

    def unpinned(what: str, revision: str, where: tuple[str | int, ...]) -> str:
        return (f"{key_path(where)}: got {revision!r}; expected a 40-hex commit with "
                f"trustRemoteCode (vLLM runs {what}'s own Python code: pinned, the code that "
                "runs is the code that was reviewed; a branch or tag can move to other code)")

    for where, settings in ((("vllm",), cfg.vllm),
                            *((("services", i), svc) for i, svc in enumerate(cfg.services))):
        if settings.reasoning_parser_plugin and not settings.trust_remote_code:
            problems.append(
                f"{key_path((*where, 'reasoningParserPlugin'))}: got "
                f"{settings.reasoning_parser_plugin!r}; expected "
                f"{key_path((*where, 'trustRemoteCode'))} true with it: the plugin is the model "
                "repository's own Python code, loaded from the pinned commit")
    if cfg.vllm.trust_remote_code:
        if not cfg.model.pinned:
            problems.append(unpinned(cfg.model.repo, cfg.model.revision, ("model", "revision")))
        d = cfg.model.drafter
        if d is not None and not d.pinned:
            problems.append(unpinned(d.repo, d.revision, ("model", "drafter", "revision")))
    for i, svc in enumerate(cfg.services):
        if svc.trust_remote_code and not svc.pinned:
            problems.append(unpinned(svc.repo, svc.revision, ("services", i, "revision")))
    return problems


def _service_checks(cfg: StackConfig) -> list[str]:
    """`services`: unique names, nodes of the cluster, and ports no other listener of the stack
    holds on the same node (the main vLLM, Ray and vLLM's master port bind on the head; the
    seeders on the head's fabric addresses; every container uses the host network)."""
    problems: list[str] = []
    nodes = [n.name for n in cfg.nodes]
    taken_head = {cfg.vllm.port: "spark-vllm:vllm.port", cfg.ray.port: "spark-vllm:ray.port"}
    if cfg.vllm.executor == "mp":
        taken_head[cfg.vllm.master_port] = "spark-vllm:vllm.masterPort"
    names: dict[str, int] = {}
    served: dict[str, str] = {cfg.vllm.served_model_name: "spark-vllm:vllm.servedModelName"}
    ports: dict[tuple[str, int], int] = {}
    for i, svc in enumerate(cfg.services):
        if svc.name in names:
            problems.append(f"{key_path(('services', i, 'name'))}: got {svc.name!r}; expected a "
                            f"unique service name (also services[{names[svc.name]}])")
        names.setdefault(svc.name, i)
        if svc.served_name in served:
            problems.append(f"{key_path(('services', i, 'servedModelName'))}: got "
                            f"{svc.served_name!r}; expected a served name of its own (also "
                            f"{served[svc.served_name]})")
        served.setdefault(svc.served_name, f"services[{i}]")
        if svc.nodes is not None:
            unknown = [n for n in svc.nodes if n not in nodes]
            if unknown or not svc.nodes or len(set(svc.nodes)) != len(svc.nodes):
                problems.append(f"{key_path(('services', i, 'nodes'))}: got {svc.nodes}; "
                                f"expected distinct names of spark-vllm:nodes {nodes}")
        if svc.port in SEEDER_PORTS:
            problems.append(f"{key_path(('services', i, 'port'))}: got {svc.port}; expected a "
                            f"port other than the stack's seeders' {SEEDER_PORTS}")
        for node in cfg.service_nodes(svc):
            if node == cfg.head.name and svc.port in taken_head:
                problems.append(
                    f"{key_path(('services', i, 'port'))}: got {svc.port}; expected a port other "
                    f"than {taken_head[svc.port]} (both bind on {node}'s host network)")
            other = ports.get((node, svc.port))
            if other is not None:
                problems.append(
                    f"{key_path(('services', i, 'port'))}: got {svc.port}; expected a port other "
                    f"than services[{other}]'s on {node} (both bind on its host network)")
            ports.setdefault((node, svc.port), i)
    return problems


def _gateway_checks(cfg: StackConfig) -> list[str]:
    """The gateway is the stack's only listener beyond a node (config/gateway.py): vLLM listens
    where only the gateway reaches it, the gateway's port is its own on the head, and prod pins
    its image."""
    problems: list[str] = []
    host = cfg.vllm.host
    head_fabric = [f.ip for f in cfg.head.fabric]
    if host is not None and not ipaddress.ip_address(host).is_loopback \
            and host not in head_fabric:
        problems.append(
            f"{key_path(('vllm', 'host'))}: got {host!r}; expected no value (the stack's "
            f"choice), 127.0.0.1 or a fabric address of the head {head_fabric}: every client "
            "reaches vLLM through the gateway (spark-vllm:gateway.port), which alone listens "
            "beyond the node")
    port = cfg.gateway.port
    taken = {cfg.vllm.port: "spark-vllm:vllm.port", cfg.ray.port: "spark-vllm:ray.port",
             cfg.head.port: f"spark-vllm:nodes[0].port (sshd on {cfg.head.name})"}
    if cfg.vllm.executor == "mp":
        taken[cfg.vllm.master_port] = "spark-vllm:vllm.masterPort"
    for i, svc in enumerate(cfg.services):
        if cfg.head.name in cfg.service_nodes(svc):
            taken.setdefault(svc.port, f"spark-vllm:services[{i}].port")
    if port in taken:
        problems.append(
            f"{key_path(('gateway', 'port'))}: got {port}; expected a port other than "
            f"{taken[port]} (the gateway listens on every address of {cfg.head.name})")
    if port in SEEDER_PORTS:
        problems.append(
            f"{key_path(('gateway', 'port'))}: got {port}; expected a port other than the "
            f"stack's seeders' {SEEDER_PORTS}")
    if cfg.environment == "prod" and not cfg.gateway.image.by_digest:
        problems.append(
            f"{key_path(('gateway', 'image', 'ref'))}: got {cfg.gateway.image.ref!r}; expected "
            "an image pinned by digest (<name>@sha256:<64 hex>) in prod")
    return problems


def _monitoring_checks(cfg: StackConfig) -> list[str]:
    """Prometheus's, Alertmanager's and the node exporters' ports are their own on the nodes'
    host networks, and prod pins their images (config/monitoring.py)."""
    m = cfg.monitoring
    if not m.enabled:
        return []
    problems: list[str] = []
    head_taken = {cfg.gateway.port: "spark-vllm:gateway.port", cfg.vllm.port:
                  "spark-vllm:vllm.port", cfg.ray.port: "spark-vllm:ray.port",
                  cfg.head.port: f"spark-vllm:nodes[0].port (sshd on {cfg.head.name})"}
    if cfg.vllm.executor == "mp":
        head_taken[cfg.vllm.master_port] = "spark-vllm:vllm.masterPort"
    for field, port in (("port", m.port), ("nodeExporterPort", m.node_exporter_port),
                        ("alertmanagerPort", m.alertmanager_port)):
        taken = dict(head_taken)
        for i, svc in enumerate(cfg.services):
            taken.setdefault(svc.port, f"spark-vllm:services[{i}].port")
        if field == "nodeExporterPort":
            for n in cfg.workers:
                taken.setdefault(n.port, f"sshd on {n.name}")
        where = key_path(("monitoring", field))
        if port in taken:
            problems.append(f"{where}: got {port}; expected a port other than "
                            f"{taken[port]} (both listen on a node's host network)")
        if port in SEEDER_PORTS:
            problems.append(f"{where}: got {port}; expected a port other than the "
                            f"stack's seeders' {SEEDER_PORTS}")
    if cfg.environment == "prod":
        for name, image in (("prometheus", m.prometheus), ("nodeExporter", m.node_exporter),
                            ("alertmanager", m.alertmanager)):
            if image is not None and not image.by_digest:
                problems.append(
                    f"{key_path(('monitoring', name, 'ref'))}: got {image.ref!r}; expected an "
                    "image pinned by digest (<name>@sha256:<64 hex>) in prod")
    return problems


def _firewall_checks(cfg: StackConfig) -> list[str]:
    """The stack's table on every node outside dev, and a port block (firewall.portBase) that
    holds none of the ports the config names (config/firewall.py)."""
    problems: list[str] = []
    if not cfg.firewall.enabled and cfg.environment != "dev":
        problems.append(
            f"{key_path(('firewall', 'enabled'))}: got False; expected true in "
            f"{cfg.environment}: Ray's servers, torch's store and vLLM's own sockets listen on "
            "every address of a node, and only the stack's firewall keeps them off the "
            "management network (docs/design.md \"The node's firewall\")")
    lo, hi = cfg.firewall.block.span
    inside = sorted((p, what) for p, what in declared_ports(cfg).items() if lo <= p <= hi)
    for port, what in inside:
        problems.append(
            f"{key_path(('firewall', 'portBase'))}: got {cfg.firewall.port_base}; expected a "
            f"block ({lo}-{hi}) that holds none of the stack's other ports ({what} is {port}): "
            "Ray's and vLLM's own ports are pinned there")
    return problems


def validate_config(raw: dict[str, Any]) -> StackConfig:
    """Validate a raw mapping of top-level keys; raise ConfigError listing every problem."""
    try:
        cfg = StackConfig.model_validate(with_recipe_env(raw))
    except ValidationError as exc:
        raise ConfigError([describe(dict(e), StackConfig) for e in exc.errors()]) from None
    problems = _cross_checks(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg
