"""`spark-vllm fabric test -s STACK [--key PATH] [--image ID] [--max-bytes N] [--json]`: the
collective bandwidth gate on demand, exactly as `pulumi up` runs it (components/collective.py):
recon surveys every node, each node gets its NCCL environment (components/nccl.node_env, from
the config and what recon found), and one rank per node runs hostscripts/collective.py's script
(the serving image's torch.distributed, NCCL on the GPU or Gloo without one) over ssh, all at
once; the verdict is inspection/collective.judge's against the stack's threshold
(fabric.collective.minBusGBps, NVIDIA's 21.875 GB/s for two nodes and 10 for more by default).

The image is the one the stack's serving containers run on each node (so run it on a converged
stack), or `--image` (an image ID every node holds). The ranks' containers are short-lived and
removed when done; nothing else on a node changes, and the stack's record (what `status` shows)
is left as the last `up` wrote it.

Exit codes: 0 the fabric carries the threshold, 1 below it or not measured, 2 a config, usage or
survey problem.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import click

from components.nccl import docker_extras, node_env, twins_up
from config import ConfigError, StackConfig
from config.forms import is_image_id
from contract import labels as lbl
from hostscripts.collective import collective_rank, rank_request
from hostscripts.paths import StackNames
from inspection import recon
from inspection.collective import (
    CollectiveError,
    NodeFabric,
    RankReport,
    judge,
    parse_rank,
    sweep,
)
from inspection.facts import NodeFacts
from inspection.preflight import serving_image
from tools import stack_access
from tools.recon_report import load_stack_config, stack_label

# (argv, script, timeout) -> (rc, stdout, stderr): one node's round trip; tests replace it
Runner = Callable[[list[str], str, float], tuple[int, str, str]]
# recon's survey of the stack's nodes; tests replace it
Survey = Callable[[StackConfig, StackNames, str | None], dict[str, NodeFacts]]


def ssh_runner(argv: list[str], script: str, timeout: float) -> tuple[int, str, str]:
    """LIVE PATH: ssh with the script on stdin."""
    done = subprocess.run(argv, input=script.encode(), capture_output=True, timeout=timeout)
    return (done.returncode, done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"))


def survey(cfg: StackConfig, names: StackNames, key: str | None) -> dict[str, NodeFacts]:
    """LIVE PATH: recon of every node (SurveyError names the ones it could not reach)."""
    return recon.survey(cfg, names=names, key_path=key)


RUNNER: list[Runner] = [ssh_runner]
SURVEY: list[Survey] = [survey]


def scripts(cfg: StackConfig, stack: str, facts: dict[str, NodeFacts], *,
            image: str | None, max_bytes: int | None) -> dict[str, str]:
    """Each node's rank script, as the stack's gate builds it. ValueError: no image to run."""
    names, label = StackNames(stack), stack_label(stack)
    gate = cfg.fabric.collective
    head_ip = cfg.head.primary.ip
    sizes = sweep(gate.min_bytes, max_bytes or gate.max_bytes,
                  [f.memory.available_bytes for f in facts.values()])
    extras = docker_extras(cfg.nccl)
    labels = {lbl.MANAGED: "true", lbl.STACK: label,
              lbl.ROLE: lbl.COLLECTIVE_GATE}
    out = {}
    for rank, node in enumerate(cfg.nodes):
        f = facts[node.name]
        ran = image or serving_image(f, label)
        if ran is None or not is_image_id(ran):
            raise ValueError(f"{node.name}: no container of the stack {label} runs there to take "
                             "the image from: `pulumi up` the stack first, or pass --image with "
                             "an image ID every node holds")
        env = node_env(cfg.nccl, node, f, head_ip)
        out[node.name] = collective_rank(
            names, ran, env,
            rank_request(rank=rank, world=len(cfg.nodes), master=head_ip, port=gate.port,
                         sizes=sizes, deadline=gate.timeout_seconds),
            labels, devices=extras.devices, cap_add=extras.cap_add,
            memlock_unlimited=extras.memlock_unlimited, nofile=cfg.ray.nofile)
    return out


def run_rank(cfg: StackConfig, node: str, script: str, key: str | None,
             timeout: float) -> RankReport | str:
    node_cfg = next(n for n in cfg.nodes if n.name == node)
    try:
        with stack_access.ssh_argv(cfg, node_cfg, key=key) as argv:
            rc, out, err = RUNNER[0](argv, script, timeout)
    except subprocess.TimeoutExpired:
        return f"{node}: no answer within {timeout:g} s"
    except OSError as exc:
        return f"{node}: could not run ssh: {exc}"
    if rc == 255:
        return str(recon.classify_ssh_failure(node_cfg, rc, err))
    try:
        return parse_rank(node, out)
    except CollectiveError as exc:
        return str(exc)


def fabrics(cfg: StackConfig, facts: dict[str, NodeFacts]) -> dict[str, NodeFabric]:
    """What the likely causes look at, per node (as components/collective.py gives them)."""
    out = {}
    for n in cfg.nodes:
        out[n.name] = NodeFabric(env=node_env(cfg.nccl, n, facts[n.name], cfg.head.primary.ip),
                                 twins=len(n.fabric), twins_up=len(twins_up(n, facts[n.name])))
    return out


@click.group("fabric", context_settings={"help_option_names": ["-h", "--help"]})
def group() -> None:
    """The fabric between the nodes: `test` measures its collective bandwidth."""


@group.command("test")
@click.option("-s", "--stack", default="dev", show_default=True,
              help="the stack: reads Pulumi.<stack>.yaml in the current folder")
@click.option("--key", help="ssh private key (default: spark-vllm:ssh.privateKeyPath)")
@click.option("--image", help="the image ID to run (default: the stack's serving containers')")
@click.option("--max-bytes", type=click.IntRange(min=4096, max=1 << 30), default=None,
              help="the sweep's largest size (default: fabric.collective.maxBytes)")
@click.option("--json", "as_json_", is_flag=True, help="print the verdict as JSON")
@click.pass_context
def test(ctx: click.Context, stack: str, key: str | None, image: str | None,
         max_bytes: int | None, as_json_: bool) -> None:
    """Measure all_gather and all_reduce between the stack's nodes, one rank per node, as the
    up's collective gate does (exit 0 at or above the threshold)."""
    try:
        cfg = load_stack_config(stack)
        stack_label(stack)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if image is not None and not is_image_id(image):
        raise click.UsageError(f"--image: {image!r} is not an image ID (sha256:<64 hex>)")
    if len(cfg.nodes) < 2:
        raise click.UsageError(f"stack {stack} has one node: there is no fabric to measure")
    try:
        facts = SURVEY[0](cfg, StackNames(stack), key)
    except recon.SurveyError as exc:
        click.echo(str(exc), err=True)
        ctx.exit(2)
    try:
        texts = scripts(cfg, stack, facts, image=image, max_bytes=max_bytes)
    except ValueError as exc:
        click.echo(str(exc), err=True)
        ctx.exit(2)
    gate = cfg.fabric.collective
    timeout = float(gate.timeout_seconds + 120)
    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        futures = {n: pool.submit(run_rank, cfg, n, t, key, timeout) for n, t in texts.items()}
        reports = {n: f.result() for n, f in futures.items()}
    mtu = cfg.fabric.mtu if cfg.fabric.manage else None
    verdict = judge(reports, threshold=gate.threshold(len(cfg.nodes)), enforce=True,
                    rdma=cfg.nccl.rdma, mtu=mtu, nodes=fabrics(cfg, facts), stops="")
    if as_json_:
        click.echo(json.dumps({**verdict.summary, "lines": verdict.lines}, indent=2,
                              sort_keys=True))
    else:
        for line in verdict.lines:
            click.echo(line)
        for problem in verdict.problems:
            click.echo(f"collective gate failed: {problem}", err=True)
    ctx.exit(0 if not verdict.problems else 1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(group())

