"""`spark-vllm recipes`: the typed recipes shipped in config/recipes_data/, and importing a
community recipe file into one.

    spark-vllm recipes list [--json]            name, model and description of each recipe
    spark-vllm recipes show NAME [--json]       its keys as validated and the vLLM flags they make
    spark-vllm recipes import FILE [--name NAME] [--out DIR] [--dry-run] [--force]

`import` reads an eugr (spark-vllm-docker) or sparkrun recipe file from disk and writes
`<name>.yaml` (default folder: the package's config/recipes_data/), validated by Recipe first;
what it carries, notes and refuses, and why, is config/recipe_import.py's. It never overwrites a
recipe without --force; --dry-run prints the YAML and writes nothing.

Exit codes: 0 done; 1 refused (a field the stack cannot carry, or the recipe exists); 2 the
input is not usable (an unknown recipe name; a file that is not UTF-8 YAML, not a mapping, or in
no format the importer knows; a bad option).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from config import recipe_files
from config.recipe_files import RecipeError
from config.recipe_import import (
    MAX_FILE_BYTES,
    ImportFormatError,
    import_recipe,
    to_yaml,
)
from config.recipes import RecipeFile, load_recipe
from config.serve import SERVE_KEYS
from hostscripts.vllm import key_flags


class UsageProblem(click.ClickException):
    """An input the command cannot use at all: exit 2, like click's own usage errors."""

    exit_code = 2


def _console() -> Console:
    # sys.stdout at call time (click's test runner swaps it); wide enough for the flag column
    return Console(width=max(Console().width, 120), highlight=False, soft_wrap=False)


def _short(text: str, limit: int = 80) -> str:
    first = text.split(": ", 1)[0] if len(text) > limit else text
    return first if len(first) <= limit else first[: limit - 3].rstrip() + "..."


def _load(name: str) -> RecipeFile:
    known = recipe_files.names()
    if name not in known:
        raise UsageProblem(f"unknown recipe {name!r}; known: {', '.join(known) or '(none)'} "
                           "(the recipes in config/recipes_data/)")
    try:
        return load_recipe(name)
    except RecipeError as exc:
        raise click.ClickException("; ".join(exc.problems)) from None


@click.group("recipes")
def group() -> None:
    """The typed recipes (config/recipes_data/): list, show, import a community recipe."""


@group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_recipes(as_json: bool) -> None:
    """The shipped recipes: name, model and a short description."""
    rows: list[dict[str, Any]] = []
    for name in recipe_files.names():
        try:
            r = load_recipe(name)
        except RecipeError as exc:
            rows.append({"name": name, "model": None, "description": None,
                         "problems": exc.problems})
            continue
        rows.append({"name": name, "model": r.model, "description": r.description})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("name", "model", "description", title="recipes in config/recipes_data/")
    for row in rows:
        text = (_short(row["description"]) if row["description"] is not None
                else "[red]invalid:[/] " + "; ".join(row["problems"]))
        table.add_row(row["name"], row["model"] or "-", text)
    _console().print(table)
    if any("problems" in row for row in rows):
        raise click.ClickException("a shipped recipe is not valid (see above)")


def recipe_view(r: RecipeFile) -> dict[str, Any]:
    """`recipes show --json`: the recipe's keys as validated (camelCase), and per serve key the
    `vllm serve` arguments it becomes (hostscripts/vllm.py key_flags, as the stack renders them)."""
    settings = r.serve_settings()
    keys = {k.name: k.key for k in SERVE_KEYS}
    return {
        "name": r.name,
        "description": r.description,
        "model": r.model,
        "sources": [s.model_dump(by_alias=True, exclude_none=True) for s in r.sources],
        "serve": {keys[n]: v for n, v in settings.items()},
        "flags": {keys[n]: key_flags(n, v, model=r.model, commit=None)
                  for n, v in settings.items()},
        "env": dict(r.env),
        "launcherEnv": dict(r.launcher_env),
    }


@group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def show(name: str, as_json: bool) -> None:
    """A recipe's keys (serve settings, env, launcherEnv, sources) and the vLLM flags they
    become."""
    view = recipe_view(_load(name))
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    console = _console()
    console.print(f"[bold]{view['name']}[/]: {view['model']}")
    console.print(view["description"], markup=False)
    serve = Table("key", "value", "vLLM flags", title="serve settings (spark-vllm:vllm keys)")
    for key, value in view["serve"].items():
        flags = " ".join(view["flags"][key]) or "(none: false is vLLM's default)"
        serve.add_row(key, json.dumps(value) if isinstance(value, dict | list) else
                      str(value).lower() if isinstance(value, bool) else str(value), flags)
    console.print(serve)
    env = Table("variable", "value", "where", title="environment (under nccl.extraEnv)")
    for where in ("env", "launcherEnv"):
        for var, value in view[where].items():
            env.add_row(var, value, where)
    console.print(env if env.row_count else "environment: none")
    sources = Table(title="sources")
    sources.add_column("source", overflow="fold")  # a URL is shown whole
    sources.add_column("covers")
    for s in view["sources"]:
        sources.add_row(s.get("url") or s.get("path"), s["covers"])
    console.print(sources)


def _check_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    del ctx, param
    if value is not None and not recipe_files.FILE_NAME.fullmatch(value):
        raise click.BadParameter("expected lowercase letters, digits, '.' and '-' (at most 64)")
    return value


@group.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", callback=_check_name,
              help="The recipe's name (default: from the file's name).")
@click.option("--out", "out_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Folder to write <name>.yaml into (default: config/recipes_data of the "
                   "package).")
@click.option("--dry-run", is_flag=True, help="Print the YAML; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing recipe of that name.")
def import_cmd(file: Path, name: str | None, out_dir: Path | None, dry_run: bool,
               force: bool) -> None:
    """Turn a community recipe file (eugr's spark-vllm-docker or sparkrun format) into a typed
    recipe."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise UsageProblem(f"recipe file {file}: cannot be read ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageProblem(f"recipe file {file}: larger than {MAX_FILE_BYTES // 1024} KiB: "
                           "not a recipe file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageProblem(f"recipe file {file}: expected UTF-8 text") from None
    try:
        result = import_recipe(text, file_name=file.name, name=name)
    except ImportFormatError as exc:
        raise UsageProblem(f"recipe file {file}: {exc}") from None

    click.echo(f"{file.name}: {result.format} format -> recipe {result.name}", err=True)
    for title, lines in (("carried", result.carried), ("noted", result.notes)):
        if lines:
            click.echo(f"{title}:", err=True)
            for line in lines:
                click.echo(f"  {line}", err=True)
    if result.refused:
        click.echo("refused:", err=True)
        for line in result.refused:
            click.echo(f"  {line}", err=True)
        raise click.ClickException(f"nothing written: {len(result.refused)} field(s) refused")

    target = (out_dir or Path(str(recipe_files.RECIPES_DIR))) / f"{result.name}.yaml"
    if dry_run:
        click.echo(to_yaml(result), nl=False)
        exists = " (it exists: --force would overwrite it)" if target.exists() else ""
        click.echo(f"dry run: {target} not written{exists}", err=True)
        return
    if target.exists() and not force:
        raise click.ClickException(f"{target} exists: not overwritten (--force to overwrite, "
                                   "--name for another name)")
    _write(target, to_yaml(result))
    click.echo(f"wrote {target}", err=True)


def _write(target: Path, text: str) -> None:
    """`text` into `target` at once (a temporary file beside it, then a rename)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
