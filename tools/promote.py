"""Promote what a stack verified (image digest, model commit, serve flags) into another stack.

    promote.py --from dev --to staging [--yes] [--dry-run] [--refresh-only]

1. Verify the source stack on the configured backend (PULUMI_BACKEND_URL, passphrase from
   PULUMI_CONFIG_PASSPHRASE / PULUMI_CONFIG_PASSPHRASE_FILE): its latest operation succeeded and
   its latest `update` succeeded (`stack.history`); nothing drifted (`refresh --preview-only`
   shows no change); the program with the source's config changes nothing (`preview`, the same
   project's program, run by the CLI; skipped with --refresh-only); the promoted keys in
   Pulumi.<from>.yaml equal the config the last update ran with; and the deployment the last
   update left is one its health gates verified (the stack output `deployment`, issue 49: the
   commit and image it promotes, and each promoted service's).
2. Take the artifacts of that last update: `image.ref` pinned by digest (a tag is pinned with the
   repo digest recorded in the state), `model.repo` + the resolved commit (output `modelCommit`)
   as `model.revision`, and every serve key under `vllm.*` but the environment's own
   (config/serve.py: PROMOTED_KEYS; the environment's are where vLLM listens and the
   parallelism);
   for each entry of the target's `services` that the source served under the same name, its
   repo and the commit it resolved (output `services.<name>`) as its `revision`; and the
   speculative drafter of another repo the source served (`model.drafter`, output `drafter`),
   its repo and resolved commit, with the model.
3. Write them into the target stack's config (Pulumi.<to>.yaml) with `pulumi config set-all
   --json` (typed `config set`: floats, objects and empty lists stay typed), after showing the
   planned unified diff (computed on a scratch copy) and asking (unless --yes). --dry-run stops
   after the planned diff. Secrets are never read, copied or changed.

Exit codes: 0 promoted (or dry run shown), 1 engine/CLI failure, 2 usage or environment problem,
3 source not verified (never deployed, last update failed, destroyed, no deployment its health
gates verified), 4 source drifted or its
config changed since the last update, 5 an artifact is unpinned or missing (always fatal for a
prod target), 6 not confirmed, 7 the promoted values make the target config invalid (a promoted
key, or any other key such as `services.*` that was valid before the promotion).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config.forms import DIGEST_REF, NAMESPACE, SECRET_KEYS, is_commit, is_digest_ref
from config.load import plain_value
from config.serve import ENVIRONMENT_KEYS, PROMOTED_KEYS, SERVE_KEYS

if TYPE_CHECKING:  # imported where used: `--help` and the unit tests need no engine
    import pulumi.automation as auto

PROJECT = NAMESPACE  # the Pulumi project (Pulumi.yaml) names the config namespace
NS = f"{NAMESPACE}:"

EXIT_OK = 0
EXIT_ENGINE = 1
EXIT_USAGE = 2
EXIT_UNVERIFIED = 3
EXIT_DRIFT = 4
EXIT_UNPINNED = 5
EXIT_NOT_CONFIRMED = 6
EXIT_INVALID = 7

# The serve keys (`vllm.*`) that travel with the verified artifacts: every one config/serve.py
# does not mark ENVIRONMENT. The environment's own: where the API and mp's master listen, and
# the parallelism, which must match the target's own node count (tp x pp = nodes x gpusPerNode).
PROMOTED_VLLM_KEYS = PROMOTED_KEYS
ENV_VLLM_KEYS = ENVIRONMENT_KEYS
SERVE_ALIASES = {k.name: k.key for k in SERVE_KEYS}  # snake_case field -> camelCase key
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"


class Refusal(Exception):
    """A reason not to promote; `code` is the exit code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Artifacts:
    image_ref: str
    model_repo: str | None
    model_commit: str
    serve_flags: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # spark-vllm:services the source served: name -> (repo, resolved commit)
    services: dict[str, tuple[str, str]] = field(default_factory=dict)
    # model.drafter the source served: (repo, resolved commit); None without one
    drafter: tuple[str, str] | None = None

    @property
    def image_pinned(self) -> bool:
        return is_digest_ref(self.image_ref)

    @property
    def commit_pinned(self) -> bool:
        return is_commit(self.model_commit)


@dataclass
class Options:
    source: str
    target: str
    yes: bool = False
    dry_run: bool = False
    refresh_only: bool = False
    work_dir: Path = field(default_factory=Path.cwd)
    # An inline program (tests); default: the project's own, run by the CLI through the
    # language host from work_dir's Pulumi.yaml, as `pulumi preview` would.
    program: Callable[[], None] | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra env for the workspaces
    out: Callable[[str], None] = print
    confirm: Callable[[str], bool] | None = None  # default: ask on a TTY, refuse otherwise
    engine_output: Callable[[str], None] | None = None  # streamed engine output (None: quiet)


# ---------------------------------------------------------------------------------------------
# Pure helpers (unit-tested on their own)


def config_value(cm: Mapping[str, Any], key: str) -> Any:
    """A top-level `spark-vllm:<key>` value from a ConfigMap (objects come as JSON text)."""
    v = cm.get(NS + key)
    if v is None:
        return None
    if getattr(v, "secret", False):
        raise Refusal(
            EXIT_USAGE,
            f"{NS}{key} is a secret in the stack config; promote copies only plain values",
        )
    return plain_value(getattr(v, "value", v), key)


def serve_object(value: Any) -> dict[str, Any]:
    """A `vllm` object with every serve key as the stack file spells it (camelCase): the config
    takes the snake_case field names too, and a key promotion did not recognise would be neither
    carried nor compared."""
    if not isinstance(value, dict):
        return {}
    return {SERVE_ALIASES.get(str(k), str(k)): v for k, v in value.items()}


def promoted_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The promoted keys of a stack's config (`config_value` reads each), for comparing two
    configs: the image, the model, the promoted vLLM keys and each service's repo and revision."""

    def section(key: str) -> dict[str, Any]:
        value = config_value(config, key)
        return value if isinstance(value, dict) else {}

    image, model, vllm = section("image"), section("model"), serve_object(section("vllm"))
    view = {"image.ref": image.get("ref"), "model.repo": model.get("repo"),
            "model.revision": model.get("revision", "main")}
    drafter = model.get("drafter")
    if isinstance(drafter, dict):
        view["model.drafter.repo"] = drafter.get("repo")
        view["model.drafter.revision"] = drafter.get("revision", "main")
    view.update({f"vllm.{k}": vllm.get(k) for k in PROMOTED_VLLM_KEYS})
    services = config_value(config, "services")
    for entry in services if isinstance(services, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            name = entry["name"]
            view[f"services.{name}.repo"] = entry.get("repo")
            view[f"services.{name}.revision"] = entry.get("revision", "main")
    return view


def repo_digests(deployment: Mapping[str, Any]) -> dict[str, str]:
    """Repo digests (`<repo>@sha256:<hex>`) the docker provider recorded per RemoteImage."""
    found = {}
    for r in deployment.get("resources") or []:
        if r.get("type") != REMOTE_IMAGE:
            continue
        digest = (r.get("outputs") or {}).get("repoDigest")
        if isinstance(digest, str) and digest:
            found[r.get("urn", "?").split("::")[-1]] = digest
    return found


def _repository(ref: str) -> str:
    """`registry:5000/name:tag` -> `registry:5000/name` (a port colon is not a tag)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref[: -(len(last) - last.index(":"))] if ":" in last else ref


def pin_image(ref: str, deployment: Mapping[str, Any]) -> tuple[str, str | None]:
    """(ref pinned by digest if possible, note). A digest ref is kept as is."""
    if is_digest_ref(ref):
        return ref, None
    digests = repo_digests(deployment)
    repo = _repository(ref)
    values = sorted(set(digests.values()))
    if not values:
        return ref, (f"image.ref {ref!r} is a tag and the source state records no repo digest "
                     "for it (RemoteImage.repoDigest)")
    if len(values) > 1:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(digests.items()))
        return ref, f"image.ref {ref!r}: the nodes recorded different repo digests ({detail})"
    digest = values[0]
    m = DIGEST_REF.fullmatch(digest)
    if not m:
        return ref, f"image.ref {ref!r}: recorded repo digest {digest!r} is not <repo>@sha256:<hex>"
    if m.group("repo") != repo:
        digest = f"{repo}@{digest.split('@', 1)[1]}"
    return digest, f"image.ref {ref!r} pinned to {digest} (the repo digest the nodes pulled)"


def merge_object(current: Any, promoted: dict[str, Any], owned: tuple[str, ...]) -> dict[str, Any]:
    """The target's object with the promoted keys replaced; a promoted key the source does not
    set is removed (the verified flags did not have it); other keys stay as they are."""
    out = dict(current) if isinstance(current, dict) else {}
    for k in owned:
        if k in promoted and promoted[k] is not None:
            out[k] = promoted[k]
        else:
            out.pop(k, None)
    return out


def unified(before: str, after: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}"
        )
    )


def raw_config(text: str) -> dict[str, Any]:
    """The plain (non-secret) keys of a stack file, without the namespace, for validate_config."""
    import yaml

    data = (yaml.safe_load(text) or {}).get("config") or {}
    raw = {}
    for k, v in data.items():
        if not k.startswith(NS):
            continue
        key = k[len(NS):]
        if key in SECRET_KEYS or (isinstance(v, dict) and set(v) == {"secure"}):
            continue
        raw[key] = v
    return raw


def promoted_problem_keys() -> tuple[str, ...]:
    return ("image.ref", "model.repo", "model.revision", "model.drafter",
            *(f"vllm.{k}" for k in PROMOTED_VLLM_KEYS))


def config_problems(text: str) -> list[str]:
    """Every problem validate_config finds in a stack file's plain keys ([] when it is valid)."""
    from config import ConfigError, validate_config

    try:
        validate_config(raw_config(text))
    except ConfigError as e:
        return list(e.problems)
    return []


def check_target_config(after: str, before: str | None = None) -> tuple[list[str], list[str]]:
    """(problems the promotion causes, problems the target already had) of a stack file.

    The promotion's: every problem at a promoted key, and every problem `after` has that
    `before` (the target as it was) did not: only promoted values changed, so a `services.*`
    made invalid by them (a promoted servedModelName taking a service's, say) is the
    promotion's too and refused like the others. Without `before`, only the promoted keys'."""
    problems = config_problems(after)
    had = set(config_problems(before)) if before is not None else None
    ours = tuple(f"{NS}{k}" for k in promoted_problem_keys())
    mine = [p for p in problems if p.startswith(ours) or (had is not None and p not in had)]
    return mine, [p for p in problems if p not in mine]


# ---------------------------------------------------------------------------------------------
# Engine side


LAB_PASSPHRASE = Path("lab") / "dev.passphrase"


def _workspace_env(extra: dict[str, str], stack: str, work_dir: Path) -> dict[str, str]:
    """The environment of one stack's workspace. Each stack is opened with its own passphrase:
    the lab's dev stack with the project's lab/dev.passphrase (Pulumi.dev.yaml carries its
    salt), every other stack with PULUMI_CONFIG_PASSPHRASE(_FILE) as set."""
    env = dict(extra)
    env.setdefault("PULUMI_SKIP_UPDATE_CHECK", "true")
    env.setdefault("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "true")
    lab = work_dir / LAB_PASSPHRASE
    if stack == "dev" and lab.is_file():
        env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(lab)
    return env


def check_environment(env: dict[str, str]) -> None:
    """Backend and passphrase as the Makefile sets them; the CLI on PATH."""
    merged = {**os.environ, **env}
    if not merged.get("PULUMI_BACKEND_URL"):
        raise Refusal(EXIT_USAGE, "PULUMI_BACKEND_URL is not set (the Makefile sets "
                      "file://~/.spark-vllm/state; run through `make promote` or export it)")
    url = merged["PULUMI_BACKEND_URL"]
    if url.startswith("file://"):
        folder = Path(os.path.expanduser(url[len("file://"):].split("?", 1)[0]))
        if not folder.is_dir():
            raise Refusal(EXIT_USAGE, f"the state folder of PULUMI_BACKEND_URL={url} does not "
                          "exist (make setup creates ~/.spark-vllm/state): no stack there to "
                          "promote from")
    if not (merged.get("PULUMI_CONFIG_PASSPHRASE") or merged.get("PULUMI_CONFIG_PASSPHRASE_FILE")):
        raise Refusal(EXIT_USAGE, "neither PULUMI_CONFIG_PASSPHRASE nor "
                      "PULUMI_CONFIG_PASSPHRASE_FILE is set (the stack files' secrets need it)")
    if shutil.which("pulumi") is None:
        raise Refusal(EXIT_USAGE, "the pulumi CLI is not on PATH (make setup puts it in "
                      "~/.cache/spark-vllm/toolchain/bin)")


def _stack(name: str, o: Options, *, create: bool, work_dir: Path | None = None,
           env: dict[str, str] | None = None) -> auto.Stack:
    import pulumi.automation as auto

    ws = auto.LocalWorkspaceOptions(
        work_dir=str(work_dir or o.work_dir),
        env_vars=_workspace_env(env or o.env, name, work_dir or o.work_dir)
    )
    try:
        if o.program is None:  # the project's own program, run by the CLI from work_dir
            if create:
                return auto.create_or_select_stack(stack_name=name, work_dir=ws.work_dir, opts=ws)
            return auto.select_stack(stack_name=name, work_dir=ws.work_dir, opts=ws)
        if create:
            return auto.create_or_select_stack(stack_name=name, project_name=PROJECT,
                                               program=o.program, opts=ws)
        return auto.select_stack(stack_name=name, project_name=PROJECT, program=o.program,
                                 opts=ws)
    except auto.StackNotFoundError:
        backend = os.environ.get("PULUMI_BACKEND_URL") or o.env.get("PULUMI_BACKEND_URL")
        raise Refusal(EXIT_UNVERIFIED, f"source stack {name!r} does not exist on the backend "
                      f"({backend}): nothing was verified there") from None


def _op(entry: auto.UpdateSummary) -> str:
    """`update #3 (2026-12-01 10:00:00)`; a failed update records no version."""
    num = f" #{entry.version}" if entry.version else ""
    when = entry.end_time or entry.start_time
    return f"{entry.kind}{num}" + (f" at {when:%Y-%m-%d %H:%M:%S}" if when else "")


def verify_history(stack: auto.Stack) -> auto.UpdateSummary:
    """The last update's summary, if the stack's history says it is trustworthy."""
    latest = stack.history(page_size=1)
    if not latest:
        raise Refusal(EXIT_UNVERIFIED, f"source stack {stack.name!r} has no recorded update")
    last = latest[0]
    if last.result != "succeeded":
        raise Refusal(EXIT_UNVERIFIED, f"source stack {stack.name!r}: the last operation "
                      f"({_op(last)}) {last.result}; fix it and `up` again")
    if last.kind == "destroy":
        raise Refusal(EXIT_UNVERIFIED, f"source stack {stack.name!r} was destroyed "
                      f"({_op(last)}); nothing is deployed to promote")
    if last.kind == "update":
        return last
    for entry in stack.history(page_size=20):
        if entry.kind == "destroy":
            raise Refusal(EXIT_UNVERIFIED, f"source stack {stack.name!r} was destroyed "
                          f"({_op(entry)}) after its last update")
        if entry.kind == "update":
            if entry.result != "succeeded":
                raise Refusal(EXIT_UNVERIFIED, f"source stack {stack.name!r}: the last update "
                              f"({_op(entry)}) {entry.result}")
            return entry
    raise Refusal(EXIT_UNVERIFIED, f"source stack {stack.name!r}: no update in its last 20 "
                  "operations")


def _changed(events: list[auto.EngineEvent]) -> list[str]:
    """`<op> <name>` for every resource a preview or refresh preview would change. A refresh
    reports its verdict on the outputs event (the pre event says only `refresh`)."""
    changed: list[str] = []
    for e in events:
        for attr in ("resource_pre_event", "res_outputs_event"):
            ev = getattr(e, attr, None)
            if ev is None or ev.metadata is None:
                continue
            op = str(getattr(ev.metadata.op, "value", ev.metadata.op))
            item = f"{op} {ev.metadata.urn.split('::')[-1]}"
            if op not in ("same", "read", "refresh") and item not in changed:
                changed.append(item)
    return changed


def verify_no_drift(stack: auto.Stack, o: Options) -> None:
    events: list[auto.EngineEvent] = []
    o.out(f"checking {stack.name!r} for drift (refresh --preview-only) ...")
    r = stack.preview_refresh(on_event=events.append, on_output=o.engine_output)
    changes = {k: v for k, v in (r.change_summary or {}).items() if k != "same" and v}
    if changes:
        listing = "; ".join(_changed(events)) or str(changes)
        raise Refusal(EXIT_DRIFT, f"source stack {stack.name!r} has drifted from its state "
                      f"({listing}); run `pulumi refresh` and `pulumi up`, verify, then promote")
    if o.refresh_only:
        return
    events = []
    o.out(f"checking {stack.name!r} against its program and config (preview) ...")
    r = stack.preview(on_event=events.append, on_output=o.engine_output)
    changes = {k: v for k, v in (r.change_summary or {}).items() if k != "same" and v}
    if changes:
        listing = "; ".join(_changed(events)) or str(changes)
        raise Refusal(EXIT_DRIFT, f"source stack {stack.name!r}: `preview` wants changes "
                      f"({listing}); what is deployed is not what its config says: `up` and "
                      "verify first")


def collect_artifacts(stack: auto.Stack, last_update: auto.UpdateSummary) -> Artifacts:
    ran = last_update.config or {}
    image = config_value(ran, "image") or {}
    model = config_value(ran, "model") or {}
    vllm = serve_object(config_value(ran, "vllm"))
    before, after = promoted_view(ran), promoted_view(stack.get_all_config())
    if before != after:
        diff = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
                         for k in sorted(before.keys() | after.keys())
                         if before.get(k) != after.get(k))
        raise Refusal(EXIT_DRIFT, f"Pulumi.{stack.name}.yaml changed since the last update "
                      f"({diff}); `up` and verify it first")
    ref = image.get("ref")
    if not ref:
        raise Refusal(EXIT_UNPINNED, "the source's last update ran without image.ref")
    outputs = stack.outputs()
    commit = outputs.get("modelCommit")
    commit = commit.value if commit is not None else None
    if not commit:
        raise Refusal(EXIT_UNPINNED, f"source stack {stack.name!r} exports no modelCommit")
    check_verified(stack.name, {k: v.value for k, v in outputs.items()})
    pinned, note = pin_image(ref, stack.export_stack().deployment or {})
    flags = {k: vllm[k] for k in PROMOTED_VLLM_KEYS if k in vllm}
    served = outputs.get("services")
    services = {
        name: (str(v["repo"]), str(v["modelCommit"]))
        for name, v in ((served.value if served is not None else None) or {}).items()
        if isinstance(v, dict) and v.get("repo") and v.get("modelCommit")
    }
    exported = outputs.get("drafter")
    d = exported.value if exported is not None else None
    drafter = ((str(d["repo"]), str(d["commit"]))
               if isinstance(d, dict) and d.get("repo") and d.get("commit") else None)
    if isinstance(model.get("drafter"), dict) and drafter is None:
        raise Refusal(EXIT_UNPINNED, f"source stack {stack.name!r} declares model.drafter but "
                      "exports no drafter commit; `up` it with this release first")
    art = Artifacts(image_ref=pinned, model_repo=model.get("repo"), model_commit=str(commit),
                    serve_flags=flags, services=services, drafter=drafter)
    if note:
        art.notes.append(note)
    return art


def check_verified(name: str, outputs: Mapping[str, Any]) -> None:
    """Refuse a source whose deployment its health gates did not verify (issue 49): the stack
    output `deployment` (the summary the head's `vllm-deployment-<head>` prints once the gate
    passed) must be there and name the commit and image the source's outputs promote; so must
    each promoted service's, on every node."""
    where = f"source stack {name!r}"
    d = outputs.get("deployment")
    if not isinstance(d, dict) or not d.get("deployment"):
        raise Refusal(EXIT_UNVERIFIED, f"{where} records no verified deployment (the stack "
                      "output `deployment`, written when the model's health gate passes): `up` "
                      "it until its gates pass, then promote")
    commit = outputs.get("modelCommit")
    if (d.get("model") or {}).get("commit") != commit:
        raise Refusal(EXIT_UNVERIFIED, f"{where}: its verified deployment {d['deployment']} "
                      f"served commit {(d.get('model') or {}).get('commit')!r}, not the "
                      f"modelCommit {commit!r} it would promote")
    ids = set((outputs.get("imageIds") or {}).values())
    if (d.get("image") or {}).get("id") not in ids:
        raise Refusal(EXIT_UNVERIFIED, f"{where}: its verified deployment {d['deployment']} "
                      f"ran image {(d.get('image') or {}).get('id')!r}, not the one its nodes "
                      f"hold ({', '.join(sorted(ids)) or 'none'})")
    for svc, v in (outputs.get("services") or {}).items():
        if not isinstance(v, dict) or not v.get("modelCommit"):
            continue
        per_node = v.get("deployment")
        bad = [n for n, s in (per_node or {}).items()
               if not isinstance(s, dict) or (s.get("model") or {}).get("commit")
               != v["modelCommit"]]
        if not per_node or bad:
            raise Refusal(EXIT_UNVERIFIED, f"{where}: service {svc!r} has no verified "
                          f"deployment of commit {v['modelCommit']} on "
                          f"{', '.join(bad) if per_node else 'its nodes'}")


def check_pinned(art: Artifacts, target_env: str | None) -> list[str]:
    """Problems with the artifacts' pinning (fatal for prod, warnings elsewhere)."""
    problems = []
    if not art.image_pinned:
        problems.append(f"image {art.image_ref!r} is not pinned by digest (<repo>@sha256:<64 hex>)")
    if not art.commit_pinned:
        problems.append(f"model commit {art.model_commit!r} is not a 40-hex commit")
    if art.drafter is not None and not is_commit(art.drafter[1]):
        problems.append(f"drafter commit {art.drafter[1]!r} is not a 40-hex commit")
    return problems


def apply(stack: auto.Stack, art: Artifacts) -> None:
    """Write the artifacts into `stack`'s config (merged into its image/model/vllm objects)."""
    cm = stack.get_all_config()
    image = merge_object(config_value(cm, "image"), {"ref": art.image_ref}, ("ref",))
    model_promoted: dict[str, Any] = {"revision": art.model_commit}
    owned: tuple[str, ...] = ("revision", "drafter")
    if art.model_repo:
        model_promoted["repo"] = art.model_repo
        owned = ("repo", "revision", "drafter")
    # the drafter travels with the model (the serve keys name it): the source's, pinned, or none
    if art.drafter is not None:
        model_promoted["drafter"] = {"repo": art.drafter[0], "revision": art.drafter[1]}
    model = merge_object(config_value(cm, "model"), model_promoted, owned)
    vllm = merge_object(serve_object(config_value(cm, "vllm")), art.serve_flags,
                        PROMOTED_VLLM_KEYS)
    promoted: list[tuple[str, Any]] = [("image", image), ("model", model), ("vllm", vllm)]
    services = promoted_services(config_value(cm, "services"), art)
    if services is not None:
        promoted.append(("services", services))
    values = {
        f"{NS}{k}": {"value": json.dumps(v), "objectValue": v, "secret": False}
        for k, v in promoted
    }
    stack.set_all_config_json(json.dumps(values))


def promoted_services(current: Any, art: Artifacts) -> list[Any] | None:
    """The target's `services` with the repo and commit of each one the source served under
    the same name; the others stay as they are (a prod target then refuses their unpinned
    revision). None when the target declares no services."""
    if not isinstance(current, list):
        return None
    out: list[Any] = []
    for entry in current:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name in art.services:
            repo, commit = art.services[name]
            entry = {**entry, "repo": repo, "revision": commit}
        out.append(entry)
    return out


def _stack_file(work_dir: Path, name: str) -> Path:
    return work_dir / f"Pulumi.{name}.yaml"


def plan_in_scratch(o: Options, art: Artifacts) -> tuple[str, str]:
    """(before, after) text of Pulumi.<to>.yaml, with the change made on a scratch copy."""
    target_file = _stack_file(o.work_dir, o.target)
    before = target_file.read_text()
    with tempfile.TemporaryDirectory(prefix="promote-") as tmp:
        scratch = Path(tmp)
        shutil.copy(o.work_dir / "Pulumi.yaml", scratch / "Pulumi.yaml")
        shutil.copy(target_file, scratch / target_file.name)
        (scratch / "state").mkdir()
        env = {**o.env, "PULUMI_BACKEND_URL": f"file://{scratch / 'state'}"}
        st = _stack(o.target, o, create=True, work_dir=scratch, env=env)
        apply(st, art)
        after = (scratch / target_file.name).read_text()
    return before, after


def _ask(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def promote(o: Options) -> int:
    out = o.out
    if o.source == o.target:
        raise Refusal(EXIT_USAGE, "--from and --to name the same stack")
    target_file = _stack_file(o.work_dir, o.target)
    if not target_file.is_file():
        raise Refusal(EXIT_USAGE, f"{target_file} does not exist: create the target stack's file "
                      "first (environment, nodes, secrets); promote fills in only the artifacts")
    check_environment(o.env)

    src = _stack(o.source, o, create=False)
    last = verify_history(src)
    out(f"source {o.source!r}: last {_op(last)} succeeded")
    verify_no_drift(src, o)
    art = collect_artifacts(src, last)
    for note in art.notes:
        out(f"note: {note}")

    import yaml

    target_env = (yaml.safe_load(target_file.read_text()) or {}).get("config", {}).get(
        f"{NS}environment")
    problems = check_pinned(art, target_env)
    if problems and target_env == "prod":
        raise Refusal(EXIT_UNPINNED, f"refusing to promote into prod stack {o.target!r}: "
                      + "; ".join(problems))
    for p in problems:
        out(f"warning: {p} (allowed for {target_env or 'an unset environment'}, refused for prod)")

    out(f"artifacts verified in {o.source!r}:")
    out(f"  image.ref       {art.image_ref}")
    out(f"  model           {art.model_repo} @ {art.model_commit}")
    if art.drafter is not None:
        out(f"  drafter         {art.drafter[0]} @ {art.drafter[1]}")
    out(f"  serve flags     {json.dumps(art.serve_flags, sort_keys=True)}")

    before, after = plan_in_scratch(o, art)
    mine, others = check_target_config(after, before)
    if mine:
        raise Refusal(EXIT_INVALID, f"the promoted values make Pulumi.{o.target}.yaml invalid:\n"
                      + "\n".join(f"  - {p}" for p in mine))
    if before == after:
        out(f"Pulumi.{o.target}.yaml already holds these artifacts: nothing to do")
        return EXIT_OK
    out(f"planned change to Pulumi.{o.target}.yaml:")
    out(unified(before, after, target_file.name).rstrip("\n"))
    for p in others:
        out(f"warning: {target_file.name} (environment-owned keys, not touched): {p}")
    if o.dry_run:
        out("dry run: nothing written")
        return EXIT_OK
    if not o.yes:
        confirm = o.confirm or _ask
        if not confirm(f"write these changes to {target_file.name}?"):
            raise Refusal(EXIT_NOT_CONFIRMED, "not confirmed (pass --yes to write without asking)")

    current = target_file.read_text()
    if current != before:
        raise Refusal(EXIT_USAGE, f"{target_file.name} changed while promoting; run again")
    dst = _stack(o.target, o, create=True)
    apply(dst, art)
    written = target_file.read_text()
    out(f"wrote Pulumi.{o.target}.yaml:")
    out(unified(before, written, target_file.name).rstrip("\n") or "(no change)")
    out(f"next: pulumi preview -s {o.target} --diff --policy-pack policies "
        f"--policy-pack-config policies/config.{o.target}.json, "
        f"then up --stack {o.target} --policy")
    return EXIT_OK


def _default_env() -> dict[str, str]:
    """The Makefile's defaults for a direct run (only what the environment does not set)."""
    env: dict[str, str] = {}
    home = Path.home() / ".spark-vllm"
    if not os.environ.get("PULUMI_BACKEND_URL"):
        env["PULUMI_BACKEND_URL"] = f"file://{home / 'state'}"
    given = os.environ.get("PULUMI_CONFIG_PASSPHRASE") or os.environ.get(
        "PULUMI_CONFIG_PASSPHRASE_FILE")
    if not given and (home / "passphrase").is_file():
        env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(home / "passphrase")
    return env


def main(argv: list[str] | None = None, **overrides: Any) -> int:
    ap = argparse.ArgumentParser(
        prog="promote.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--from", dest="source", required=True, help="source stack, e.g. dev")
    ap.add_argument("--to", dest="target", required=True, help="target stack, e.g. staging")
    ap.add_argument("--yes", "-y", action="store_true", help="write without asking")
    ap.add_argument("--dry-run", action="store_true", help="show the planned diff, write nothing")
    ap.add_argument("--refresh-only", action="store_true",
                    help="drift check by refresh only (skip the program preview)")
    ap.add_argument("--verbose", "-v", action="store_true", help="stream the engine's output")
    a = ap.parse_args(argv)
    toolchain = Path.home() / ".cache" / "spark-vllm" / "toolchain" / "bin"
    if (toolchain / "pulumi").exists() and str(toolchain) not in os.environ.get("PATH", ""):
        os.environ["PATH"] = f"{toolchain}{os.pathsep}{os.environ.get('PATH', '')}"
    o = Options(source=a.source, target=a.target, yes=a.yes, dry_run=a.dry_run,
                refresh_only=a.refresh_only, env=_default_env(),
                engine_output=(lambda line: print(line, flush=True)) if a.verbose else None)
    for k, v in overrides.items():
        setattr(o, k, v)
    return run(o)


def run(o: Options) -> int:
    """promote() with every failure turned into a message and an exit code, never a traceback."""
    import pulumi.automation as auto

    try:
        return promote(o)
    except Refusal as r:
        print(f"promote: refused: {r.message}", file=sys.stderr)
        return r.code
    except auto.CommandError as e:
        tail = "\n".join(str(e).strip().splitlines()[-12:])
        print(f"promote: the pulumi CLI failed:\n{tail}", file=sys.stderr)
        return EXIT_ENGINE
    except KeyboardInterrupt:
        print("promote: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        print(f"promote: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ENGINE


if __name__ == "__main__":
    sys.exit(main())
