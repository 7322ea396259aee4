"""The files shipped in config/recipes_data/: which recipes and chat templates there are, and a
chat template's text. Reading only; what a recipe means is config/recipes.py.

Below every model of the package: the chat template a stack or a recipe names is checked here
(config/types.py ChatTemplateName), and the recipes module validates the recipe files read here.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from importlib.resources.abc import Traversable

from config.forms import KIB

# Where the recipes are; tests point this at a folder of their own.
RECIPES_DIR: Traversable = resources.files("config") / "recipes_data"
CHAT_TEMPLATE_MAX_BYTES = 64 * KIB
FILE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")


class RecipeError(ValueError):
    """A recipe that is not shipped, or a recipe (or chat template) file that is not valid.

    A ValueError, so pydantic reports it at the key that named the recipe."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def names() -> list[str]:
    """The recipes shipped (file names without .yaml), sorted."""
    return sorted(p.name[: -len(".yaml")] for p in RECIPES_DIR.iterdir()
                  if p.name.endswith(".yaml") and FILE_NAME.fullmatch(p.name[: -len(".yaml")]))


def chat_templates() -> list[str]:
    """The chat templates shipped (`<name>.jinja`), sorted."""
    return sorted(p.name for p in RECIPES_DIR.iterdir()
                  if p.name.endswith(".jinja") and FILE_NAME.fullmatch(p.name))


@functools.lru_cache(maxsize=16)
def _template(folder: str, name: str) -> str:
    del folder  # the cache key: a test's own folder is another cache entry
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
