"""Importing a community recipe file into a typed recipe (config/recipes.py `Recipe`).

Pure: text in, a validated recipe document and, one line per field, what was carried, noted
and refused out (`spark-vllm recipes import`, tools/recipes_cli.py, reads and writes the files).
A third-party format converter, so it lives with the CLI that uses it, not in config/.

Two formats, told apart by their keys (`detect_format`):

  eugr       eugr/spark-vllm-docker's recipes (`run-recipe.sh`): `container` and `command` (a
             `vllm serve` line with `{placeholders}` filled from `defaults`), `recipe_version:
             "1"`, `mods`, `build_args`, `env` (EUGR_FORMAT_DOC)
  sparkrun   spark-arena/sparkrun's recipes (the recipe-registry's files): `recipe_version: "2"`
             or its own keys (`runtime`, `metadata`, `min_nodes`, hooks...), a `command`
             template or, without one, the flags its vLLM runtimes make of `defaults`
             (SPARKRUN_FORMAT_DOC)

The `vllm serve` line is read the way vLLM's own parser reads it, without knowing every flag
vLLM has (the image's vLLM is the final judge: the serve check in the image parses the exact
command line before vLLM is replaced): a flag and every word after it up to the next flag are
one group, so a flag takes several values (`--cudagraph-capture-sizes 1 2 4 8`), `--flag=value`
and `--flag.key value` are read as vLLM reads them, and JSON values are kept whole. Each group's
flag is looked up in config/serve.py's own tables, read in reverse (`owned_flag` resolves vLLM's
spellings: `--a_b`, `--no-flag`, unambiguous prefixes, `--flag.key`, `-n2`), so no second flag
table exists here. What each group becomes:

  a recipe key (config/serve.py, RECIPE)   carried: typed, then validated by Recipe
  a key or flag of the stack's own (-tp, -pp, --host, --port, --distributed-executor-backend,
  --served-model-name, --api-key, --revision...)   noted: "not carried: the stack's key ..."
  a flag config/serve.py FORBIDDEN_FLAGS holds (it loads code or opens a door: a plugin, a KV
  connector, an outside endpoint, data parallelism...)   refused, by name, with why
  any other flag                           carried in `extraArgs` as written (its words in order)
  the same flag twice                      with the same value: carried once, noted; a serve key
                                           with two values: refused (say which)

Placeholders are named as sparkrun names them: any `{...}` without quotes, spaces, `:` or `,`
(`{hf-overrides}`, `{model}`), filled from `defaults` (and `model`) until nothing changes; eugr's
doubled braces are literal. The rest of a file: `env` is carried (NCCL_*/UCX_*/GLOO_* into
`launcherEnv`, the others into `env`) unless the stack sets the variable itself (noted) or a
recipe may not set it (refused: config.types.extra_env_problem); `container`, `build_args`,
`mods`, node counts, `model_revision`, benchmarks and the hooks that run after the server is up
are the stack's or the launcher's (noted); `pre_exec` changes the container before vLLM starts
(refused); keys the format does not have are refused. A refusal means nothing is written; every
refusal and note names its field once. A file whose runtime is not vLLM is "not vLLM".

"Imported" means "a stack can serve it": the recipe that validates as a Recipe is then applied
to a reference stack (STACK: two Sparks, the recipe's model and, for another repo's
speculative drafter, `model.drafter`, both pinned to a commit as trustRemoteCode and prod
want) by name, through the same config code a stack runs (config.recipes.trial,
config.validate_config), and every problem that stack config has refuses the recipe.

Sources. A typed recipe cites where its values come from (RecipeSource: a URL, pinned to a
commit on GitHub and Hugging Face, or a `path` of this repository). An imported file rarely says
where it was published, and a URL the importer cannot check would be a claim it cannot make. So:
when the file names its origin in a comment line `# source: <url>` and that URL passes
RecipeSource's check, the source is that URL; otherwise the source is the written recipe itself
(`path: config/recipes_data/<name>.yaml`, where recipes are shipped), whose `covers` names the
imported file, its format and its SHA-256: the typed file is then the only record of the values
in this repository, and says so, rather than pointing at a page that may hold other values.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from config import ConfigError, recipe_files, validate_config
from config.errors import describe, key_path
from config.forms import clip, secret_env_name, secret_flag, secret_value
from config.recipes import STACK_ENV, Recipe, RecipeFile, RecipeSource, trial
from config.serve import (
    FORBIDDEN_FLAGS,
    OWNED_FLAGS,
    RECIPE_FIELDS,
    SERVE_KEYS,
    Argv,
    ExtraArgs,
    ServeKey,
    ServeSettings,
    owned_flag,
)
from config.types import extra_env_problem

# The communication libraries' families (of config/types.py EXTRA_ENV_FAMILIES): the importer puts
# them in a recipe's launcherEnv, every other variable in its env
LAUNCHER_ENV_FAMILIES = ("NCCL_", "UCX_", "GLOO_")

Format = Literal["eugr", "sparkrun"]
Outcome = Literal["imported", "refused", "not vLLM"]

EUGR_FORMAT_DOC = ("https://github.com/eugr/spark-vllm-docker/blob/"
                   "d3e7b0b0d2a59868fa229023dd71f877a42def74/recipes/README.md")
SPARKRUN_FORMAT_DOC = ("https://github.com/spark-arena/sparkrun/blob/"
                       "0041b8f8fc1320ffa2e85d2d0ac760ee6be19de7/RECIPES.md")
# sparkrun's vLLM runtimes: the flags they make of `defaults` (VLLM_FLAG_MAP), how they fill a
# command template (render_command) and add --served-model-name (_augment_served_model_name)
SPARKRUN_VLLM_RUNTIME = ("https://github.com/spark-arena/sparkrun/blob/"
                         "0041b8f8fc1320ffa2e85d2d0ac760ee6be19de7/src/sparkrun/runtimes/"
                         "_vllm_common.py")
FORMAT_DOCS: dict[str, str] = {"eugr": EUGR_FORMAT_DOC, "sparkrun": SPARKRUN_FORMAT_DOC}
MAX_FILE_BYTES = 256 * 1024
SHIPPED_DIR = "config/recipes_data"

# Keys only sparkrun's format has (SPARKRUN_FORMAT_DOC, "Field Reference" and the sections on
# hooks, builders and the executor); eugr's are EugrFile's fields (EUGR_FORMAT_DOC, "Recipe
# Format", and `solo_only`, which its recipes use for single-node models).
SPARKRUN_ONLY_KEYS = frozenset({
    "sparkrun_version", "runtime", "runtime_version", "model_revision", "mode", "min_nodes",
    "max_nodes", "metadata", "runtime_config", "pre_exec", "post_exec", "post_commands",
    "stop_after_post", "builder", "builder_config", "executor_config", "distribution_config",
})
# sparkrun runtimes that run `vllm serve` (SPARKRUN_FORMAT_DOC, "Runtime Resolution")
VLLM_RUNTIMES = frozenset({"", "vllm", "vllm-ray", "vllm-distributed", "eugr-vllm"})
# Without a `command`, sparkrun's vLLM runtimes make flags of these `defaults` keys only
# (SPARKRUN_VLLM_RUNTIME, VLLM_FLAG_MAP: every key, in its order); any other key is for a
# template. The flag is `--` + the key with `-` for `_`, but for the three renamed here.
SPARKRUN_DEFAULT_FLAGS = (
    "port", "host", "tensor_parallel", "gpu_memory_utilization", "max_model_len",
    "max_num_batched_tokens", "max_num_seqs", "served_model_name", "dtype", "quantization",
    "enforce_eager", "enable_prefix_caching", "trust_remote_code", "distributed_executor_backend",
    "pipeline_parallel", "data_parallel", "kv_cache_dtype", "otlp_traces_endpoint", "api_key",
)
SPARKRUN_RENAMED = {"tensor_parallel": "-tp", "pipeline_parallel": "-pp",
                    "data_parallel": "--data-parallel-size"}
SPARKRUN_BOOLEAN_DEFAULTS = frozenset({"enforce_eager", "enable_prefix_caching",
                                       "trust_remote_code", "enable_auto_tool_choice"})

# a placeholder as sparkrun fills it: any `{...}` that cannot be JSON (no quote, space, `:`, `,`)
_PLACEHOLDER = re.compile(r"\{([^{}\"'\s:,]+)\}")
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")
_SHELL = re.compile(r"[;&|<>`]|\$\(")
_SOURCE_COMMENT = re.compile(r"^#\s*source:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")

# config/serve.py's table read in reverse: every spelling of a serve key's flag -> the key
_SERVE_FLAG: dict[str, ServeKey] = {
    f: k for k in SERVE_KEYS if k.flag.flag
    for f in (k.flag.flag, *k.flag.spellings)
}
_BOOLEAN = (Argv.TOGGLE, Argv.SWITCH)
_NO_VALUE_OWNED = frozenset({"--headless", "--enable-ssl-refresh", "--grpc"})

# The reference stack an imported recipe is applied to (STACK): two Sparks of the docs'
# staging file, documentation addresses, every artifact pinned (a recipe with trustRemoteCode
# is served only pinned; the drafter likewise)
REFERENCE_COMMIT = "0" * 40
REFERENCE_DRAFTER_COMMIT = "1" * 40
_REFERENCE_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFJlZmVyZW5jZVN0YWNrRm9ySW1wb3J0"
_DIGEST = "@sha256:" + "0" * 64


class ImportFormatError(ValueError):
    """The file is not a recipe the importer can read: not UTF-8 YAML, not a mapping, or in no
    format it knows. Nothing of it was looked at field by field."""


@dataclass
class Imported:
    """The result of an import: the typed recipe document (camelCase, in the shipped files'
    order) and, one line per field, what was carried, noted (left out, with the reason) and
    refused. `recipe` is the validated Recipe; None when anything was refused. `outcome`:
    imported, refused, or not vLLM (another runtime: refused with one line, `reason`)."""

    file: str
    format: Format
    name: str
    document: dict[str, Any] = field(default_factory=dict)
    carried: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    recipe: RecipeFile | None = None
    not_vllm: str | None = None  # why the file is not a vLLM recipe (its runtime, its command)

    # every line is one printable line: a recipe file's values (YAML can hold any character,
    # an escape sequence too) never reach the operator's terminal as control characters
    def refuse(self, where: str, why: str) -> None:
        self.refused.append(_one_line(f"recipe file {self.file}: {where}: {why}"))

    def note(self, where: str, why: str) -> None:
        self.notes.append(_one_line(f"{where}: not carried: {why}"))

    def carry(self, line: str) -> None:
        self.carried.append(_one_line(line))

    @property
    def outcome(self) -> Outcome:
        if self.not_vllm is not None:
            return "not vLLM"
        return "imported" if self.recipe is not None else "refused"

    @property
    def reason(self) -> str:
        """One line: why the file was refused or is not vLLM ("" when imported)."""
        if self.not_vllm is not None:
            return _one_line(self.not_vllm)
        if not self.refused:
            return ""
        first = self.refused[0].removeprefix(f"recipe file {self.file}: ")
        more = len(self.refused) - 1
        return first + (f" (+{more} more)" if more else "")

    @property
    def drafter(self) -> str | None:
        """The speculative drafter's repo when it is another than the model's."""
        spec = self.document.get("speculativeConfig") or {}
        model = spec.get("model") if isinstance(spec, dict) else None
        return model if isinstance(model, str) and model != self.document.get("model") else None


# ------------------------------------------------------------------ the formats, as validated
Scalar = str | int | float | bool


class _FormatModel(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class EugrFile(_FormatModel):
    """An eugr recipe's keys (EUGR_FORMAT_DOC, "Recipe Format")."""

    recipe_version: str | None = None
    name: str | None = None
    description: str | None = None
    model: str | None = None
    cluster_only: bool = False
    solo_only: bool = False
    container: str | None = None
    build_args: list[str] = []
    mods: list[str] = []
    defaults: dict[str, Scalar | None] = {}
    env: dict[str, Scalar] | None = None
    command: str | None = None
    benchmark: dict[str, Any] | None = None


class SparkrunFile(EugrFile):
    """A sparkrun recipe's keys (SPARKRUN_FORMAT_DOC, "Field Reference"); eugr's keys too,
    which sparkrun reads as its version 1."""

    sparkrun_version: str | None = None
    runtime: str = ""
    runtime_version: str | None = None
    model_revision: str | None = None
    mode: str | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    metadata: dict[str, Any] = {}
    runtime_config: dict[str, Any] = {}
    pre_exec: list[Any] = []
    post_exec: list[Any] = []
    post_commands: list[Any] = []
    stop_after_post: bool = False
    builder: str | None = None
    builder_config: dict[str, Any] = {}
    executor_config: dict[str, Any] = {}
    distribution_config: Any = None


def read_document(text: str) -> dict[str, Any]:
    """The YAML mapping of a recipe file; ImportFormatError when it is not one."""
    if len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise ImportFormatError(f"larger than {MAX_FILE_BYTES // 1024} KiB: not a recipe file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ImportFormatError(f"cannot be read as YAML ({clip(str(exc), 160)})") from None
    if not isinstance(data, dict):
        raise ImportFormatError(f"got {clip(data)}; expected a mapping (a recipe's keys)")
    if not all(isinstance(k, str) for k in data):
        raise ImportFormatError("expected a mapping with text keys")
    return data


def detect_format(data: Mapping[str, Any]) -> Format:
    """Which community format `data` is in; ImportFormatError when neither."""
    version = data.get("recipe_version", data.get("sparkrun_version"))
    if version is not None and str(version) not in ("1", "2"):
        raise ImportFormatError(f"recipe_version {version!r}: neither eugr's \"1\" nor "
                                "sparkrun's \"2\"")
    if str(version) == "2" or set(data) & SPARKRUN_ONLY_KEYS:
        return "sparkrun"
    if str(version) == "1" or ("command" in data and "container" in data):
        return "eugr"
    raise ImportFormatError(
        "not a recipe in a format the importer knows: an eugr recipe has `container` and "
        f"`command` ({EUGR_FORMAT_DOC}), a sparkrun recipe `recipe_version: \"2\"` or its own "
        f"keys such as `runtime` ({SPARKRUN_FORMAT_DOC})")


def default_name(file_name: str) -> str:
    """A recipe name made of a file's name (or its path inside an imported folder, `/` as
    `-`): lowercase, `-` for what a name may not hold."""
    stem = re.sub(r"\.(ya?ml)$", "", file_name, flags=re.IGNORECASE)
    name = re.sub(r"[^a-z0-9.-]+", "-", stem.lower()).strip(".-")[:64].rstrip(".-")
    return name


# ------------------------------------------------------------------------------- the import
def import_recipe(text: str, *, file_name: str, name: str | None = None) -> Imported:
    """`text`, the recipe file `file_name` (its base name or its path in an imported folder,
    for messages and `covers`), as a typed recipe named `name` (default: from `file_name`).
    ImportFormatError when the file is not a recipe in a known format; anything else is a
    line of the result."""
    data = read_document(text)
    fmt = detect_format(data)
    out = Imported(file=file_name, format=fmt, name=name or default_name(file_name))
    model_cls: type[EugrFile] = SparkrunFile if fmt == "sparkrun" else EugrFile
    data = dict(data)
    while True:  # each key the format refuses is named once, the others are still read
        try:
            recipe = model_cls.model_validate(data)
            break
        except ValidationError as exc:
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"])
                if err["type"] == "extra_forbidden":
                    out.refuse(where, f"not a key of the {fmt} format ({FORMAT_DOCS[fmt]}); "
                                      "the importer carries only what it knows")
                else:
                    out.refuse(where, f"{err['msg']} (got {clip(err.get('input'))})")
                data.pop(str(err["loc"][0]), None)
    if isinstance(recipe, SparkrunFile) and recipe.runtime not in VLLM_RUNTIMES:
        out.not_vllm = (f"runtime {recipe.runtime}: this stack serves with vLLM only (runtimes "
                        f"{', '.join(sorted(VLLM_RUNTIMES - {''}))})")
        out.refuse("runtime", out.not_vllm)
        return out
    if not recipe_files.FILE_NAME.fullmatch(out.name):
        out.refuse("name", f"{out.name!r}: expected a name of lowercase letters, digits, '.' "
                           "and '-' (give --name)")
        return out
    _Importer(out, recipe, text).run()
    return out


@dataclass
class _Group:
    """One flag of the serve line and the words after it up to the next flag."""

    token: str  # as written: `--max_model_len=4096`, `-n2`
    name: str  # the flag part: `--max_model_len`
    values: list[str]  # its `=value`, then the words after it
    inline: bool  # the first value came after `=`
    where: str  # the file's field it came from (command, defaults.<key>)

    @property
    def words(self) -> list[str]:
        """What vLLM gets for it, as written."""
        return [self.token, *self.values[1:]] if self.inline else [self.token, *self.values]

    def shown(self, hidden: bool = False) -> str:
        """The group as written, or its flag alone when a value is a secret."""
        return self.name if hidden else " ".join(self.words)


def _is_flag(word: str) -> bool:
    """A word vLLM's parser takes for an option (a negative number is a value)."""
    return word.startswith("-") and word not in ("-", "--") and not _NUMBER.fullmatch(word)


class _Importer:
    """One import: the fields of `recipe` one after the other into `out`."""

    def __init__(self, out: Imported, recipe: EugrFile, text: str):
        self.out, self.recipe, self.text = out, recipe, text
        self.sparkrun: SparkrunFile | None = recipe if isinstance(recipe, SparkrunFile) else None
        self.serve: dict[str, Any] = {}  # field name -> value
        self.origin: dict[str, str] = {}  # camelCase key -> where in the file it came from
        self.extra: list[_Group] = []
        self.env: dict[str, str] = {}
        self.launcher_env: dict[str, str] = {}
        self.served_model: str | None = None
        self.seen: dict[str, tuple[list[str], str]] = {}  # flag identity -> (values, as shown)

    def run(self) -> None:
        self._launcher_fields()
        groups = self._serve_line()
        if self.out.not_vllm is not None:
            return
        for group in groups:
            self._group(group)
        self._env()
        self._document()  # validated even after a refusal: each field's problem is named

    # -------------------------------------------------------------- what is not vLLM's
    def _launcher_fields(self) -> None:
        r, s, note = self.recipe, self.sparkrun, self.out.note
        if r.container:
            note(f"container {r.container}", "the image is the stack's image.ref, not a recipe "
                                             "key")
        if r.build_args:
            note("build_args", f"{' '.join(r.build_args)}: builds the launcher's image; the "
                               "stack serves image.ref as built")
        for mod in r.mods:
            note(f"mods: {mod}", "a patch the launcher applies to its container (third-party "
                                 "code); the stack runs image.ref unpatched: an image that "
                                 "needs it is built with it")
        if r.cluster_only or r.solo_only:
            note("cluster_only" if r.cluster_only else "solo_only",
                 "the nodes are the stack's (spark-vllm:nodes)")
        if r.benchmark:
            note("benchmark", "the launcher's benchmark run (spark-vllm's is bench/)")
        if s is None:
            return
        if s.runtime in ("vllm-ray", "vllm-distributed"):
            note(f"runtime {s.runtime}", "the stack's key spark-vllm:vllm.executor (ray or mp)")
        if s.model_revision:
            note(f"model_revision {s.model_revision}", "the stack's key "
                                                       "spark-vllm:model.revision")
        for key in ("mode", "min_nodes", "max_nodes"):
            if getattr(s, key) is not None:
                note(key, "the nodes are the stack's (spark-vllm:nodes)")
        extra_meta = sorted(set(s.metadata) - {"description"})
        if extra_meta:
            note(f"metadata ({', '.join(extra_meta)})", "sparkrun's estimates and display "
                                                        "data, not serve settings")
        if s.pre_exec:
            self.out.refuse("pre_exec", "commands that change the container before vLLM "
                                        "starts; the stack runs image.ref as built: remove "
                                        "them from the file if the image already has what "
                                        "they do")
        for key in ("post_exec", "post_commands"):
            if getattr(s, key):
                note(key, "commands run after the server is up (warm-up, checks); not part "
                          "of serving")
        if s.stop_after_post:
            note("stop_after_post", "a one-shot run of sparkrun's")
        if s.builder or s.builder_config:
            note("builder", "builds sparkrun's image; the stack serves image.ref")
        if s.executor_config:
            note("executor_config", "container settings the stack sets itself "
                                    "(components/ray_cluster.py, components/vllm_server.py)")
        if s.distribution_config:
            note("distribution_config", "the stack fetches spark-vllm:model.repo itself (and "
                                        "spark-vllm:model.drafter)")
        for key in sorted(s.runtime_config):
            self.out.refuse(f"runtime_config.{key}", "a runtime-specific setting the "
                                                     "importer does not know")

    # ------------------------------------------------------------------ the serve line
    def _serve_line(self) -> list[_Group]:
        """The `vllm serve` arguments as groups (a flag and its values), with the field each
        came from; the first positional word is the model."""
        r = self.recipe
        values: dict[str, Any] = dict(r.defaults)
        if r.model and "model" not in values:
            values["model"] = r.model
        if r.command is None:
            if self.sparkrun is None:
                self.out.refuse("command", "missing: the eugr format requires the `vllm serve` "
                                           f"line ({EUGR_FORMAT_DOC})")
                return []
            return self._sparkrun_flags()
        used: set[str] = set()
        missing: set[str] = set()
        command = _CONTINUATION.sub(" ", r.command)
        for _ in range(8):  # a default may name another (sparkrun substitutes until stable)
            before = command
            command, missing = _substitute(command, values, used)
            if command == before or missing:
                break
        for key in sorted(missing):
            self.out.refuse(f"command: {{{key}}}", "a placeholder with no value in defaults")
        if self.out.format == "eugr" and "{{" in command:  # eugr's literal braces, doubled
            command = command.replace("{{", "{").replace("}}", "}")
        if used:
            self.out.carry(f"defaults: {', '.join(sorted(used))}: the command's placeholders, "
                           "filled in before its flags were read (their values are in the "
                           "flags' lines)")
        for key in sorted(set(r.defaults) - used):
            self._unused_default(key)
        if _SHELL.search(command):
            self.out.refuse("command", f"{clip(command.strip(), 120)}: shell syntax "
                                       "(; & | < > ` $()): expected one `vllm serve` line")
            return []
        try:
            argv = shlex.split(command, comments=True)
        except ValueError as exc:
            self.out.refuse("command", f"cannot be split like a shell line ({exc})")
            return []
        if argv[:2] != ["vllm", "serve"]:
            self.out.not_vllm = (f"command {clip(' '.join(argv[:3]))}: not a `vllm serve` line "
                                 "(this stack serves with vLLM only)")
            self.out.refuse("command", self.out.not_vllm)
            return []
        return self._grouped(argv[2:], "command")

    def _unused_default(self, key: str) -> None:
        if self.sparkrun is not None and key == "served_model_name":
            self.out.note(f"defaults.{key}", "the stack's key spark-vllm:vllm.servedModelName "
                                             "(sparkrun adds --served-model-name from it)")
        else:
            self.out.note(f"defaults.{key}", "no placeholder of command uses it")

    def _sparkrun_flags(self) -> list[_Group]:
        groups: list[_Group] = []
        if self.recipe.model:
            self.served_model = self.recipe.model
        defaults = self.recipe.defaults
        for key in sorted(set(defaults) - set(SPARKRUN_DEFAULT_FLAGS)):
            self.out.note(f"defaults.{key}", "sparkrun passes it to a command template only, "
                                             "and this recipe has no command")
        for key in SPARKRUN_DEFAULT_FLAGS:
            if key not in defaults or defaults[key] is None:
                continue
            value = defaults[key]
            flag = SPARKRUN_RENAMED.get(key, "--" + key.replace("_", "-"))
            where = f"defaults.{key}"
            if key in SPARKRUN_BOOLEAN_DEFAULTS:
                if value is True or str(value).lower() in ("true", "1", "yes"):
                    groups.append(_Group(flag, flag, [], False, where))
                else:
                    self.out.note(where, f"{_text(value)}: sparkrun makes no flag of a false "
                                         "switch")
            else:
                groups.append(_Group(flag, flag, [_text(value)], False, where))
        return groups

    def _grouped(self, argv: list[str], where: str) -> list[_Group]:
        groups: list[_Group] = []
        i = 0
        while i < len(argv):
            word = argv[i]
            i += 1
            if not _is_flag(word):
                self._positional(word, where)
                continue
            name, sep, inline = word.partition("=")
            values = [inline] if sep else []
            while i < len(argv) and not _is_flag(argv[i]):
                values.append(argv[i])
                i += 1
            groups.append(_Group(word, name, values, bool(sep), where))
        return groups

    def _positional(self, word: str, where: str) -> None:
        model = self.recipe.model
        if self.served_model is None:
            self.served_model = word
            if model is not None and word != model:
                self.out.refuse(f"{where}: {word}", f"serves another model than model: {model}")
            return
        self.out.refuse(f"{where}: {word}", "a second positional argument (vllm serve takes one "
                                            "model)")

    def _group(self, g: _Group) -> None:
        canon = owned_flag(g.token)
        if (canon is not None and len(canon) == 2 and g.name != canon
                and g.name.startswith(canon) and not g.inline):
            # `-n2`: argparse reads a two-character option's value attached to it
            g = _Group(g.token, canon, [g.name[2:], *g.values], True, g.where)
        key = _SERVE_FLAG.get(canon) if canon else None
        negated = _negated_key(g.name) if key is None and canon is None else None
        if negated is not None:
            key, canon = negated, g.name
        # the value of --api-key, of any secret-named flag, or one shaped like a token is a
        # secret: never in a message (extraArgs refuses them: config/serve.py)
        hidden = canon == "--api-key" or secret_flag(g.name) or any(
            secret_value(v) for v in g.values)
        label = f"{g.where}: {g.shown(hidden)}"
        if any(_PLACEHOLDER.fullmatch(v) for v in g.values):
            return  # a placeholder with no value: refused with the command
        if canon is not None and canon in FORBIDDEN_FLAGS:
            spelled = "" if g.name == canon else f" (as {g.name})"
            self.out.refuse(label, f"{canon}{spelled} {FORBIDDEN_FLAGS[canon]} (docs/design.md "
                                   "\"What extraArgs may set\")")
            return
        ident = key.name if key is not None else canon or _identity(g.name)
        if key is not None and key.flag.argv is Argv.JSON and "." in g.name:
            ident = g.name.replace("_", "-")  # each sub-key its own
        if ident in self.seen:
            before, shown = self.seen[ident]
            if before == g.values:
                self.out.note(label, f"given twice with the same value (also {shown}): carried "
                                     "once")
                return
            if key is not None or canon is not None:
                self.out.refuse(label, f"given twice with different values (also {shown}): "
                                       "say which")
                return
            self.out.note(label, f"given twice (also {shown}): both carried in this order; "
                                 "vLLM's parser takes the last for a single-value flag")
        self.seen.setdefault(ident, (list(g.values), g.shown(hidden)))
        if key is not None:
            self._serve_key(key, g, negated is not None, label)
        elif canon is not None:
            self._owned(canon, g, label, hidden)
        else:
            self._extra(g, label)

    def _serve_key(self, key: ServeKey, g: _Group, negated: bool, label: str) -> None:
        if key.flag.argv in _BOOLEAN:
            if g.values:
                self.out.refuse(label, "expected the flag alone (a switch takes no value)")
                return
        elif len(g.values) != 1:
            self.out.refuse(label, "expected a value after the flag" if not g.values else
                            f"expected one value after the flag, got {len(g.values)}")
            return
        if key.name not in RECIPE_FIELDS:
            self.out.note(label, f"the stack's key spark-vllm:vllm.{key.key}, not a recipe's")
            return
        value = g.values[0] if g.values else ""
        parsed: Any
        if key.flag.argv in _BOOLEAN:
            parsed = not (negated or g.name.startswith("--no-"))
        elif key.flag.argv is Argv.JSON:
            parsed = self._json(key, g.name, value, label)
            if parsed is None:
                return
        elif key.flag.argv is Argv.TEMPLATE:
            if value not in recipe_files.chat_templates():
                self.out.note(label, f"not a chat template shipped in {SHIPPED_DIR}/ (vLLM "
                                     "serves the model's own; ship a <name>.jinja there and "
                                     "set chatTemplate)")
                return
            parsed = value
        else:
            parsed = _typed(key.name, value)
        self.serve[key.name] = parsed
        # a JSON key made of several flags (`--x.method mtp --x.model m`) names each of them
        before = self.origin.get(key.key) if key.flag.argv is Argv.JSON else None
        self.origin[key.key] = label if before is None else f"{before}; {label}"

    def _json(self, key: ServeKey, name: str, value: str, label: str) -> Any:
        if "." in name:  # --speculative-config.num_speculative_tokens 2
            sub = name.split(".", 1)[1]
            try:
                item = json.loads(value)
            except ValueError:
                item = value
            current = self.serve.get(key.name, {})
            return {**current, sub: item}
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            self.out.refuse(label, f"expected JSON ({exc})")
            return None
        if not isinstance(parsed, dict):
            self.out.refuse(label, "expected a JSON object")
            return None
        return {**self.serve.get(key.name, {}), **parsed}

    def _owned(self, canon: str, g: _Group, label: str, hidden: bool) -> None:
        if canon == "--model":
            value = g.values[0] if len(g.values) == 1 else None
            expected = self.recipe.model or self.served_model
            if expected is not None and value != expected:
                self.out.refuse(label, f"serves another model than {expected}")
            elif self.served_model is None:
                self.served_model = value
            return
        if canon == "--api-key" or hidden:
            self.out.note(label, f"owned by {OWNED_FLAGS[canon]}: the stack passes its own key "
                                 "(the value is not carried, nor shown)")
            return
        if canon not in _NO_VALUE_OWNED and not g.values:
            self.out.refuse(label, "expected a value after the flag")
            return
        self.out.note(label, f"owned by {OWNED_FLAGS[canon]}")

    def _extra(self, g: _Group, label: str) -> None:
        try:
            TypeAdapter(ExtraArgs).validate_python(g.words)
        except ValidationError as exc:
            msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            self.out.refuse(label, f"a vLLM flag that is not a serve key here, and extraArgs "
                                   f"refuses it: {msg}")
            return
        self.extra.append(g)
        self.origin.setdefault("extraArgs", label)

    # ------------------------------------------------------------------------ env
    def _env(self) -> None:
        for var, raw in (self.recipe.env or {}).items():
            where = f"env.{var}"
            if var in STACK_ENV:
                self.out.note(where, "set by the stack itself per node (config/recipes.py "
                                     "STACK_ENV)")
                continue
            if isinstance(raw, bool):
                self.out.refuse(where, "a YAML boolean: quote the value the variable takes")
                continue
            value = _text(raw)
            if secret_env_name(var) or secret_value(value):
                self.out.refuse(where, "a secret (not shown): a recipe holds none; the stack's "
                                       "secrets are spark-vllm:hfToken and spark-vllm:vllmApiKey")
                continue
            if self.sparkrun is not None and "$" in value:
                self.out.refuse(where, "expands the control machine's environment ($VAR); "
                                       "give the value itself")
                continue
            problem = extra_env_problem(var)
            if problem is not None:
                self.out.refuse(where, f"{problem} (docs/design.md \"What extraEnv may set\")")
                continue
            if var.startswith(LAUNCHER_ENV_FAMILIES):
                self.launcher_env[var] = value
                self.origin.setdefault("launcherEnv", where)
            else:
                self.env[var] = value
                self.origin.setdefault("env", where)

    # ----------------------------------------------------------------- the document
    def _document(self) -> None:
        r, out = self.recipe, self.out
        model = r.model or self.served_model
        if model is None:
            out.refuse("model", "missing: neither `model` nor the `vllm serve` line names it")
            return
        description = r.description or (self.sparkrun.metadata.get("description")
                                        if self.sparkrun else None)
        if not r.description and description:
            self.origin["description"] = "metadata.description"
        self.origin["model"] = "model" if r.model else "command"
        doc: dict[str, Any] = {
            "name": out.name,
            "description": " ".join(str(description or f"{model}, imported from "
                                        f"{out.file} ({out.format} format)").split()),
            "model": model,
            "sources": [self._source(model)],
        }
        for key in SERVE_KEYS:
            if key.name in self.serve:
                doc[key.key] = self.serve[key.name]
        extra_args = [w for g in self.extra for w in g.words]
        if extra_args:
            doc["extraArgs"] = extra_args
        doc["env"] = self.env
        doc["launcherEnv"] = self.launcher_env
        try:
            recipe = Recipe.model_validate(doc)
        except ValidationError as exc:
            for err in exc.errors():
                loc = tuple(err["loc"])
                if not loc:  # a rule of the whole recipe: said at the key it names
                    rule = str(err["msg"]).removeprefix("Value error, ")
                    named = [k for k in self.origin if k in rule]
                    out.refuse(self.origin[named[0]] if named else "(the recipe)", rule)
                    continue
                top = str(loc[0])
                # config.errors words it as the stack config's messages; its key path is ours
                msg = describe(dict(err))[len(key_path(loc)) + len(": "):]
                where = self.origin.get(top, ".".join(str(p) for p in loc) or "(the recipe)")
                out.refuse(where, f"{top}: {msg}" if top and top not in where else msg)
            return
        if out.refused:
            return
        for problem in stack_problems(recipe):
            out.refuse("a stack on this recipe", problem)
        if out.refused:
            return
        out.recipe = recipe
        out.document = doc
        for top, value in doc.items():
            if top in ("name", "sources", "extraArgs", "env", "launcherEnv"):
                continue
            origin = self.origin.get(top)
            out.carry(f"{top}: {_shown(value)}" + (f"  <- {origin}" if origin else "")
                      + _what_a_stack_adds(top, out))
        for g in self.extra:
            out.carry(f"extraArgs: {' '.join(g.words)}  <- {g.where}: {g.shown()} (no serve key "
                      "of this stack has it: the image's vLLM parses it before it serves)")
        for top in ("env", "launcherEnv"):
            for var, value in doc[top].items():
                out.carry(f"{top}.{var}: {value}  <- env.{var}")

    def _source(self, model: str) -> dict[str, str]:
        digest = hashlib.sha256(self.text.encode("utf-8")).hexdigest()
        what = (f"every value here: imported by `spark-vllm recipes import` from "
                f"{self.out.file} ({self.out.format} format, {FORMAT_DOCS[self.out.format]}; "
                f"sha256 {digest})")
        named = _SOURCE_COMMENT.search(self.text)
        if named:
            try:
                RecipeSource(url=named.group(1), covers=what)
            except ValidationError as exc:
                msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
                self.out.note(f"# source: {named.group(1)}", f"{msg}; the recipe cites itself")
            else:
                return {"url": named.group(1), "covers": what}
        return {"path": f"{SHIPPED_DIR}/{self.out.name}.yaml",
                "covers": what + "; the imported file is not kept in this repository"}


def _what_a_stack_adds(top: str, out: Imported) -> str:
    """What a stack that names the recipe must set beside it, said on the key's line."""
    if top == "trustRemoteCode" and out.document.get(top):
        return ("; a stack serving it pins spark-vllm:model.revision to a 40-hex commit (config "
                "refuses it otherwise) and has that commit's code reviewed (policy "
                "remote-code-reviewed)")
    if top == "speculativeConfig" and out.drafter is not None:
        return (f"; its drafter is another repo: a stack serving it declares "
                f"spark-vllm:model.drafter {{repo: {out.drafter}, revision: <40-hex commit>}}, "
                "fetched and verified on every node like the model")
    return ""


# ------------------------------------------------------------- as a stack would use it
def reference_stack(recipe: RecipeFile) -> dict[str, Any]:
    """The stack config an imported recipe is judged in (its top-level keys): two Sparks with
    documentation addresses, the recipe's model pinned to a commit, its drafter of another repo
    declared and pinned, images by digest, `vllm.recipe` the recipe by name."""
    spec = recipe.serve_settings().get("speculative_config") or {}
    drafter = spec.get("model") if isinstance(spec, dict) else None
    model: dict[str, Any] = {"repo": recipe.model, "revision": REFERENCE_COMMIT}
    if isinstance(drafter, str) and drafter != recipe.model:
        model["drafter"] = {"repo": drafter, "revision": REFERENCE_DRAFTER_COMMIT}

    def node(i: int) -> dict[str, Any]:
        return {"name": f"spark-{i}", "host": f"192.0.2.{20 + i}", "hostKey": _REFERENCE_KEY,
                "fabric": [{"interface": "enp1s0f1np1", "ip": f"192.168.177.{10 + i}"},
                           {"interface": "enP2p1s0f1np1", "ip": f"192.168.178.{10 + i}"}]}

    return {
        "environment": "staging",
        "nodes": [node(1), node(2)],
        "image": {"ref": "registry.example:5000/vllm" + _DIGEST},
        "model": model,
        "vllm": {"servedModelName": "imported", "recipe": recipe.name},
        "gateway": {"image": {"ref": "registry.example:5000/haproxy" + _DIGEST}},
    }


def stack_problems(recipe: RecipeFile) -> list[str]:
    """What a stack serving `recipe` (reference_stack) would be refused for, by the same config
    checks every stack runs: the recipe applied by name (config.recipes.trial)."""
    with trial(recipe):
        try:
            validate_config(reference_stack(recipe))
        except ConfigError as exc:
            return list(exc.problems)
    return []


def _substitute(command: str, values: Mapping[str, Any], used: set[str]) -> tuple[str, set[str]]:
    missing: set[str] = set()

    def one(m: re.Match[str]) -> str:
        start = m.start()
        if start > 0 and command[start - 1] == "{":  # `{{name}}`: a literal brace
            return m.group(0)
        key = m.group(1)
        if key not in values or values[key] is None:
            missing.add(key)
            return m.group(0)
        used.add(key)
        return _text(values[key])

    return _PLACEHOLDER.sub(one, command), missing


def _identity(name: str) -> str:
    """A flag as vLLM's parser names it (`--a_b` is `--a-b`; `--x.key` stays its own)."""
    if not name.startswith("--"):
        return name
    head, dot, rest = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def _negated_key(name: str) -> ServeKey | None:
    """`--no-X` for a boolean serve key X whose own table has no such spelling."""
    if not name.startswith("--no-"):
        return None
    key = _SERVE_FLAG.get("--" + name[len("--no-"):].replace("_", "-"))
    return key if key is not None and key.flag.argv in _BOOLEAN else None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _typed(name: str, text: str) -> Any:
    """`text` as the serve key `name` takes it: a number where the key is one."""
    candidates: list[Any] = []
    if _NUMBER.fullmatch(text):
        if re.fullmatch(r"[+-]?\d+", text):
            candidates.append(int(text))
        candidates.append(float(text))
    candidates.append(text)
    adapter: TypeAdapter[Any] = TypeAdapter(ServeSettings.model_fields[name].annotation or Any)
    for candidate in candidates:
        try:
            adapter.validate_python(candidate, strict=True)
        except ValidationError:
            continue
        return candidate
    return candidates[0]  # Recipe's validation words what is wrong with it


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


# ------------------------------------------------------------------------------- the output
def to_yaml(imported: Imported) -> str:
    """The typed recipe file of a successful import: a header that says where it came from and
    what was not carried (the notes), then the keys."""
    if imported.recipe is None:
        raise ValueError("to_yaml: the import was refused")
    lines = [f"# {imported.name}: imported by `spark-vllm recipes import` from {imported.file}",
             f"# ({imported.format} format). Check every value before a stack names it."]
    if imported.notes:
        lines.append("# Not carried:")
        lines += [f"#   - {_one_line(n.replace(': not carried: ', ': ', 1))}"
                  for n in imported.notes]
    body = yaml.safe_dump(imported.document, sort_keys=False, allow_unicode=True, width=100,
                          default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)
