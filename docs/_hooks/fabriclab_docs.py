"""MkDocs hooks that build the parts of the site which must not drift from the code.

Hand-written pages live in ``docs/``. Two kinds of page content are made at build time
instead, so that a change in the code shows in the next ``make docs`` without anyone
remembering to edit a page:

* the README (as the home page), the lessons (``scenarios/*/README.md``) and
  ``ARCHITECTURE.md`` are included as pages from where they live, their relative links
  rewritten for the page's place in the site (one copy of each text, in the repository
  where the tests and the lead read it);
* a page may hold a marker ``<!-- fabriclab:NAME -->`` that is replaced by a generated
  section: ``scenarios`` (a row per ``scenarios/*/scenario.yaml``), ``commands`` (every
  command and option, from ``lab.cli.build_parser``), ``result-keys`` (result.json's
  required keys, from ``lab.model.result``) and ``benchmarks`` (the JSON that ``bench/``
  wrote into ``bench/out/`` on the machine that builds the site);
* an unknown marker fails the build, as a broken link does under ``--strict``.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import platform
import posixpath
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

#: Repository files that become pages, and where they sit in the site. The README is the
#: site's home page too: one front page, not two that drift apart.
INCLUDED = {"README.md": "index.md", "ARCHITECTURE.md": "architecture.md"}
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
MARKER = re.compile(r"<!-- fabriclab:([a-z-]+) -->")


def on_config(config: Any) -> Any:
    """Document this checkout, whatever ``lab`` the interpreter would import first."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return config


def site_path(repo_path: str) -> str:
    """Where a repository file sits in the site (its ``src_uri``)."""
    if repo_path in INCLUDED:
        return INCLUDED[repo_path]
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    return repo_path


def included_pages() -> dict[str, str]:
    """repository path -> site path of every page taken from outside ``docs/``."""
    pages = {p: INCLUDED[p] for p in INCLUDED}
    for readme in sorted(REPO.glob("scenarios/*/README.md")):
        rel = readme.relative_to(REPO).as_posix()
        pages[rel] = site_path(rel)
    return pages


def rewrite_links(text: str, repo_path: str, extra: dict[str, str]) -> str:
    """``text``'s relative links, written for ``repo_path`` in the repository, made to
    work from the page's place in the site. Files they point at that are not pages
    (an exercise's skeleton, say) are collected in ``extra`` to be copied into the site.
    """
    page_dir = posixpath.dirname(site_path(repo_path))

    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
        if not (REPO / resolved).exists():
            return m.group(0)              # left as written: --strict reports it
        if not resolved.endswith(".md") and not resolved.startswith("docs/"):
            extra[resolved] = site_path(resolved)
        new = posixpath.relpath(site_path(resolved), page_dir or ".")
        return f"{m.group(1)}{new}{'#' + anchor if anchor else ''}{m.group(3)}"

    return LINK.sub(fix, text)


def on_files(files: Files, config: Any) -> Files:
    """Add the lessons and ARCHITECTURE.md as pages, and the files they link to."""
    extra: dict[str, str] = {}
    for repo_path, uri in included_pages().items():
        text = rewrite_links((REPO / repo_path).read_text(), repo_path, extra)
        files.append(File.generated(config, uri, content=text))
    for repo_path, uri in sorted(extra.items()):
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(REPO / repo_path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replace each ``<!-- fabriclab:NAME -->`` marker by its generated section."""
    def fill(m: re.Match[str]) -> str:
        make = GENERATORS.get(m.group(1))
        if make is None:
            raise PluginError(f"{page.file.src_uri}: unknown generated section "
                              f"{m.group(1)!r}; known: {', '.join(sorted(GENERATORS))}")
        return make()
    return MARKER.sub(fill, markdown)


# --- the scenarios, from their own files --------------------------------------------------

def scenarios() -> str:
    """A row per scenario folder: its kind, the first sentence of its description, and its
    lesson (a page of this site)."""
    import yaml
    rows = []
    for path in sorted(REPO.glob("scenarios/*/scenario.yaml")):
        spec = yaml.safe_load(path.read_text())
        words = " ".join((spec.get("description") or "").split())
        first = words.split(". ")[0].rstrip(".") + "." if words else ""
        name = path.parent.name
        rows.append(f"| [{name}](scenarios/{name}/README.md) | `{spec.get('kind')}` | "
                    f"{_cell(first)} |")
    return "| scenario | kind | what it runs |\n|---|---|---|\n" + "\n".join(rows) + "\n"


# --- the commands, from the parser the CLI itself uses -----------------------------------

def _cell(text: str | None) -> str:
    """``text`` as one Markdown table cell: no pipes, no newlines, and no ``<...>`` that the
    browser would take for a tag (help texts say ``results/<scenario>-<time>/``)."""
    return ((text or "").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|").replace("\n", " "))


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:           # argparse has no public walk of its actions
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        if action.option_strings and action.nargs != 0:
            name += f" `{action.metavar or action.dest.upper()}`"
        said = (action.help or "").lower()
        notes = []
        if action.choices:
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        if (action.default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0
                and "default" not in said):
            notes.append(f"default `{action.default}`")
        if isinstance(action, argparse._AppendAction) and "repeatable" not in said:
            notes.append("repeatable")
        if action.required and action.option_strings:
            notes.append("required")
        help_text = _cell(action.help) + ("" if not notes else
                                          (" (" if action.help else "") + "; ".join(notes)
                                          + (")" if action.help else ""))
        rows.append(f"| {name} | {help_text} |")
    return rows


def _subcommands(parser: argparse.ArgumentParser
                 ) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of every subcommand, nested ones after their parent."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name) or "", sub))
                out += [(f"{name} {n}", h, p) for n, h, p in _subcommands(sub)]
    return out


def commands() -> str:
    """A section per command: what it does, its usage line and its options."""
    from lab.cli import build_parser
    root = build_parser()
    parts = []
    for name, help_text, parser in _subcommands(root):
        parts.append(f"## fabriclab {name}\n\n{help_text[:1].upper() + help_text[1:]}.\n")
        usage = parser.format_usage().removeprefix("usage: ").strip()
        parts.append(f"```\n{usage}\n```\n")
        rows = _option_rows(parser)
        if rows:
            parts.append("| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


# --- result.json's required keys, from the module that checks them -----------------------

#: Where in result.json each tuple of required keys applies.
KEY_PLACES = {"TOP_KEYS": "top level", "ENV_KEYS": "`environment`", "LINK_KEYS": "`links[]`",
              "FLOW_KEYS": "`flows[]`", "EXPECTED_KEYS": "`fidelity.expected`",
              "EXPECTED_VERDICTS": "`fidelity.expected.verdict` (values)"}


def _documented_constants(source: str) -> dict[str, str]:
    """name -> the ``#:`` comment above it, for module-level assignments."""
    lines = source.splitlines()
    docs = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            comment, i = [], node.lineno - 2
            while i >= 0 and lines[i].lstrip().startswith("#:"):
                comment.insert(0, lines[i].lstrip()[2:].strip())
                i -= 1
            docs[node.targets[0].id] = " ".join(comment)
    return docs


def result_keys() -> str:
    """The schema version and every tuple of keys ``lab.model.result`` requires."""
    import lab.model.result as result
    comments = _documented_constants(Path(result.__file__).read_text())
    rows = []
    for name, value in vars(result).items():
        if not (name.isupper() and isinstance(value, tuple)
                and all(isinstance(v, str) for v in value)):
            continue
        where = KEY_PLACES.get(name, f"`{name}`")
        keys = ", ".join(f"`{v}`" for v in value)
        rows.append(f"| {where} | {keys} | {_cell(comments.get(name))} |")
    head = (f"Schema version: **{result.SCHEMA_VERSION}**. `lab.model.result.validate` holds "
            "every result the lab writes to these keys (generated from `lab/model/result.py`).")
    return (head + "\n\n| where | required keys | note |\n|---|---|---|\n" + "\n".join(rows)
            + "\n")


# --- benchmarks, from what bench/ wrote on this machine ----------------------------------

def _leaves(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every scalar in ``obj``; short lists of scalars as one value."""
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    if isinstance(obj, list):
        if all(not isinstance(v, (dict, list)) for v in obj) and len(obj) <= 8:
            return [(prefix.rstrip("."), ", ".join(str(v) for v in obj))]
        return [leaf for i, v in enumerate(obj[:8])
                for leaf in _leaves(v, f"{prefix}{i}.")]
    return [(prefix.rstrip("."), obj)]


def _value(v: Any) -> str:
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(_value(x) for x in v[:8]) + (" ..." if len(v) > 8 else "")
    if isinstance(v, (dict, list)):
        return f"({len(v)} values)"
    return str(v)


def _records_table(rows: list[dict[str, Any]]) -> str:
    """A list of records (a row per policy, size, run ...) as a table, a column per key."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    head = "| " + " | ".join(f"`{_cell(c)}`" for c in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(_cell(_value(row.get(c, ""))) for c in columns) + " |"
            for row in rows]
    return "\n".join([head, rule, *body]) + "\n"


def _bench_tables(data: Any) -> str:
    """One bench JSON as Markdown: each list of records its own table, every other value in
    a table of dotted keys."""
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return _records_table(data)
    parts, rest = [], {}
    for key, value in (data.items() if isinstance(data, dict) else [("value", data)]):
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            parts.append(f"`{_cell(str(key))}`:\n\n" + _records_table(value))
        else:
            rest[key] = value
    leaves = _leaves(rest)
    if leaves:
        rows = [f"| `{_cell(k)}` | {_cell(_value(v))} |" for k, v in leaves[:60]]
        more = f"\n({len(leaves) - 60} more values in the file)\n" if len(leaves) > 60 else ""
        parts.append("| value | measured |\n|---|---|\n" + "\n".join(rows) + "\n" + more)
    return "\n".join(parts)


def machine() -> str:
    """One line naming the machine this build (and so ``bench/out/``) is on."""
    return (f"{platform.node()}: {os.cpu_count()} cores, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


def benchmarks(out_dir: Path | None = None) -> str:
    """Tables per ``bench/out/*.json``, dated by the file and marked with the machine."""
    out_dir = out_dir or REPO / "bench" / "out"
    found = sorted(out_dir.glob("*.json")) if out_dir.is_dir() else []
    if not found:
        return ("No benchmark output on the machine that built this site (`bench/out/` is "
                "empty or missing; it is not committed). `sudo make bench` writes it; the "
                "next `make docs` shows it here.\n")
    parts = [f"Machine: {machine()} (`bench/out/` is not committed: every table below was "
             "written on the machine that built this site).\n"]
    for path in found:
        when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
        try:
            tables = _bench_tables(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            parts.append(f"### {path.name}\n\nUnreadable: {e}\n")
            continue
        parts.append(f"### {path.name}\n\nWritten {when:%Y-%m-%d %H:%M} UTC on "
                     f"{platform.node()}.\n\n{tables}")
    return "\n".join(parts)


GENERATORS: dict[str, Callable[[], str]] = {
    "scenarios": scenarios, "commands": commands, "result-keys": result_keys,
    "benchmarks": benchmarks}
