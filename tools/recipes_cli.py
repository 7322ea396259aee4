"""`spark-vllm recipes`: the typed recipes shipped in config/recipes_data/, and importing a
community recipe file into one.

    spark-vllm recipes list [--json]            name, model and description of each recipe
    spark-vllm recipes show NAME [--json]       its keys as validated and the vLLM flags they make
    spark-vllm recipes import PATH [--name NAME] [--out DIR] [--dry-run] [--force]

`import` reads an eugr (spark-vllm-docker) or sparkrun recipe file, or every `*.yaml`/`*.yml`
file of a folder and its subfolders, and writes `<name>.yaml` for each recipe a stack can serve
(default folder: the package's config/recipes_data/; a file's name from its own, a folder's
files' from their path in the folder, `/` as `-`). What it carries, notes and refuses, and why,
is tools/recipe_import.py's: a recipe is imported only when it validates as a Recipe and a
stack on it passes the config's checks. It never overwrites a recipe without --force; --dry-run
prints the YAML (of a single file) and writes nothing. It ends with a table: per file, imported
(into which recipe), refused (why, one line), not vLLM (another runtime), not a recipe (not
YAML, or in no format it knows), or exists (not overwritten).

Exit codes: 0 done (a folder: no file refused; files of another runtime and files that are no
recipe are listed, not failures); 1 refused (a field the stack cannot carry, or the recipe
exists); 2 the input is not usable (an unknown recipe name; a single file that is not UTF-8
YAML, not a mapping, or in no format the importer knows; a bad option).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from config import recipe_files
from config.recipe_files import RecipeError
from config.recipes import RecipeFile, load_recipe
from config.serve import SERVE_KEYS
from hostscripts.vllm import key_flags
from tools.recipe_import import (
    MAX_FILE_BYTES,
    Imported,
    ImportFormatError,
    default_name,
    import_recipe,
    to_yaml,
)


class UsageProblem(click.ClickException):
    """An input the command cannot use at all: exit 2, like click's own usage errors."""

    exit_code = 2


def _console(err: bool = False) -> Console:
    # sys.stdout at call time (click's test runner swaps it); wide enough for the flag column
    return Console(width=max(Console().width, 120), highlight=False, soft_wrap=False,
                   stderr=err)


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


@dataclass
class Row:
    """One file of an import: what became of it, in one line."""

    file: str
    outcome: str  # imported, refused, not vLLM, not a recipe, exists
    recipe: str  # the recipe's name ("-" when none)
    why: str  # one line ("" when imported)


def _read(file: Path) -> str:
    """The file's text; UsageProblem (exit 2) when it cannot be a recipe file at all."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise UsageProblem(f"recipe file {file}: cannot be read ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageProblem(f"recipe file {file}: larger than {MAX_FILE_BYTES // 1024} KiB: "
                           "not a recipe file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageProblem(f"recipe file {file}: expected UTF-8 text") from None


def recipe_files_in(folder: Path) -> list[Path]:
    """The YAML files of `folder` and its subfolders, in path order (hidden ones left out)."""
    return sorted(p for p in folder.rglob("*") if p.is_file()
                  and p.suffix.lower() in (".yaml", ".yml")
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def folder_names(files: list[str]) -> dict[str, str]:
    """A recipe name per file of a folder (paths relative to it): the file's own name, or, where
    two files share it, as much of their folders before it as tells them apart."""
    parts = {f: f.split("/") for f in files}
    depth = dict.fromkeys(files, 1)
    while True:
        names = {f: default_name("-".join(parts[f][-depth[f]:])) for f in files}
        clash = {f for f in files if sum(n == names[f] for n in names.values()) > 1
                 and depth[f] < len(parts[f])}
        if not clash:
            return names
        for f in clash:
            depth[f] += 1


def _details(result: Imported) -> None:
    click.echo(f"{result.file}: {result.format} format -> recipe {result.name}", err=True)
    for title, lines in (("carried", result.carried), ("noted", result.notes),
                         ("refused", result.refused)):
        if lines:
            click.echo(f"{title}:", err=True)
            for line in lines:
                click.echo(f"  {line}", err=True)


def _table(rows: list[Row], title: str, *, err: bool = False) -> None:
    """The import's last word: a row per file. On stderr for a single file (whose YAML a dry
    run prints on stdout), on stdout for a folder."""
    table = Table(title=title)
    table.add_column("file", overflow="fold")
    table.add_column("result", no_wrap=True)
    table.add_column("recipe", overflow="fold")
    table.add_column("why", overflow="fold")
    style = {"imported": "green", "refused": "red", "not vLLM": "yellow",
             "not a recipe": "yellow", "exists": "red"}
    for row in rows:
        table.add_row(row.file, f"[{style[row.outcome]}]{row.outcome}[/]", row.recipe,
                      Text(row.why))
    _console(err=err).print(table)
    counts = {o: sum(r.outcome == o for r in rows) for o in style}
    vllm = counts["imported"] + counts["refused"] + counts["exists"]
    summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    click.echo(f"{len(rows)} file(s): {summary}; of the {vllm} vLLM recipe(s), "
               f"{counts['imported']} imported", err=err)


@group.command("import")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--name", callback=_check_name,
              help="The recipe's name (default: from the file's name; a single file only).")
@click.option("--out", "out_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Folder to write <name>.yaml into (default: config/recipes_data of the "
                   "package).")
@click.option("--dry-run", is_flag=True, help="Print the YAML (a single file); write nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing recipe of that name.")
def import_cmd(path: Path, name: str | None, out_dir: Path | None, dry_run: bool,
               force: bool) -> None:
    """Turn community recipe files (eugr's spark-vllm-docker or sparkrun format; a file or a
    folder of them) into typed recipes a stack can serve."""
    target_dir = out_dir or Path(str(recipe_files.RECIPES_DIR))
    if path.is_dir():
        if name is not None:
            raise UsageProblem("--name names one recipe: give a file, not a folder")
        _import_folder(path, target_dir, dry_run, force)
        return
    try:
        result = import_recipe(_read(path), file_name=path.name, name=name)
    except ImportFormatError as exc:
        raise UsageProblem(f"recipe file {path}: {exc}") from None
    _details(result)
    target = target_dir / f"{result.name}.yaml"
    row = Row(path.name, result.outcome, result.name, result.reason)
    if result.recipe is None:
        _table([row], "recipes import", err=True)
        raise click.ClickException(f"nothing written: {len(result.refused)} field(s) refused")
    if dry_run:
        click.echo(to_yaml(result), nl=False)
        exists = " (it exists: --force would overwrite it)" if target.exists() else ""
        click.echo(f"dry run: {target} not written{exists}", err=True)
        _table([row], "recipes import (dry run)", err=True)
        return
    if target.exists() and not force:
        _table([Row(path.name, "exists", result.name, f"{target} exists: not overwritten "
                                                       "(--force, or --name for another name)")],
               "recipes import", err=True)
        raise click.ClickException(f"{target} exists: not overwritten (--force to overwrite, "
                                   "--name for another name)")
    _write(target, to_yaml(result))
    click.echo(f"wrote {target}", err=True)
    _table([row], "recipes import", err=True)


def _import_folder(folder: Path, target_dir: Path, dry_run: bool, force: bool) -> None:
    rows: list[Row] = []
    names: dict[str, str] = {}  # recipe name -> the file that took it
    files = recipe_files_in(folder)
    named = folder_names([f.relative_to(folder).as_posix() for f in files])
    for file in files:
        rel = file.relative_to(folder).as_posix()
        try:
            result = import_recipe(_read(file), file_name=rel, name=named[rel])
        except (ImportFormatError, UsageProblem) as exc:
            why = str(exc.message if isinstance(exc, UsageProblem) else exc)
            rows.append(Row(rel, "not a recipe", "-", why.removeprefix(f"recipe file {file}: ")))
            continue
        row = Row(rel, result.outcome, result.name if result.recipe else "-", result.reason)
        target = target_dir / f"{result.name}.yaml"
        if result.recipe is not None:
            if result.name in names:
                row = Row(rel, "refused", "-", f"name {result.name}: also {names[result.name]}'s")
            elif target.exists() and not force:
                row = Row(rel, "exists", result.name, f"{target} exists: not overwritten "
                                                      "(--force)")
            elif not dry_run:
                _write(target, to_yaml(result))
            names.setdefault(result.name, rel)
        rows.append(row)
    _table(rows, f"recipes import {folder}" + (" (dry run: nothing written)" if dry_run
                                               else f" -> {target_dir}"))
    failed = [r for r in rows if r.outcome in ("refused", "exists")]
    if failed:
        raise click.ClickException(f"{len(failed)} file(s) not imported (see the table)")


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
