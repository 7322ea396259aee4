"""Recipes: how to serve one model on the Sparks, shipped with the package.

A recipe is a YAML file in config/recipes_data/ (`<name>.yaml`, typed by Recipe below):
serve settings (the keys of `spark-vllm:vllm`), `env` for every vLLM process, `launcherEnv` for
the launcher (Ray, NCCL), the sources its values come from, and optionally a chat template
shipped beside it (`<name>.jinja`). A stack names one with `spark-vllm:vllm.recipe`.

Precedence, one rule everywhere: an explicit key of the stack file wins over the recipe, and the
recipe wins over the defaults of config/models.py. Serve settings are filled in by VllmConfig
(so any validation of the config applies them); the recipe's `env` and `launcherEnv` are merged
under `spark-vllm:nccl.extraEnv` (`with_recipe_env`, called by validate_config), which is how
they reach every node's Ray container (components/nccl.node_env) and so every vLLM process.

What a recipe change costs follows from where its values land (docs/contract.md, "Recipes"):
serve settings and the chat template change only `vllm serve` (the change table's "a vLLM serve
flag" row); `env`/`launcherEnv` change the Ray containers' environment ("NCCL/Ray env" row).

Errors name the recipe and the key inside its file (`recipe <name>: maxNumSeqs: got 0; ...`);
the stack config reports them at `spark-vllm:vllm.recipe`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import re
from collections.abc import Iterator
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from config import recipe_files
from config.errors import allowed_keys, describe, key_path
from config.forms import COMMIT, clip
from config.recipe_files import RecipeError
from config.serve import RECIPE_FIELDS, ServeSettings
from config.types import STACK_ENV as STACK_ENV  # defined there: extraEnv's check needs it
from config.types import AllowedEnv, ConfigModel, PlainEnv, RepoId

_COMMIT_IN_URL = re.compile(rf"/{COMMIT.pattern}(/|$|#)")
_PINNED_HOSTS = ("https://github.com/", "https://huggingface.co/")
_PATH = re.compile(r"/[A-Za-z0-9._/-]*")


def _not_stack_env(v: dict[str, str]) -> dict[str, str]:
    owned = sorted(k for k in v if k in STACK_ENV)
    if owned:
        raise ValueError(
            f"expected variables the stack does not set itself ({', '.join(owned)}): the stack "
            "derives them per node (components/nccl.node_env) or sets them in the containers"
        )
    return v


RecipeEnv = Annotated[PlainEnv, AfterValidator(_not_stack_env), AllowedEnv]
"""A recipe's environment: plain (no secrets, no control characters), nothing the stack sets
itself, and only what nccl.extraEnv may hold (config.types.extra_env_problem)."""


class RecipeSource(ConfigModel):
    """Where a recipe's values come from: a public URL, pinned to a commit on hosts that have
    commits (GitHub, Hugging Face), or a file of this repository."""

    url: str | None = None
    path: str | None = None
    covers: str  # which values this source supports

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not re.fullmatch(r"https://[A-Za-z0-9.-]+/[^\s]*", v):
            raise ValueError("expected an https URL")
        if v.startswith(_PINNED_HOSTS) and not _COMMIT_IN_URL.search(v):
            raise ValueError("expected a URL pinned to a 40-hex commit (.../blob/<commit>/...)")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and (not _PATH.fullmatch("/" + v) or ".." in v.split("/")):
            raise ValueError("expected a relative path in this repository, e.g. lab/tinymodel.py")
        return v

    @model_validator(mode="after")
    def _one(self) -> RecipeSource:
        if (self.url is None) == (self.path is None):
            raise ValueError("expected exactly one of url or path")
        return self


class RecipeFile(ConfigModel):
    """A recipe's own keys; `Recipe` adds the serve keys a recipe may set (config/serve.py)."""

    name: str
    description: str
    model: RepoId  # the Hugging Face repo the recipe was written for
    sources: list[RecipeSource] = Field(min_length=1)
    env: RecipeEnv = Field(default_factory=dict)
    launcher_env: RecipeEnv = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not recipe_files.FILE_NAME.fullmatch(v):
            raise ValueError("expected a name of lowercase letters, digits, '.' and '-'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RecipeFile:
        both = sorted(set(self.env) & set(self.launcher_env))
        if both:
            raise ValueError(f"expected each variable in env or launcherEnv, not both ({both})")
        serve = self.serve_settings()
        if serve.get("reasoning_parser_plugin") and not serve.get("trust_remote_code"):
            raise ValueError("expected trustRemoteCode with reasoningParserPlugin (the plugin is "
                             "the model repository's own Python code)")
        if serve.get("enable_auto_tool_choice") and not serve.get("tool_call_parser"):
            raise ValueError("expected toolCallParser with enableAutoToolChoice (vLLM refuses "
                             "--enable-auto-tool-choice without --tool-call-parser)")
        return self

    def serve_settings(self) -> dict[str, Any]:
        """The serve settings this recipe sets, by field name (copies: VllmConfig keeps them)."""
        return {n: copy.deepcopy(getattr(self, n)) for n in RECIPE_FIELDS
                if n in self.model_fields_set}


def _unset(name: str) -> Any:
    """A ServeSettings field as a recipe holds it: the same type and bounds, or null (unset)."""
    field = ServeSettings.model_fields[name]
    return Annotated[(field.annotation, *field.metadata)] | None, None


Recipe: type[RecipeFile] = create_model(
    "Recipe",
    __base__=RecipeFile,
    __module__=__name__,
    __doc__="""A recipe: how to serve one model on the Sparks, as a file in config/recipes_data/
    (`<name>.yaml`, camelCase keys). Its own keys (RecipeFile) and every serve key a recipe may
    set (config/serve.py, RECIPE), null or absent when it does not set it. `env`: environment of
    every vLLM process (vLLM's own and its libraries' settings); `launcherEnv`: environment of
    the launcher (Ray, NCCL) for this model. Both reach every node's Ray container, which runs
    the launcher and hosts vLLM's processes (components/nccl.node_env); the per-node launcher
    values (VLLM_HOST_IP, RAY_OVERRIDE_NODE_IP_ADDRESS, ...) are the stack's own.""",
    **{name: _unset(name) for name in RECIPE_FIELDS},
)


def _where(loc: tuple[Any, ...]) -> str:
    """A key path inside a recipe file, camelCase as written: `sources[0].url`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(the file)"


def _problem(name: str, err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        allowed = ", ".join(allowed_keys(Recipe))
        return f"recipe {name}: {_where(loc)}: unknown key; expected one of: {allowed}"
    if err["type"] == "value_error" and (not loc or isinstance(loc[-1], int)) \
            and isinstance(err.get("input"), dict):  # a rule of the whole recipe or a source
        rule = str(err["msg"]).removeprefix("Value error, ")
        return f"recipe {name}: {_where(loc) + ': ' if loc else ''}{rule}"
    # config.errors.describe words the message; its key path is replaced by the recipe's own
    text = describe(err)[len(key_path(loc)) + len(": "):]
    return f"recipe {name}: {_where(loc)}: {text}"


@functools.lru_cache(maxsize=64)
def _load(folder: str, name: str) -> RecipeFile:
    del folder  # the cache key: a test's own folder is another cache entry
    file = recipe_files.RECIPES_DIR / f"{name}.yaml"
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RecipeError([f"recipe {name}: cannot be read as YAML ({clip(str(exc), 160)})"]) \
            from None
    if not isinstance(data, dict):
        raise RecipeError([f"recipe {name}: (the file): got {clip(data)}; expected a mapping"])
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError([_problem(name, dict(e)) for e in exc.errors()]) from None
    if recipe.name != name:
        raise RecipeError([f"recipe {name}: name: got {recipe.name!r}; expected {name!r} "
                           f"(the file's name)"])
    return recipe


# A recipe not shipped yet, read under its name by the config while `trial` runs (the importer
# judges a recipe the way a stack would use it: tools/recipe_import.py)
_TRIAL: contextvars.ContextVar[RecipeFile | None] = contextvars.ContextVar("trial", default=None)


@contextlib.contextmanager
def trial(recipe: RecipeFile) -> Iterator[None]:
    """While it runs, `load_recipe(recipe.name)` is `recipe` (validated, not yet shipped): the
    stack config applies it by name through the same code as a shipped one."""
    token = _TRIAL.set(recipe)
    try:
        yield
    finally:
        _TRIAL.reset(token)


def load_recipe(name: str) -> RecipeFile:
    """The recipe `name`, validated; RecipeError names what is wrong."""
    candidate = _TRIAL.get()
    if candidate is not None and candidate.name == name:
        return candidate
    known = recipe_files.names()
    if name not in known:
        raise RecipeError([f"expected one of {known} (the recipes in config/recipes_data/)"])
    return _load(str(recipe_files.RECIPES_DIR), name)


def with_recipe_env(raw: Any) -> Any:
    """`raw` (the stack's top-level keys) with the recipe's `env` and `launcherEnv` merged
    under `nccl.extraEnv`: the stack file's own extraEnv entries win. Anything malformed is
    returned as it is, for validation to report by key path."""
    if not isinstance(raw, dict) or not isinstance(raw.get("vllm"), dict):
        return raw
    name = raw["vllm"].get("recipe")
    if not isinstance(name, str):
        return raw
    try:
        recipe = load_recipe(name)
    except RecipeError:
        return raw
    recipe_env = {**recipe.env, **recipe.launcher_env}
    if not recipe_env:
        return raw
    nccl = raw.get("nccl", {})
    if not isinstance(nccl, dict):
        return raw
    key = "extra_env" if "extra_env" in nccl and "extraEnv" not in nccl else "extraEnv"
    own = nccl.get(key, {})
    if not isinstance(own, dict):
        return raw
    return {**raw, "nccl": {**nccl, key: {**recipe_env, **own}}}
