"""Recipes: how to serve one model on the Sparks, shipped with the package.

A recipe is a YAML file in config/recipes_data/ (`<name>.yaml`, typed by config.models.Recipe):
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

import functools
import re
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import yaml
from pydantic import ValidationError

from config.errors import describe, key_path
from config.forms import KIB, clip
from config.models import Recipe

# Where the recipes are; tests point this at a folder of their own.
RECIPES_DIR: Traversable = resources.files("config") / "recipes_data"
CHAT_TEMPLATE_MAX_BYTES = 64 * KIB
_FILE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")


class RecipeError(ValueError):
    """A recipe that is not shipped, or a recipe (or chat template) file that is not valid.

    A ValueError, so pydantic reports it at the key that named the recipe."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def names() -> list[str]:
    """The recipes shipped (file names without .yaml), sorted."""
    return sorted(p.name[: -len(".yaml")] for p in RECIPES_DIR.iterdir()
                  if p.name.endswith(".yaml") and _FILE_NAME.fullmatch(p.name[: -len(".yaml")]))


def chat_templates() -> list[str]:
    """The chat templates shipped (`<name>.jinja`), sorted."""
    return sorted(p.name for p in RECIPES_DIR.iterdir()
                  if p.name.endswith(".jinja") and _FILE_NAME.fullmatch(p.name))


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
        allowed = ", ".join(f.alias or n for n, f in Recipe.model_fields.items())
        return f"recipe {name}: {_where(loc)}: unknown key; expected one of: {allowed}"
    if err["type"] == "value_error" and (not loc or isinstance(loc[-1], int)) \
            and isinstance(err.get("input"), dict):  # a rule of the whole recipe or a source
        rule = str(err["msg"]).removeprefix("Value error, ")
        return f"recipe {name}: {_where(loc) + ': ' if loc else ''}{rule}"
    # config.errors.describe words the message; its key path is replaced by the recipe's own
    text = describe(err)[len(key_path(loc)) + len(": "):]
    return f"recipe {name}: {_where(loc)}: {text}"


@functools.lru_cache(maxsize=64)
def _load(folder: str, name: str) -> Recipe:
    del folder  # the cache key: a test's own folder is another cache entry
    file = RECIPES_DIR / f"{name}.yaml"
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


def load_recipe(name: str) -> Recipe:
    """The recipe `name`, validated; RecipeError names what is wrong."""
    known = names()
    if name not in known:
        raise RecipeError([f"expected one of {known} (the recipes in config/recipes_data/)"])
    return _load(str(RECIPES_DIR), name)


@functools.lru_cache(maxsize=16)
def _template(folder: str, name: str) -> str:
    del folder
    try:
        data = (RECIPES_DIR / name).read_bytes()
    except OSError as exc:
        raise RecipeError([f"chat template {name}: cannot be read ({exc.strerror})"]) from None
    if len(data) > CHAT_TEMPLATE_MAX_BYTES:
        raise RecipeError([f"chat template {name}: {len(data)} bytes; expected at most "
                           f"{CHAT_TEMPLATE_MAX_BYTES}"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeError([f"chat template {name}: expected UTF-8 text"]) from None
    if "\0" in text or "{" not in text:
        raise RecipeError([f"chat template {name}: expected a Jinja template (text with "
                           "'{', no NUL)"])
    return text


def chat_template_text(name: str) -> str:
    """The text of the shipped chat template `name` (`<name>.jinja`), as vLLM will read it."""
    known = chat_templates()
    if name not in known:
        raise RecipeError([f"expected one of {known} (the chat templates in "
                           "config/recipes_data/), or null for the model's own"])
    return _template(str(RECIPES_DIR), name)


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
