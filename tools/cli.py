"""`spark-vllm`: the operator's command line, one entry point for every tool of the project.

    spark-vllm init -s STACK HOST...    survey new hosts, write their stack file (tools/init_cli.py)
    spark-vllm recon -s STACK           survey the nodes, run preflight (tools/recon_report.py)
    spark-vllm promote --from A --to B  promote verified artifacts (tools/promote.py)
    spark-vllm rollback -s STACK        back to a verified deployment, then up (tools/rollback.py)
    spark-vllm status -s STACK          every model's state and figures, every node's memory
    spark-vllm logs -s STACK [MODEL]    every rank's vLLM log, merged in time order (-f follows)
    spark-vllm recipes list|show|import the typed recipes; import a community recipe file
    spark-vllm fabric test -s STACK     the collective bandwidth gate on demand (fabric_cli.py)
    spark-vllm reconcile -s STACK       repair drift in the classes the stack repairs safely,
                                        report the rest (tools/reconcile.py; --install a timer)

Every subcommand reads the stack file Pulumi.<stack>.yaml of the current folder (like the Pulumi
CLI) and reaches the nodes over SSH with the stack's pinned host keys; none of them changes a
node (init reads them too; it writes the stack file; fabric test runs its short-lived rank
containers, removed when done; rollback writes the stack file and runs `pulumi up`), but
`reconcile`, whose `up` repairs what drifted (only in the classes tools/drift.py lists). Built
on click
(https://click.palletsprojects.com) and rich (https://rich.readthedocs.io).
"""

from __future__ import annotations

import sys

import click

from tools import fabric_cli, init_cli, logs, recipes_cli, reconcile, rollback, status

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True,
                "help_option_names": []}


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="spark-vllm", prog_name="spark-vllm")
def main() -> None:
    """Deploy-side tools for a spark-vllm stack: init, recon, promote, rollback, status, logs,
    recipes, fabric, reconcile."""


@main.command(context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def recon(args: tuple[str, ...]) -> None:
    """Survey every node of a stack and run preflight (-s STACK; --help for the options)."""
    from tools import recon_report

    sys.exit(recon_report.main(list(args)))


@main.command(context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def promote(args: tuple[str, ...]) -> None:
    """Promote what one stack verified into another (--from dev --to staging; --help)."""
    from tools import promote as promote_tool

    sys.exit(promote_tool.main(list(args)))


main.add_command(init_cli.command)
main.add_command(rollback.command)
main.add_command(status.command)
main.add_command(logs.command)
main.add_command(recipes_cli.group)
main.add_command(fabric_cli.group)
main.add_command(reconcile.command)


def cli() -> None:
    """The console entry point (`spark-vllm`)."""
    try:
        main(prog_name="spark-vllm")
    except BrokenPipeError:  # piped into `head`
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    cli()
