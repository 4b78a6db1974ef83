"""``macula-mcp guard``: install or uninstall the commit guard's ``pre-commit`` hook in a
repository, or run the check the hook runs (``python -m tools.guard.command check``).

Exit status: 0 done (or the commit may go), 1 the commit is refused, 2 bad usage or a hook
that cannot be installed or removed here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.guard.check import check
from tools.guard.hook import GuardError, install, uninstall
from tools.guard.project import GitError, repo_root


def parser() -> argparse.ArgumentParser:
    from tools.commands import parser_for

    top = parser_for("guard")
    sub = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, say in (
        ("install", "install the pre-commit hook (an existing hook is kept and chained)"),
        ("uninstall", "remove it, putting back the hook that was there byte for byte"),
        ("check", "what the hook runs: refuse a commit on paths another agent holds"),
    ):
        action = sub.add_parser(name, help=say, description=say[0].upper() + say[1:] + ".")
        action.add_argument("--repo", type=Path, default=Path.cwd(), help="default: here")
        if name != "uninstall":
            action.add_argument(
                "--fail-closed",
                action="store_true",
                help="refuse the commit when the station cannot be asked (default: warn, pass)",
            )
            action.add_argument("--project", help="project name (default: the origin URL)")
        if name == "check":
            action.add_argument("--realm", help="the realm the project was reserved in")
    return top


def main(argv: Sequence[str]) -> None:
    args = parser().parse_args(list(argv))
    try:
        root = repo_root(args.repo)
    except GitError as exc:
        print(f"macula-mcp guard: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.action == "check":
        verdict = asyncio.run(
            check(
                root,
                os.environ,
                fail_closed=int(args.fail_closed),
                project=args.project,
                realm=args.realm,
            )
        )
        if verdict.message:
            print(verdict.message, file=sys.stderr)
        raise SystemExit(verdict.code)
    try:
        if args.action == "install":
            done = install(root, fail_closed=int(args.fail_closed), project=args.project)
            chained = f"; it runs the hook that was there after ({done.chained})" * bool(
                done.chained
            )
            print(f"installed {done.hook}{chained}. Override for one commit: --no-verify")
        else:
            done = uninstall(root)
            put_back = f"; {done.hook} is the hook that was there before" * bool(done.chained)
            print(f"removed the macula guard hook{put_back}")
    except (GuardError, OSError) as exc:
        print(f"macula-mcp guard: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(sys.argv[1:])
