"""What the commands share: the version, byte-size options, the command parser class, and
help text without reST markup."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # kvsim/
REPO_ROOT = PACKAGE_ROOT.parent  # the checkout (or site-packages, once installed)


def package_version() -> str:
    """The installed distribution's version; in a checkout that is not installed, the version
    in ``pyproject.toml``; else ``unknown``."""
    from importlib import metadata

    try:
        return metadata.version("kvsim")
    except metadata.PackageNotFoundError:
        pass
    try:
        text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    try:
        import tomllib  # Python 3.11+

        return str(tomllib.loads(text)["project"]["version"])
    except ImportError:
        m = re.search(r'(?ms)^\[project\].*?^version\s*=\s*"([^"]+)"', text)
        return m.group(1) if m else "unknown"
    except (KeyError, ValueError):
        return "unknown"


def byte_size(minimum: int = 1):
    """An argparse ``type``: bytes from ``4096``, ``"16 KiB"``, ``"1.5 MiB"`` or ``"2 GB"``, the
    units scenario files accept (:func:`kvsim.validation.parse_size`), at least ``minimum``."""
    def parse(text: str) -> int:
        from kvsim.validation import parse_size

        try:
            value = parse_size(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} bytes, got {text!r}")
        return value

    parse.__name__ = "byte size"
    return parse


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: arguments it does not know are its error, with its own usage
    (argparse would hand them back to ``kvsim``, whose error shows the top-level usage)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return namespace, extra


_ROLE = re.compile(r":[\w:.-]+:`([^`]*)`")  # :mod:`x`, :func:`~a.b`, :py:class:`x`
_LITERAL = re.compile(r"``(.*?)``", re.S)
_DEFAULT_ROLE = re.compile(r"(?<![\w`])`([^`\s][^`]*)`(?![\w`])")


def _role_text(target: str) -> str:
    """What Sphinx shows for a role: ``~a.b`` -> b, ``title <target>`` -> title."""
    m = re.fullmatch(r"(.*?)\s*<[^>]*>", target, re.S)
    if m and m.group(1):
        return m.group(1)
    return target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target


def plain(text: str | None) -> str | None:
    """Help text without reST markup: ``x`` -> x, :role:`x` -> x, `x` -> x."""
    if not text:
        return text
    text = _ROLE.sub(lambda m: _role_text(m.group(1)), text)
    text = _LITERAL.sub(lambda m: m.group(1), text)
    return _DEFAULT_ROLE.sub(lambda m: m.group(1), text)


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(command path, parser)`` for ``parser`` and every subcommand's parser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def polish(parser: argparse.ArgumentParser) -> None:
    """Strip markup from every description, epilog and help text below ``parser``; a
    subcommand without a description gets its one-line help as one."""
    summaries: dict[tuple[str, ...], str] = {}
    for path, p in walk(parser):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    choice.help = plain(choice.help)
                    summaries[(*path, choice.dest)] = choice.help or ""
    for path, p in walk(parser):
        p.description = plain(p.description) or summaries.get(path) or None
        p.epilog = plain(p.epilog)
        for action in p._actions:
            if action.help is argparse.SUPPRESS:
                continue
            action.help = plain(action.help)
