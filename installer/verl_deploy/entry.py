"""The `verl-deploy` command. Ctrl-C while the CLI is still starting (importing typer, the docker SDK, ...) ends
with one line and exit code 130 instead of a KeyboardInterrupt traceback."""

import sys


def main() -> None:
    try:
        from verl_deploy.cli import app

        app()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
