"""`spark-vllm init -s STACK HOST [HOST...]`: from host names to a stack file, in one command.

    spark-vllm init -s staging spark-a.lan spark-b.lan --key ~/.ssh/id_ed25519 \\
        --image registry.lan/vllm-spark@sha256:... --gateway-image registry.lan/haproxy@sha256:...
    spark-vllm init -s trial spark-1=10.77.0.11 spark-2=10.77.0.12 --like dev \\
        --accept-host-key SHA256:... --accept-host-key SHA256:... --yes

1. Each host's SSH host key (ssh-keyscan) is shown as its SHA256 fingerprint and pinned only
   once the operator confirms it, or when it is one given with --accept-host-key: never trust
   on first use silently. Every later connection trusts that key only (a host presenting
   another one is refused as recon refuses it).
2. Each host is surveyed by recon's own read-only script (one ssh round trip per host), and
   inspection/day_zero.py proposes the nodes (the first host is the head), their cabled
   ConnectX-7 interfaces and RoCE devices, an address per twin in a subnet per twin (keeping
   the addresses the nodes have), the GPU count, and says what the hosts already hold (vLLM
   images, Hugging Face caches, containers that are not the stack's). What it cannot see it
   does not guess: a finding, and nothing is written.
3. The stack file is written by Pulumi's own CLI (`pulumi config set-all --json`, typed; the
   SSH key as a secret with --key-secret, through stdin) into a scratch copy first, whose diff
   against the stack file is shown before anything is replaced. A stack file that exists is
   never overwritten without --force.
4. It ends with the preflight `pulumi preview` runs (tools/recon_report.py; the model's size
   is checked against memory by the preview itself, which asks the hub), and the next command.

Run it in the project's folder (where Pulumi.yaml is), with the Pulumi backend and passphrase
of your stacks in the environment (make sets both; README "Running a stack").
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import ValidationError

from config import NAMESPACE, SECRET_KEYS, ConfigError, NodeConfig, plain_value, validate_config
from config.models import PINNABLE
from inspection import day_zero, recon
from tools.terminal import sanitize_lines

DEFAULT_MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
SURVEY_IMAGE = "spark-vllm/survey:none"  # the survey's config needs one; never used
# The survey's own node entry needs a fabric interface to validate; it is never probed
# (speed_of=()) and never written: the proposal's come from what the node shows.
SURVEY_NET = "192.0.2.0/24"  # TEST-NET-1 (RFC 5737): addresses of the survey's config only


def survey_fabric(index: int) -> dict[str, str]:
    return {"interface": "survey", "ip": f"192.0.2.{index + 1}"}

KeyScan = Callable[[str, int, float], str]


def keyscan(host: str, port: int, timeout: float) -> str:
    """LIVE PATH: `ssh-keyscan` of the host's ed25519 and ECDSA keys (its stdout)."""
    done = subprocess.run(["ssh-keyscan", "-T", str(int(timeout)), "-t", "ed25519,ecdsa",
                           "-p", str(port), host], capture_output=True, text=True,
                          timeout=timeout + 5)
    return done.stdout


def pulumi(args: Sequence[str], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """LIVE PATH: Pulumi's CLI, its output captured."""
    return subprocess.run(["pulumi", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


KEYSCAN: KeyScan = keyscan
PULUMI: Callable[..., subprocess.CompletedProcess[str]] = pulumi
RUNNER: recon.Runner = recon.ssh_round_trip


class InitError(click.ClickException):
    """A refusal: printed as `error: ...`, exit code 1, nothing written."""

    exit_code = 1

    def format_message(self) -> str:
        return sanitize_lines(self.message)  # it may name what a node answered


@dataclass(frozen=True)
class Target:
    name: str | None  # NAME= given
    host: str
    user: str
    port: int

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def parse_target(text: str, user: str, port: int) -> Target:
    """`[NAME=][USER@]HOST[:PORT]`, each part validated as the stack's config validates it."""
    name, _, rest = text.rpartition("=") if "=" in text else ("", "", text)
    if "@" in rest:
        user, rest = rest.split("@", 1)
    host, _, port_text = rest.partition(":")
    if port_text:
        if not port_text.isdigit():
            raise click.BadParameter(f"{text!r}: the port after ':' is not a number")
        port = int(port_text)
    raw = {"name": name or "survey", "host": host, "user": user, "port": port,
           "fabric": [survey_fabric(0)]}
    try:
        NodeConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        raise click.BadParameter(f"{text!r}: {problems}") from None
    return Target(name or None, host, user, port)


def check_subnet(text: str) -> str:
    """A fabric subnet as nccl.fabricSubnets takes it: IPv4 CIDR, its network address, /16 to
    /30, not link-local."""
    import ipaddress

    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: {exc} (expected e.g. 192.168.177.0/24)",
                                 param_hint="--subnet") from None
    if not 16 <= net.prefixlen <= 30 or net.is_link_local:
        raise click.BadParameter(f"{text!r}: expected a /16 to /30 subnet of the fabric's own, "
                                 "not link-local", param_hint="--subnet")
    return str(net)


def scanned_key(target: Target, text: str) -> str:
    """The strongest pinnable key in ssh-keyscan's output (ed25519 first)."""
    keys = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#") and parts[1] in PINNABLE:
            keys.append(f"{parts[1]} {parts[2]}")
    keys.sort(key=lambda k: PINNABLE.index(k.split()[0]))
    if not keys:
        raise InitError(f"{target.host}: no ed25519 or ECDSA host key from ssh-keyscan -p "
                        f"{target.port} {target.host} (is sshd listening there?)")
    return keys[0]


def confirm_key(target: Target, key: str, accepted: Sequence[str], *, interactive: bool) -> None:
    """Pin `key` only if its fingerprint is one the operator accepted, or they confirm it now."""
    fp = day_zero.fingerprint(key)
    click.echo(f"{target.host}:{target.port} presents {key.split()[0]} {fp}")
    if accepted:
        if fp not in accepted:
            raise InitError(
                f"{target.host}: its host key {fp} is not one you accepted (--accept-host-key "
                f"{', '.join(accepted)}): not pinned, nothing written. Compare with "
                f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the host's console")
        return
    if not interactive:
        raise InitError(
            f"{target.host}: cannot ask you to confirm {fp} (no terminal): check it on the "
            f"host's console (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`) and pass "
            f"--accept-host-key {fp}")
    if not click.confirm(f"  is this {target.host}'s key (compare it on the host's console)? "
                         "Pin it", default=False):
        raise InitError(f"{target.host}: host key not confirmed: nothing written")


def survey_config(targets: Sequence[Target], keys: Sequence[str], key_file: str,
                  model: str, cache_dir: str | None, timeout: int) -> Any:
    """The config recon's script is made from: the hosts with their confirmed keys (names
    provisional), the model whose cache to look at, and nothing else of a stack."""
    nodes = [{"name": t.name or f"host-{i + 1}", "host": t.host, "user": t.user,
              "port": t.port, "hostKey": k, "fabric": [survey_fabric(i)]}
             for i, (t, k) in enumerate(zip(targets, keys, strict=True))]
    model_cfg: dict[str, Any] = {"repo": model}
    if cache_dir:
        model_cfg["cacheDir"] = cache_dir
    try:
        return validate_config({
            "nodes": nodes, "ssh": {"privateKeyPath": key_file}, "image": {"ref": SURVEY_IMAGE},
            "model": model_cfg, "vllm": {"servedModelName": "survey"},
            "gateway": {"image": {"ref": SURVEY_IMAGE}}, "nccl": {"fabricSubnets": [SURVEY_NET]},
            "preflight": {"reconTimeoutSeconds": timeout},
        })
    except ConfigError as exc:  # the hosts as given (the same host twice, a name twice)
        raise InitError(f"cannot survey these hosts:\n{exc}") from None


def survey(targets: Sequence[Target], keys: Sequence[str], key_file: str, model: str,
           cache_dir: str | None, timeout: int) -> list[day_zero.Survey]:
    """Every host in parallel, one round trip each; a host that cannot be surveyed stops init."""
    cfg = survey_config(targets, keys, key_file, model, cache_dir, timeout)

    def one(node: NodeConfig) -> Any:
        try:
            return recon.survey_node(cfg, node, names=None, key_path=key_file, runner=RUNNER,
                                     speed_of=())
        except recon.ReconError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(cfg.nodes)) as pool:
        results = list(pool.map(one, cfg.nodes))
    failed = [r for r in results if isinstance(r, recon.ReconError)]
    if failed:
        raise InitError("\n".join(f"{t.host}: {r.reason}\n  fix: {r.fix}"
                                  for t, r in zip(targets, results, strict=True)
                                  if isinstance(r, recon.ReconError)))
    out = []
    for i, (t, k, facts) in enumerate(zip(targets, keys, results, strict=True)):
        out.append(day_zero.Survey(name=t.name or day_zero.node_name(facts.hostname, i),
                                   host=t.host, user=t.user, port=t.port, host_key=k,
                                   facts=facts))
    return out


def echo(text: str = "") -> None:
    """A line of what the nodes said: nothing in it a terminal would act on (issue 46:
    os-release fields, `ibdev2netdev` names and Docker's names come from the node)."""
    click.echo(sanitize_lines(text))


def print_survey(p: day_zero.Proposal, surveys: Sequence[day_zero.Survey]) -> None:
    gib = day_zero.GIB
    for i, s in enumerate(surveys):
        role = "head" if i == 0 else "worker"
        f = s.facts
        echo(f"\n{s.name} ({role}, {s.user}@{s.host}:{s.port}): "
                   f"{f.os.pretty_name or f.os.id or '?'}, {len(f.gpus)} GPU(s) "
                   f"{', '.join(sorted({g.name for g in f.gpus}))}, "
                   f"{f.memory.total_bytes / gib:.0f} GiB memory")
        for port in p.ports.get(s.name, []):
            state = "configured" if port.configured else "to configure"
            echo(f"  fabric {port.interface} ({port.hca}) {port.ip} [{state}], "
                       f"MTU {port.mtu}")
        for image in p.images.get(s.name, []):
            echo(f"  image {image}")
        for repo, size in p.caches.get(s.name, []):
            echo(f"  HF cache {repo} {size / gib:.1f} GiB")
        for name, image, memory in p.foreign.get(s.name, []):
            echo(f"  container {name} ({image}) {memory / gib:.1f} GiB, not the stack's")
    if p.findings:
        echo("")
    for finding in p.findings:
        echo(f"{finding.level}: {finding}")


def read_stack_values(path: Path) -> tuple[dict[str, Any], list[str]]:
    """A stack file's `spark-vllm:*` plaintext values (JSON strings decoded as the program
    reads them), and the names of the secrets it holds (never decrypted, never copied)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InitError(f"{path.name}: cannot read it ({exc})") from None
    raw: dict[str, Any] = {}
    secrets = []
    for key, value in (data.get("config") or {}).items():
        if not isinstance(key, str) or not key.startswith(f"{NAMESPACE}:"):
            continue
        name = key.split(":", 1)[1]
        if name in SECRET_KEYS or (isinstance(value, dict) and "secure" in value):
            secrets.append(name)
            continue
        raw[name] = plain_value(value, name)
    return raw, secrets


def proposed_config(p: day_zero.Proposal, base: dict[str, Any], *, key_file: str,
                    environment: str, model: str | None, image: str | None,
                    gateway_image: str | None) -> dict[str, Any]:
    """The stack's `spark-vllm:*` values: `base` (--like's, or nothing), with what init
    surveyed and what the options say on top. Raises InitError for what is left unknown."""
    raw: dict[str, Any] = json.loads(json.dumps(base))  # a deep copy
    raw["environment"] = environment
    raw["nodes"] = p.nodes
    ssh = raw.get("ssh") or {}
    ssh.pop("knownHostsFile", None)  # the keys are pinned in nodes[].hostKey
    raw["ssh"] = {**ssh, "privateKeyPath": key_file}
    raw["nccl"] = {**(raw.get("nccl") or {}), "fabricSubnets": p.subnets}
    vllm = raw.setdefault("vllm", {})
    vllm["tensorParallelSize"] = p.gpus
    model_cfg = raw.setdefault("model", {})
    if model or "repo" not in model_cfg:
        model_cfg["repo"] = model or DEFAULT_MODEL
        if model:
            model_cfg.pop("revision", None)
    vllm.setdefault("servedModelName", model_cfg["repo"].rsplit("/", 1)[-1].lower())
    if image:
        raw["image"] = {**(raw.get("image") or {}), "ref": image}
    elif "image" not in raw:
        on_head = p.images.get(p.nodes[0]["name"], [])
        if not on_head:
            raise InitError("no vLLM image on the head and no --image: pass the image to serve "
                            "(e.g. one built with eugr's spark-vllm-docker, pushed to your "
                            "registry)")
        everywhere = all(on_head[0] in images for images in p.images.values())
        raw["image"] = {"ref": on_head[0], "source": "registry" if everywhere else "head"}
    gateway = raw.setdefault("gateway", {})
    if gateway_image:
        gateway["image"] = {**(gateway.get("image") or {}), "ref": gateway_image}
    elif "image" not in gateway:
        raise InitError("no --gateway-image: the stack's endpoint is an HAProxy image you pin "
                        "(README, \"The gateway\"), or take it and the other settings from a "
                        "stack with --like")
    return raw


def stack_exists(stack: str) -> bool:
    done = PULUMI(["stack", "ls", "--json"])
    if done.returncode != 0:
        raise InitError("pulumi stack ls failed: " + (done.stderr.strip() or "no output")
                        + "\n  (is PULUMI_BACKEND_URL set, and are you in the project folder?)")
    try:
        names = [s.get("name", "") for s in json.loads(done.stdout or "[]")]
    except (ValueError, AttributeError):
        raise InitError("pulumi stack ls printed no JSON list") from None
    return any(n == stack or n.endswith(f"/{stack}") for n in names)


def _check(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        raise InitError(f"{what} failed: {done.stderr.strip() or done.stdout.strip()}")


def render(stack: str, path: Path, raw: dict[str, Any], *, key_secret: str | None,
           force: bool) -> tuple[str, bool]:
    """The stack file Pulumi's CLI writes for `raw`, written into a scratch copy (the stack file
    itself untouched until the operator confirms): (its text, whether the stack had to be
    created in the backend)."""
    created = False
    doc = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    if not stack_exists(stack):
        if force:
            # a file whose stack is gone: its salt belongs to a passphrase we may not have
            doc = {k: v for k, v in doc.items()
                   if k not in ("config", "encryptionsalt", "encryptedkey", "secretsprovider")}
        # `pulumi stack init` writes the new stack's salt into the project's stack file: it
        # runs in a scratch project (Pulumi.yaml and that file, copied), so the real file is
        # not edited before the operator confirms, nor left edited when the init fails
        # (issue 46: --force removed its config and salt first)
        with tempfile.TemporaryDirectory(prefix="spark-vllm-init-") as project:
            shutil.copy(path.parent / "Pulumi.yaml", Path(project) / "Pulumi.yaml")
            initial = Path(project) / path.name
            initial.write_text(yaml.safe_dump(doc, sort_keys=False) if doc else "")
            _check(PULUMI(["--cwd", project, "stack", "init", stack, "--no-select"]),
                   f"pulumi stack init {stack}")
            doc = yaml.safe_load(initial.read_text()) or {}
        created = True
    doc = {k: v for k, v in doc.items() if k != "config"}
    values = {f"{NAMESPACE}:{k}": ({"value": v, "secret": False} if isinstance(v, str) else
                                   {"value": json.dumps(v), "objectValue": v, "secret": False})
              for k, v in raw.items()}
    fd, scratch = tempfile.mkstemp(prefix=f".Pulumi.{stack}.", suffix=".yaml", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(yaml.safe_dump(doc, sort_keys=False) if doc else "")
        _check(PULUMI(["config", "set-all", "--stack", stack, "--config-file", scratch,
                       "--json", json.dumps(values)]), "pulumi config set-all")
        if key_secret is not None:  # on stdin: never on a command line
            _check(PULUMI(["config", "set", "--stack", stack, "--config-file", scratch,
                           "--secret", f"{NAMESPACE}:sshPrivateKey"], stdin=key_secret),
                   "pulumi config set --secret sshPrivateKey")
        return Path(scratch).read_text(), created
    finally:
        Path(scratch).unlink(missing_ok=True)


def write_stack_file(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@click.command("init")
@click.option("-s", "--stack", required=True,
              help="the stack to create: writes Pulumi.<stack>.yaml")
@click.argument("hosts", nargs=-1, required=True, metavar="[NAME=][USER@]HOST[:PORT]...")
@click.option("--user", default="root", show_default=True, help="ssh user of hosts naming none")
@click.option("--port", default=22, show_default=True, type=click.IntRange(1, 65535),
              help="ssh port of hosts naming none")
@click.option("--key", "key", default="~/.ssh/id_ed25519", show_default=True,
              help="ssh private key (written as ssh.privateKeyPath: the stack connects with it)")
@click.option("--key-secret", is_flag=True,
              help="also keep the key's content as the secret spark-vllm:sshPrivateKey")
@click.option("--accept-host-key", "accepted", multiple=True, metavar="SHA256:...",
              help="pin a host key with this fingerprint without asking (repeat per host)")
@click.option("--subnet", "subnets", multiple=True, metavar="CIDR", callback=lambda _c, _p, v:
              tuple(check_subnet(s) for s in v),
              help="the fabric subnet of twin 1, 2, ... (default: the nodes' own, else "
                   "192.168.177.0/24, 192.168.178.0/24)")
@click.option("--like", "like", metavar="STACK",
              help="start from this stack file's settings (not its nodes, ssh, fabric or secrets)")
@click.option("--model", default=None, help=f"model repo to serve (default: --like's, else "
                                             f"{DEFAULT_MODEL})")
@click.option("--revision", default=None, help="the model's commit (40 hex; prod wants one; "
                                                "default: --like's, else the branch main)")
@click.option("--cache-dir", default=None, help="the nodes' Hugging Face cache folder")
@click.option("--image", default=None, help="vLLM image (default: --like's, else one on the hosts)")
@click.option("--gateway-image", default=None, help="HAProxy image of the stack's endpoint")
@click.option("--environment", type=click.Choice(["dev", "staging", "prod"]), default=None,
              help="default: the stack's name if it is one of these, else --like's, else prod")
@click.option("--timeout", default=30, show_default=True, type=click.IntRange(5, 600),
              help="seconds each host's survey may take")
@click.option("--force", is_flag=True, help="overwrite a stack file that exists")
@click.option("--yes", "-y", is_flag=True, help="write the file after showing the diff, without "
                                                "asking")
def command(stack: str, hosts: tuple[str, ...], user: str, port: int, key: str, key_secret: bool,
            accepted: tuple[str, ...], subnets: tuple[str, ...], like: str | None,
            model: str | None, revision: str | None, cache_dir: str | None, image: str | None,
            gateway_image: str | None, environment: str | None, timeout: int, force: bool,
            yes: bool) -> None:
    """Survey HOSTs (the first is the head) and write Pulumi.<stack>.yaml for them."""
    root = Path.cwd()
    if not (root / "Pulumi.yaml").is_file():
        raise click.UsageError("run it in the project's folder (no Pulumi.yaml here)")
    path = root / f"Pulumi.{stack}.yaml"
    if path.exists() and not force:
        raise click.UsageError(f"{path.name} exists: init never overwrites a stack file without "
                               "--force (spark-vllm recon checks the one you have)")
    for fp in accepted:
        if not fp.startswith("SHA256:") or len(fp) != 50:
            raise click.BadParameter(f"{fp!r}: expected SHA256: and 43 base64 characters, as "
                                     "ssh-keygen -lf prints", param_hint="--accept-host-key")
    key_file = os.path.abspath(os.path.expanduser(key))
    if not Path(key_file).is_file():
        raise click.BadParameter(f"{key_file}: no such file (the stack's own connections need a "
                                 "key file; an agent alone is not enough)", param_hint="--key")
    targets = [parse_target(h, user, port) for h in hosts]
    base: dict[str, Any] = {}
    if like:
        base, secrets = read_stack_values(root / f"Pulumi.{like}.yaml")
        for name in ("nodes",):
            base.pop(name, None)
        if secrets:
            click.echo(f"not taken from {like}: the secret(s) {', '.join(secrets)} (set them "
                       f"with pulumi config set --secret -s {stack})")
    env = environment or (stack if stack in ("dev", "staging", "prod") else
                          base.get("environment", "prod"))
    model_repo = model or (base.get("model") or {}).get("repo") or DEFAULT_MODEL
    cache = cache_dir or (base.get("model") or {}).get("cacheDir")

    click.echo(f"host keys of {len(targets)} host(s):")
    interactive = sys.stdin.isatty()
    keys = []
    for t in targets:
        k = scanned_key(t, KEYSCAN(t.host, t.port, float(timeout)))
        confirm_key(t, k, accepted, interactive=interactive)
        keys.append(k)
    click.echo(f"surveying {', '.join(t.host for t in targets)} (read-only, one round trip "
               "each)...")
    surveys = survey(targets, keys, key_file, model_repo, cache, timeout)
    min_mtu = int((base.get("nccl") or {}).get("minMtu", 9000))
    managed = bool((base.get("fabric") or {}).get("manage", True))
    p = day_zero.propose(surveys, subnets=subnets, min_mtu=min_mtu, model_repo=model_repo,
                         managed=managed)
    print_survey(p, surveys)
    if p.errors:
        raise InitError(f"{len(p.errors)} finding(s) above stop init: nothing written")
    raw = proposed_config(p, base, key_file=key_file, environment=env, model=model,
                          image=image, gateway_image=gateway_image)
    if revision:
        raw["model"]["revision"] = revision
    try:
        validate_config(raw)
    except ConfigError as exc:
        raise InitError(f"the proposed config does not validate, nothing written:\n{exc}") \
            from None
    before = path.read_text() if path.exists() else ""
    secret = Path(key_file).read_text() if key_secret else None
    text, created = render(stack, path, raw, key_secret=secret, force=force)
    diff = "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                        text.splitlines(keepends=True),
                                        f"{path.name} (now)", f"{path.name} (proposed)"))
    echo(f"\n{diff}")
    if not yes and not (interactive and click.confirm(f"write {path.name}", default=True)):
        if created:  # the stack file was never touched: nothing to restore
            PULUMI(["stack", "rm", "--yes", "--preserve-config", stack])
        raise InitError(f"{path.name} not written" + ("" if interactive else
                                                       " (no terminal to ask: pass --yes)"))
    write_stack_file(path, text)
    click.echo(f"wrote {path.name}; preflight, as `pulumi preview -s {stack}` runs it:")
    from tools import recon_report

    rc = recon_report.main(["-s", stack, "--key", key_file, "--no-last-up"])
    if rc != 0:
        click.echo(f"\n{path.name} is written; fix what preflight says, check with "
                   f"`spark-vllm recon -s {stack}`, then: pulumi preview -s {stack}")
        sys.exit(rc)
    click.echo(f"\nnext: pulumi preview -s {stack}   (then pulumi up -s {stack})")
