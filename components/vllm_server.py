"""VllmServer: vLLM as a supervised container on the head, gated on health.

With the Ray executor vLLM is a Ray driver: the container `spark-vllm-<stack>-serve` runs on the
head from the same image as the Ray containers, with the same runtime (host network, every GPU,
host IPC, the HF cache offline, the compile caches) and joins the stack's Ray cluster
(RAY_ADDRESS, the cluster token). A Ray driver finds its node's raylet by the processes it sees
and connects through the files in Ray's session folder, so the container shares the Ray head
container's PID namespace and session folder (hostscripts/paths.StackNames.ray_session_dir).

Supervision is Docker's: the container restarts (`unless-stopped`) whenever vLLM exits - an
OOM, a lost Ray worker (vLLM's Ray executor shuts down when a worker dies), the Ray head
restarting (the container shares its PID namespace), a reboot - and vLLM waits for the Ray
cluster's GPUs as it starts, so it serves again with no `up`.

With vLLM's own multi-node executor (`vllm.executor: mp`) there is no Ray: every node runs a
`spark-vllm-<stack>-serve` container with the same flags plus its place (`--nnodes`,
`--node-rank`, `--master-addr` the head's fabric address, `--master-port`); the head's serves
the API, the others run `--headless`. vLLM's ranks do not find each other again by themselves: a
headless rank waits on its head forever, and a head whose headless rank died exits when a
request fails (Docker restarts it). So a headless container's main process
(payloads/vllm_rank_watch.py) ends it when the head's /health stopped answering, and Docker
starts the rank again to meet the head's next start; and when recon finds a rank stopped,
`vllm-ranks-restart` restarts the head's vLLM before the health gate runs, so every rank starts
again together.

Consequences that are the point of the design:
* The serve flags are the container's command: `pulumi preview --diff` shows a flag change as
  this container's replacement, and only it restarts (the Ray containers do not see vLLM's
  flags). A recipe's chat template is uploaded into the container; a recipe's env is the
  nodes' (components/nccl.node_env).
* A replaced Ray container replaces this one (their IDs are a label), so vLLM never runs on a
  cluster it did not start with.
* The API key travels on stdin into a root-only file on the head, mounted read-only; the
  container's launcher exports it for vLLM as VLLM_API_KEY: it is in no command line, no
  `docker inspect`, no container environment and no plaintext state. Its label is an
  HMAC-SHA256 under the stack's label key (StackSecrets.api_key_label), not a hash of the key.
* After creation a command on the head gates the `up` on `/health`, `/v1/models` and one smoke
  completion, and another reads which transport NCCL chose from the container's log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import rerun
from components.deployment import (
    deployment_steps,
    drafter,
    restore_labels,
    restored_removal,
    shape,
)
from components.model_cache import ModelCache
from components.nccl import PER_NODE_KEYS
from components.node_runtime import NodeRuntime, compile_cache_dirs
from components.ray_cluster import RayCluster, session_volume
from components.rerun import Again
from components.spark_node import Cluster, SparkNode
from components.stack_secrets import StackSecrets
from config import HealthConfig, VllmConfig, chat_template_text
from config.serve import FORBIDDEN_FLAGS, OWNED_FLAGS
from contract import labels as lbl
from contract import types
from contract.props import MemoryFitProps, RemoteCodeProps, ServerNodeProps, VllmServerProps
from hostscripts.common import verdict_script
from hostscripts.deployment import GateRestore, GateVerdict, Held, NodeDeployment, summary_facts
from hostscripts.images import image_probe
from hostscripts.paths import VLLM_CONFIG_ROOT, VLLM_KEY
from hostscripts.vllm import (
    CHAT_TEMPLATE,
    Drafter,
    main_key_remove,
    main_key_write,
    mp_node_flags,
    non_carry_over_json,
    serve_entrypoint,
    vllm_argv,
    vllm_deployment_final,
    vllm_health_gate,
    vllm_nccl_lines,
    vllm_ranks_restart,
    watched_entrypoint,
)
from inspection import memory_fit
from inspection.hub import ModelManifest
from inspection.image_probe import ImageProbeError, parse_serve_check
from inspection.nccl_transport import parse_transport, verdict

# Env keys vLLM's Ray executor must not copy from the driver to the workers: the per-node NCCL
# values, and the API key (only the API server needs it).
NON_CARRY_OVER = (*PER_NODE_KEYS, "VLLM_API_KEY")


def serve_argv(vllm: VllmConfig, model: str, commit: str, tensor_parallel_size: int,
               node_flags: Sequence[str] = (), *, host: str,
               drafter: Drafter | None = None) -> list[str]:
    """`vllm serve` for the main model: its serve keys with the parallelism and the address it
    listens on resolved (config/listen.vllm_host); `drafter`: model.drafter at its commit (the
    speculative config is pinned to it)."""
    settings = vllm.model_copy(update={"tensor_parallel_size": tensor_parallel_size,
                                       "host": host})
    return vllm_argv(settings, model=model, commit=commit, node_flags=node_flags,
                     drafter=drafter)


def serve_chat_template(vllm: VllmConfig) -> str | None:
    """The text of the chat template vLLM is given (shipped in config/recipes_data/), or None
    for the model's own."""
    return chat_template_text(vllm.chat_template) if vllm.chat_template is not None else None


def local_url(host: str, port: int) -> str:
    """The main vLLM's API as the head reaches it (where it listens: loopback or the head's
    fabric address, never the management network)."""
    return f"http://{host}:{port}"


def port_labels(vllm: VllmConfig, cluster: Cluster) -> dict[str, str]:
    """The host ports the head's vLLM listens on, as labels preflight reads (another stack that
    would listen there is refused): the API, and with vllm.executor mp on more than one node the
    torch.distributed master port the other ranks join."""
    labels = {lbl.PORT: str(vllm.port)}
    if vllm.executor == "mp" and len(cluster.nodes) > 1:
        labels["spark-vllm.master-port"] = str(vllm.master_port)
    return labels


def head_health_url(host: str, port: int) -> str:
    """The head's /health as the other nodes reach it (mp): at the head's fabric address, where
    vLLM listens with mp on more than one node (config/listen.vllm_host; config refuses a
    loopback `vllm.host` there)."""
    return f"http://{host}:{port}/health"


def serve_check_env(env: Mapping[str, str], *, ray: bool, head: bool) -> dict[str, str]:
    """The VLLM_* variables a node's vLLM process gets from the stack: its containers' (the
    nodes' env, a recipe's, the compile caches, Ray's IPC folder) and, for the head's Ray
    driver, its config folder. Only VLLM_* ones: the check is vLLM's, and no secret is among
    them (the API key is read from a file by the launcher)."""
    out = {k: val for k, val in env.items() if k.startswith("VLLM_")}
    if ray and head:
        out["VLLM_CONFIG_ROOT"] = VLLM_CONFIG_ROOT
    return dict(sorted(out.items()))


def model_file_problem(path: str | None, manifest: ModelManifest, key: str) -> str | None:
    """Why `path` (a file the serve settings load from the model repo: a reasoning parser
    plugin) is not a file of the served commit, or None: vLLM reads it offline from the
    snapshot the stack fetched and verified, so it must be one of the commit's files."""
    if path is None or path in {f.path for f in manifest.files}:
        return None
    return (f"spark-vllm:{key}: got {path!r}; expected a file of {manifest.repo} at "
            f"{manifest.commit} (its files at the hub: {len(manifest.files)}; the stack serves "
            "the commit offline, so a file it does not hold cannot be loaded)")


def extra_args_request(extra_args: Sequence[str]) -> dict[str, Any]:
    """The serve check's part for extraArgs: the tokens, and the flags whose destinations they
    may not set (config/serve.py) with why; nothing when there are none (the request of a stack
    without extraArgs stays as it was)."""
    if not extra_args:
        return {}
    return {"extraArgs": list(extra_args), "owned": dict(OWNED_FLAGS),
            "forbidden": dict(FORBIDDEN_FLAGS)}


def transport_nodes(vllm: VllmConfig, cluster: Cluster) -> list[str]:
    """The nodes whose NCCL transport the head's vLLM log must show: none on one node (no
    inter-node transport), the head only with vllm.executor mp (the other ranks log into their
    own containers), every node with Ray (its workers' lines reach the driver's log)."""
    if len(cluster.nodes) < 2:
        return []
    if vllm.executor == "mp":
        return [cluster.head.name]
    return [n.name for n in cluster.nodes]


@dataclass
class VllmServerArgs:
    vllm: VllmConfig
    health: HealthConfig
    environment: str
    model: str  # the HF repo id vLLM serves
    host: str  # where its API listens (config/listen.vllm_host): loopback or a fabric address
    tensor_parallel_size: int
    cluster_gpus: int
    cluster: Cluster
    runtime: NodeRuntime
    labels: Mapping[str, str]  # managed + stack; the role is added per container
    ray: RayCluster | None  # None with vllm.executor mp
    manifest: ModelManifest  # the model at the hub: its shape sizes the memory fit's KV cache
    commit: pulumi.Input[str]
    model_bytes: pulumi.Input[int]
    api_key: pulumi.Output[str]  # configured or generated (StackSecrets): vLLM never serves open
    secrets: StackSecrets  # its api_key_label (an HMAC under the stack's label key)
    rdma: bool = False  # nccl.rdma: a TCP fallback of NCCL is then a finding
    nccl_debug: str = "WARN"
    after: list[pulumi.Resource] = field(default_factory=list)
    # what the serve checks wait for besides `after`: the model on every node (vLLM's engine
    # arguments resolve the served snapshot offline)
    checks_after: list[pulumi.Resource] = field(default_factory=list)
    # recon's reason to start vLLM again with unchanged flags (stack.vllm_restart_reason)
    restart_reason: str | None = None
    # per node, the memory shares (gpuMemoryUtilization) of the services placed there: the
    # policy pack adds them to this model's (policies/rules/memory.py)
    service_shares: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # the VLLM_* names the stack file or its recipe set (nccl.extraEnv): the serve check refuses
    # one the image's vLLM does not know, in every environment
    declared_env: Sequence[str] = ()
    # model.drafter (another repo's speculative drafter) at its commit, fetched and verified
    # like the model (components/model_cache.py): vLLM's speculative config is pinned to it
    drafter: ModelCache | None = None
    image_ref: str = ""  # the image as the stack names it (the verified deployment's summary)


class VllmServer(pulumi.ComponentResource):
    serve: docker.Container  # the head's (the API)
    headless: dict[str, docker.Container]  # mp: the other nodes' `--headless` vLLM
    ranks_restart: remote.Command | None  # mp on more than one node
    serve_checks: dict[str, remote.Command]  # per node: the serve command in the image's vLLM
    serve_check: pulumi.Output[dict[str, str]]
    health: remote.Command
    deployment_nodes: dict[str, remote.Command]  # the other nodes' record or put-back step
    deployment: remote.Command  # the head's: the summary, or the up's failure (issue 49)
    nccl_log: remote.Command
    transport_check: remote.Command
    transport: pulumi.Output[dict[str, str]]
    direct_url: str
    argv: pulumi.Output[list[str]]

    def __init__(
        self, name: str, args: VllmServerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        plugin_problem = model_file_problem(args.vllm.reasoning_parser_plugin, args.manifest,
                                            "vllm.reasoningParserPlugin")
        if plugin_problem is not None:
            raise ValueError(plugin_problem)
        props = self._props(args)
        super().__init__(types.VLLM_SERVER, name, props, opts)
        v, ray, head = args.vllm, args.ray, args.cluster.head
        names = args.runtime.names
        self.argv = self._argv(args, head)
        # A key file gone behind the stack (another stack's destroy on shared nodes) is written
        # again: recon saw it absent, so the command gets a fresh trigger (rerun.Again);
        # the command is deleted before it is replaced (its delete removes the file)
        again = Again.when_wiped([rerun.fresh_trigger()]
                                 if head.facts.vllm_key_present is False else [])
        self.api_key_file = head.command(
            f"{name}-api-key",
            self,
            create=main_key_write(names),
            delete=main_key_remove(names),
            stdin=args.api_key,
            secret_outputs=["stdin", "stdout"],
            logging=remote.Logging.STDERR,  # its stdout (the file's hash) is for a label only
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            delete_before_replace=True,
        )
        self._serve_checks(name, args)
        # Without Ray nothing else makes the nodes' compile-cache folders
        self.caches = (ray.caches if ray is not None
                       else compile_cache_dirs(name, self, args.cluster, names))
        self.headless = {
            n.name: self._container(f"{name}-serve-{n.name}", args, n)
            for n in (args.cluster.workers if ray is None else ())
        }
        self.serve = self._container(f"{name}-serve", args, head)
        # Recon's reason to look at vLLM again with unchanged flags (its container found stopped
        # behind the stack) travels in `triggers`; when there is none, ignore_changes keeps
        # whatever marker the state holds, so nothing diffs. A new marker replaces the gate,
        # whose create starts the container again and waits for health.
        restart = Again.because(args.restart_reason)
        gate_after: list[pulumi.Resource] = [self.serve, *self.headless.values()]
        self.ranks_restart = None
        if self.headless:
            # mp: a rank found stopped restarts the head's vLLM, and the headless ranks follow
            # it, so all start again together. The reason travels on stdin, whose change is an
            # update (`update` runs); on creation nothing needs restarting.
            self.ranks_restart = head.command(
                f"{name}-ranks-restart",
                self,
                create="true",
                update=vllm_ranks_restart(names.serve),
                stdin=restart.marker,
                ignore_changes=["stdin"] if restart.ignore_changes else None,
                depends_on=gate_after,
            )
            gate_after.append(self.ranks_restart)
        parts = self._parts(args)
        ids = pulumi.Output.all(
            self.serve.id, *[c.id for c in self.headless.values()],
            *([ray.container_ids] if ray is not None else [])
        ).apply(lambda a: " ".join(a))
        self.health = head.command(
            f"{name}-health",
            self,
            create=ids.apply(
                lambda i: vllm_health_gate(
                    names.serve,
                    # the probe runs in the Ray head container, which outlives vLLM's restarts;
                    # without Ray in the vLLM container (the gate stops it if vLLM exits)
                    names.ray_head if ray is not None else names.serve,
                    i,
                    local_url(args.host, v.port),
                    v.served_model_name,
                    args.health.smoke_prompt,
                    args.health.timeout_seconds,
                    key_file=names.vllm_key_file,
                    deployment=GateRestore(
                        node=parts[head.name][1], api=names.serve, shape=shape(parts),
                        on_failure=args.health.on_failure),
                )
            ),
            triggers=restart.triggers,
            ignore_changes=restart.ignore_changes,
            delete_before_replace=True,
            depends_on=gate_after,
            timeout_seconds=args.health.timeout_seconds + 300,
        )
        self._deployment(name, args, parts)
        self._transport(name, args)
        # where the head reaches vLLM (the gateway's backend); not for clients, which use the
        # gateway (components/gateway.py)
        self.direct_url = local_url(args.host, v.port)
        # The reviewable props are outputs too: stack-level policies (vllm-api-key) see a
        # component's registered outputs, not the inputs that resource-level policies see.
        self.register_outputs(
            {
                **props,
                "directUrl": self.direct_url,
                "servedModelName": v.served_model_name,
                "container": self.serve.name,
                "health": self.health.stdout,
                "deployment": self.deployment.stdout,
                "ncclTransport": self.transport,
                "serveCheck": self.serve_check,
            }
        )

    @staticmethod
    def _argv(args: VllmServerArgs, node: SparkNode) -> pulumi.Output[list[str]]:
        """`vllm serve` on `node`: with Ray the head's only; with mp every node's, with its rank."""
        v, cluster = args.vllm, args.cluster
        flags: list[str] = []
        if v.executor == "mp" and len(cluster.nodes) > 1:
            rank = [n.name for n in cluster.nodes].index(node.name)
            flags = mp_node_flags(len(cluster.nodes), rank, cluster.head.fabric_ip, v.master_port)
        drafter = args.drafter
        if drafter is None:
            return pulumi.Output.from_input(args.commit).apply(
                lambda c: serve_argv(v, args.model, c, args.tensor_parallel_size, flags,
                                     host=args.host))
        return pulumi.Output.all(args.commit, drafter.commit).apply(
            lambda c: serve_argv(v, args.model, c[0], args.tensor_parallel_size, flags,
                                 host=args.host, drafter=Drafter(drafter.config.repo, c[1])))

    def _container(self, res_name: str, args: VllmServerArgs, node: SparkNode) -> docker.Container:
        """A vLLM container on `node`: with Ray, the head's Ray driver (see the module
        docstring); with mp, the head's API server or another node's headless vLLM."""
        v, ray, runtime = args.vllm, args.ray, args.runtime
        names = runtime.names
        is_head = node is args.cluster.head
        env = runtime.vllm_env(node)
        mounts = runtime.mounts()
        labels = {**args.labels, lbl.ROLE: lbl.VLLM_SERVE, lbl.NODE: node.name}
        # a restore's id when recon found this node's vLLM put back by one (components/deployment)
        extra_labels: list[docker.ContainerLabelArgs] = restore_labels(
            node, names.serve, args.labels[lbl.STACK])
        uploads: list[docker.ContainerUploadArgs] = []
        # the serve command checked in the image on every node before a container is replaced
        depends: list[pulumi.Resource] = [self.caches[node.name], *args.after,
                                          *self.serve_checks.values()]
        ray_opts: dict[str, Any] = {}
        ipc: pulumi.Input[str] = "private"  # its own IPC namespace (mp: every rank of the node)
        if is_head:
            labels.update(port_labels(v, args.cluster))
            mounts.append(docker.ContainerMountArgs(
                target=VLLM_KEY, type="bind", source=names.vllm_key_file, read_only=True))
            # the node's guard: its watchdog reads the node's OOM kills (components/guard.py)
            if args.health.liveness.enabled:
                mounts += runtime.guard_mounts(node)
                extra_labels += runtime.guard_labels(node)
                depends += runtime.guard_after(node)
            extra_labels.append(docker.ContainerLabelArgs(
                label="spark-vllm.api-key",
                value=args.secrets.api_key_label(self.api_key_file.stdout)))
            depends.append(self.api_key_file)
            template = serve_chat_template(v)
            if template is not None:
                uploads.append(docker.ContainerUploadArgs(file=CHAT_TEMPLATE, content=template))
            if self.headless:  # mp: a replaced headless vLLM replaces the head's, which
                # would otherwise serve on with a dead rank until its next request fails
                extra_labels.append(docker.ContainerLabelArgs(
                    label="spark-vllm.headless-containers",
                    value=pulumi.Output.all(*[c.id for c in self.headless.values()]).apply(
                        lambda ids: " ".join(ids))))
                depends += list(self.headless.values())
        if ray is not None:  # the head's Ray driver
            env.update({"RAY_ADDRESS": f"{node.fabric_ip}:{ray.args.ray.port}",
                        "VLLM_CONFIG_ROOT": VLLM_CONFIG_ROOT})
            uploads.append(docker.ContainerUploadArgs(
                file=f"{VLLM_CONFIG_ROOT}/ray_non_carry_over_env_vars.json",
                content=non_carry_over_json(NON_CARRY_OVER)))
            extra_labels += [
                ray.token_label(node),
                # a replaced Ray container replaces vLLM: it must start on the new cluster
                docker.ContainerLabelArgs(label="spark-vllm.ray-containers",
                                          value=ray.container_ids),
            ]
            ray_opts = {
                "volumes": [session_volume(names)],
                # a Ray driver finds its raylet among the processes it sees: the Ray head's
                "pid_mode": ray.head.id.apply(lambda i: f"container:{i}"),
            }
            # and shares its /dev/shm (Ray's object store, compiled graphs' channels): the Ray
            # head's IPC namespace, the stack's own on this node, never the host's
            ipc = ray.head.id.apply(lambda i: f"container:{i}")
            depends += [ray.ready, ray.head, *ray.workers.values()]
        # a container a restore put back under this name goes first (components/deployment.py)
        depends += restored_removal(res_name, self, node, names.serve,
                                    args.labels[lbl.STACK], depends)
        return docker.Container(
            res_name,
            name=names.serve,
            # the head's vLLM restarted when it stops serving (payloads/vllm_liveness.py); a
            # headless rank follows the head's restarts (payloads/vllm_rank_watch.py)
            entrypoints=watched_entrypoint(local_url(args.host, v.port), v.served_model_name,
                                           "generate", args.health.liveness, runtime.oom)
            if is_head else serve_entrypoint(head_health_url(args.host, v.port), runtime.oom),
            command=self.argv if is_head else self._argv(args, node),
            envs=[f"{k}={val}" for k, val in sorted(env.items())],
            mounts=mounts,
            uploads=uploads or None,
            labels=[
                *(docker.ContainerLabelArgs(label=k, value=val)
                  for k, val in sorted(labels.items())),
                *extra_labels,
            ],
            # vLLM's own shutdown (SIGTERM) frees the GPU memory; give it time before SIGKILL
            destroy_grace_seconds=60,
            **ray_opts,
            **runtime.runtime(node, ipc_mode=ipc),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.provider,
                # its name, and its port and GPU on the host network: the old one goes first
                delete_before_replace=True,
                depends_on=depends,
            ),
        )

    @staticmethod
    def _parts(args: VllmServerArgs) -> dict[str, tuple[SparkNode, NodeDeployment]]:
        """Per node, the containers of the main model in start order (the Ray head before the
        head's vLLM) with the files the stack uploads into them, and the node's record folder."""
        names, v = args.runtime.names, args.vllm
        folder = names.deployment_dir()
        template: tuple[str, ...] = (CHAT_TEMPLATE,) if v.chat_template is not None else ()
        out: dict[str, tuple[SparkNode, NodeDeployment]] = {}
        for node in args.cluster.nodes:
            held: tuple[Held, ...]
            if node is args.cluster.head:
                files = template
                if args.ray is not None:
                    files += (f"{VLLM_CONFIG_ROOT}/ray_non_carry_over_env_vars.json",)
                held = ((Held(names.ray_head),) if args.ray is not None else ()) + (
                    Held(names.serve, files),)
            else:
                held = (Held(names.ray_worker if args.ray is not None else names.serve),)
            out[node.name] = (node, NodeDeployment(folder, held))
        return out

    def _deployment(self, name: str, args: VllmServerArgs,
                    parts: dict[str, tuple[SparkNode, NodeDeployment]]) -> None:
        """After the gate (issue 49): every other node's record or put-back step, then the
        head's, which records the summary or fails the `up` (components/deployment.py)."""
        v, head, names = args.vllm, args.cluster.head, args.runtime.names

        def final(verdict: GateVerdict, others: dict[str, str], commit: str) -> str:
            return vllm_deployment_final(
                parts[head.name][1], verdict, others, api_container=names.serve,
                probe_container=names.ray_head if args.ray is not None else names.serve,
                health_url=local_url(args.host, v.port), served_model_name=v.served_model_name,
                smoke_prompt=args.health.smoke_prompt, timeout=args.health.timeout_seconds,
                key_file=names.vllm_key_file,
                facts=summary_facts(
                    image=args.image_ref, repo=args.model, commit=commit,
                    served_name=v.served_model_name, shape=shape(parts),
                    drafter=drafter(v.speculative_config, args.model, commit)))

        self.deployment_nodes, self.deployment = deployment_steps(
            name, self, self.health, head, parts, names, final,
            timeout_seconds=args.health.timeout_seconds + 300,
            extra=[pulumi.Output.from_input(args.commit)],
        )

    def _serve_checks(self, name: str, args: VllmServerArgs) -> None:
        """On every node, before any vLLM container is replaced: the exact serve argv (the
        head's with Ray, the node's own with mp) and every VLLM_* variable its container gets,
        through the serving image's own vLLM (hostscripts/payloads/image_probe.py with a
        request). A rejected flag or refused value fails the `up` everywhere; outside dev an
        unknown variable or a check that could not run does too. The request is in the
        command's text: it runs again exactly when the argv, the env or the image change."""
        runtime, v = args.runtime, args.vllm
        head = args.cluster.head
        labels = {**args.labels, lbl.ROLE: lbl.SERVE_CHECK}
        template = serve_chat_template(v)
        strict = args.environment != "dev"
        self.serve_checks = {}
        for node in args.cluster.nodes:
            argv = self._argv(args, node if v.executor == "mp" else head)
            env = serve_check_env(runtime.env(node), ray=args.ray is not None,
                                  head=node is head)

            def request(values: list[Any], env: dict[str, str] = env) -> str:
                words, image = values
                return image_probe(image or "", labels, {
                    "argv": list(words)[2:], "env": env, "strict": strict, "timeout": 300,
                    "chatTemplate": ({"path": CHAT_TEMPLATE, "text": template}
                                     if template is not None else None),
                    **extra_args_request(v.extra_args),
                    **({"declaredEnv": sorted(args.declared_env)} if args.declared_env else {}),
                }, hf_cache=runtime.cache_dir)

            self.serve_checks[node.name] = node.command(
                f"{name}-serve-check-{node.name}",
                self,
                create=pulumi.Output.all(argv, runtime.image_ids[node.name]).apply(request),
                depends_on=[*args.after, *args.checks_after],
            )

        def lines(stdouts: dict[str, str]) -> dict[str, str]:
            out = {}
            for node_name, text in sorted(stdouts.items()):
                try:
                    out[node_name] = parse_serve_check(node_name, text or "").line()
                except ImageProbeError as exc:
                    out[node_name] = f"unreadable: {exc}"
            return out

        self.serve_check = pulumi.Output.all(
            **{n: c.stdout for n, c in self.serve_checks.items()}).apply(lines)

    def _transport(self, name: str, args: VllmServerArgs) -> None:
        """After the health gate: which transport NCCL chose on every node, read from the
        running vLLM's log (inspection/nccl_transport.py). With nccl.rdma it fails closed: a
        TCP fallback, or a node of `transport_nodes` whose transport the log does not show,
        fails the `up` outside dev and warns in dev. Runs again whenever the gate ran again (the
        container's ID and the gate's run are in the text)."""
        head = args.cluster.head
        names = {f.ip: n.name for n in args.cluster.nodes for f in n.node.fabric}
        expected = transport_nodes(args.vllm, args.cluster)
        self.nccl_log = head.command(
            f"{name}-nccl-log",
            self,
            create=pulumi.Output.all(self.serve.id, self.health.id).apply(
                lambda a: vllm_nccl_lines(
                    args.runtime.names.serve,
                    hashlib.sha256(f"{a[0]}\n{a[1]}".encode()).hexdigest()[:16],
                )
            ),
            logging=remote.Logging.STDERR,  # the lines are kept in its stdout, not logged
            depends_on=[self.deployment],  # a verified deployment only
        )
        judged = self.nccl_log.stdout.apply(
            lambda text: verdict(
                parse_transport(text or "", head.fabric_ip),
                names=names,
                rdma=args.rdma,
                strict=args.environment != "dev",
                nccl_debug=args.nccl_debug,
                expected=expected,
            )
        )
        self.transport = judged.apply(lambda v: v.lines)
        self.transport_check = head.command(
            f"{name}-transport",
            self,
            create=judged.apply(
                lambda v: verdict_script(
                    "nccl transport",
                    [f"{n}: {line}" for n, line in sorted(v.lines.items())],
                    v.problems,
                    v.warnings,
                )
            ),
        )

    @staticmethod
    def _props(args: VllmServerArgs) -> VllmServerProps:
        """What the policy pack reviews (memory fit, parallelism, API key, ...)."""
        v = args.vllm
        # memory-fit's numbers per rank: inspection/memory_fit.estimate (what preflight uses too)
        # on the shape the hub read from this commit's config.json. The pack runs in its own
        # virtualenv and cannot import the program, so the numbers travel as props.
        tp = args.tensor_parallel_size

        def fit(values: list[Any]) -> MemoryFitProps:
            _commit, model_bytes = values
            return memory_fit.estimate(
                args.manifest.shape,
                model_bytes=int(model_bytes) if model_bytes else None,
                tensor_parallel_size=tp, pipeline_parallel_size=v.pipeline_parallel_size,
                max_model_len=v.max_model_len, max_num_seqs=v.max_num_seqs,
                kv_cache_dtype=v.kv_cache_dtype, speculative_config=v.speculative_config,
                prefix_caching=v.enable_prefix_caching,
            ).props()

        nodes: list[ServerNodeProps] = []
        for n in args.cluster.nodes:
            node: ServerNodeProps = {"name": n.name, "memTotalBytes": n.facts.memory.total_bytes,
                                     "unifiedMemory": n.facts.memory.unified}
            if args.service_shares.get(n.name):
                node["services"] = dict(args.service_shares[n.name])
            nodes.append(node)
        props: VllmServerProps = {
            "environment": args.environment,
            "executor": v.executor,
            "tensorParallelSize": args.tensor_parallel_size,
            "pipelineParallelSize": v.pipeline_parallel_size,
            "clusterGpus": args.cluster_gpus,
            "gpuMemoryUtilization": v.gpu_memory_utilization,
            "maxModelLen": v.max_model_len,
            "kvCacheDtype": v.kv_cache_dtype,
            "enforceEager": v.enforce_eager,
            "modelBytes": args.model_bytes,
            "servedModelName": v.served_model_name,
            "host": args.host,
            "port": v.port,
            "nodes": nodes,
            "maxNumSeqs": v.max_num_seqs,
            "memoryFit": pulumi.Output.all(args.commit, args.model_bytes).apply(fit),
            "apiKey": pulumi.Output.secret(args.api_key),
        }
        if v.executor == "mp" and len(args.cluster.nodes) > 1:
            # the rendezvous: where the ranks meet (policies/rules/rendezvous.py judges it and
            # the head's NodeFirewall rule for the master port)
            props["masterAddr"] = args.cluster.head.fabric_ip
            props["masterPort"] = v.master_port
        if v.kv_cache_memory_bytes is not None:  # the KV cache size the policy's memory fit uses
            props["kvCacheMemoryBytes"] = v.kv_cache_memory_bytes
        if v.trust_remote_code:  # the code it runs, repo and commit: policies/rules/remote_code.py
            props["trustRemoteCode"] = True
            code: list[RemoteCodeProps] = [{"repo": args.model, "commit": args.commit}]
            if args.drafter is not None:
                code.append({"repo": args.drafter.config.repo, "commit": args.drafter.commit})
            props["remoteCode"] = code
        return props
