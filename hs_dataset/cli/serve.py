"""``hs-dataset serve``: start an SGLang server with the capture hooks, or ``--check`` what would run."""

from __future__ import annotations

import argparse
import sys

from hs_dataset.cli.card_args import add_card_arguments, card_from_args
from hs_dataset.cli.numbers import port_number
from hs_dataset.cli.signals import sigterm_as_interrupt

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "start a SGLang server with everything capture needs"
EXAMPLES = """
  hs-dataset serve --config kimi-k25-sglang --model-path /models/Kimi-K2.5
  hs-dataset serve --config tiny-deepseek-sglang --check        # print the plan, start nothing
  hs-dataset serve --config kimi-k25-sglang --port 31000 -- --log-level warning
  hs-dataset serve --model /models/Kimi-K2.5 --trust-remote-code --check   # no card: derived from the model
"""

EXIT_INTERRUPTED = 130  # the server was stopped by Ctrl-C / SIGTERM, as shells report it


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_card_arguments(parser, backend=False)
    parser.add_argument("--port", type=port_number, default=None, help="listen port (default: the card's sglang.port or 30000)")
    parser.add_argument("--host", default=None, help="listen address (default: the card's sglang.host or 127.0.0.1)")
    parser.add_argument("--model-path", default=None, help="local model snapshot (overrides the card's model.path)")
    parser.add_argument("--staging-dir", default=None, help="private directory for the per-request dumps")
    parser.add_argument("--python", default=None, help="Python of the server environment (default: .sglang-venv)")
    parser.add_argument("--log", default=None, help="write the server's output to this file instead of the terminal")
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="a server for `build --regenerate`: prefix cache on, so generated turns are captured in one pass (card regenerate.enabled)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="print what would run (version, flags, hooks) and exit; a multimodal wrapper's processor is loaded and checked first",
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: extra arguments passed to SGLang")


def _extra_args(args: argparse.Namespace) -> list[str]:
    extra = list(args.extra or [])
    return extra[1:] if extra and extra[0] == "--" else extra


def run(args: argparse.Namespace) -> int:
    from hs_dataset.capture.serve import launch, plan_server
    from hs_dataset.capture.serve.probe import check_processor_in_server
    from hs_dataset.formats.paths import check_local_path

    for value, what in ((args.log, "--log"), (args.staging_dir, "--staging-dir")):
        if value:  # before the server starts: a URL would become a local directory named 's3:'
            check_local_path(value, what=what)
    card = card_from_args(args, default_backend="sglang")
    if args.regenerate:
        card = card.with_overrides(regenerate={"enabled": True})
    plan = plan_server(
        card,
        port=args.port,
        host=args.host,
        staging_dir=args.staging_dir,
        model_path=args.model_path,
        python=args.python,
        extra_args=_extra_args(args),
    )
    check_processor_in_server(plan.python, plan.env, plan.model_path, card.model.trust_remote_code)
    if args.check:
        print(plan.describe())
        return 0
    print(plan.describe(), file=sys.stderr)
    server = launch(plan, log_path=args.log)
    print(f"SGLang capture server ready at {server.url} after {server.started_in_s:.0f} s (staging {plan.staging_dir})", flush=True)
    try:
        with sigterm_as_interrupt():
            return int(server.proc.wait() or 0)
    except KeyboardInterrupt:  # not an error: how a foreground server is meant to stop
        print("hs-dataset serve: stopping the server", file=sys.stderr, flush=True)
        server.stop()
        return EXIT_INTERRUPTED
