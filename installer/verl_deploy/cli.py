"""verl-deploy commands: parse, call one function, render. Heavy imports stay inside commands."""

import typer

from verl_deploy import __version__

app = typer.Typer(
    help="Run single-controller RL post-training (PPO, GRPO, ...) on a CPU, a GPU box or Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


def main() -> None:
    app()
