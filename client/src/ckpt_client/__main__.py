"""`python -m ckpt_client flush`: send the spooled calls now.

Exit status: 0 when every spooled call landed (or none was waiting), 1 when the service
refused some (each kept in the spool's `failed/` with the refusal, and named on stderr),
3 when the service could not be reached (what is left stays spooled, in order). Configured
like the client: CKPT_URL, CKPT_TOKEN, CKPT_SPOOL_DIR, or the options below (the token
only from the environment, where a process listing does not show it).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ckpt_client.client import DEFAULT_DEADLINE, Client

OK, REFUSED, UNREACHABLE = 0, 1, 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ckpt_client", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    flush = commands.add_parser("flush", help="send the spooled calls to the catalog now")
    flush.add_argument("--url", help="the catalog (default: CKPT_URL, else http://127.0.0.1:8000)")
    flush.add_argument("--spool-dir", help="default: CKPT_SPOOL_DIR, else ~/.cache/ckpt/spool")
    flush.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE,
        help=f"seconds to keep trying each call (default {DEFAULT_DEADLINE:g})",
    )
    return parser


def flush(url: str | None, spool_dir: str | None, deadline: float) -> int:
    with Client(url, spool_dir=spool_dir, deadline=deadline) as client:
        waiting = len(client.spool.pending())
        if not waiting:
            print(f"nothing spooled for {client.url} in {client.spool.directory}")
            return OK
        report = client.flush()
        left = len(client.spool.pending())
        print(f"{report.landed} of {waiting} spooled calls landed at {client.url}")
        for kept, error in report.refused:
            print(f"refused, kept in {kept}: {error}", file=sys.stderr)
        if report.unreachable is not None or report.blocked:
            why = report.unreachable or "another process holds the spool"
            print(f"{left} calls still spooled: {why}", file=sys.stderr)
            return UNREACHABLE
        return REFUSED if report.refused else OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "flush":
        return flush(args.url, args.spool_dir, args.deadline)
    return 2  # pragma: no cover - argparse refuses any other command


if __name__ == "__main__":
    sys.exit(main())
