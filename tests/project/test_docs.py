"""The manual cannot drift from the CLI: every console block of README.md and docs/ that is
marked runnable (`<!-- runnable -->` on the line before it) runs as written, on tiny models, in
a folder of its own; every `kvphase` line of any console block names a command and options the
CLI has; every link to a file of the repository leads to one."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kvphase.cli import app
from tests.helpers.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RUNNABLE = "<!-- runnable -->"
BLOCK = re.compile(r"^(?P<marker><!-- runnable -->\n)?```console\n(?P<body>.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\((?!https?://|#)(?P<target>[^)#\s]+)")


def console_blocks(page: Path) -> list[tuple[bool, list[str]]]:
    """(marked runnable, its command lines) for every console block of the page."""
    return [(bool(m["marker"]), command_lines(m["body"])) for m in BLOCK.finditer(page.read_text())]


def command_lines(body: str) -> list[str]:
    """The commands of a console block: the `$ ` lines when it shows a prompt (the others are
    what the command printed), else every line; continued lines joined; comments dropped."""
    lines = body.replace("\\\n", " ").splitlines()
    prompted = [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in (prompted if prompted else lines) if shlex.split(line, comments=True)]


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def kvphase_lines() -> list[tuple[str, str]]:
    return [(page_id(page), line) for page in PAGES for _, lines in console_blocks(page) for line in lines
            if shlex.split(line, comments=True)[0] == "kvphase"]


def test_the_manual_holds_runnable_blocks_on_every_topic():
    runnable = {page_id(page) for page in PAGES if any(marked for marked, _ in console_blocks(page))}
    assert len(runnable) >= 10, f"runnable blocks only on {sorted(runnable)}"
    assert len(kvphase_lines()) >= 50


@pytest.mark.parametrize("page, line", kvphase_lines(), ids=lambda value: str(value)[:60])
def test_every_documented_command_and_option_exists(page, line):
    words = shlex.split(line, comments=True)
    group = typer.main.get_command(app)
    command = next((word for word in words[1:] if not word.startswith("-")), None)
    assert command in group.commands, f"{page}: `{line}` names no kvphase command"
    options = {name for param in group.commands[command].params for name in (*param.opts, *param.secondary_opts)}
    unknown = [word for word in words[2:] if re.match(r"--?[a-zA-Z]", word) and word.split("=")[0] not in options]
    assert not unknown, f"{page}: `{line}`: kvphase {command} has no option {', '.join(unknown)}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_to_files_of_the_repository_lead_to_one(page):
    missing = [m["target"] for m in LINK.finditer(page.read_text()) if not (page.parent / m["target"]).exists()]
    assert not missing, f"{page_id(page)} links to missing files: {missing}"


RUNNABLE_PAGES = [page for page in PAGES if any(marked for marked, _ in console_blocks(page))]


# A page's commands, run in order by one interpreter through the console script's own entry point
# (kvphase.cli.main, what `kvphase` runs), each with its argv as typed: the interpreter's start and the
# imports (numpy, scipy, matplotlib, llama.cpp, JAX: 1.5-3 CPU-s a command) are paid once a page, not
# once a command (issue 71). Stops at the first command that does not exit 0, naming it.
PAGE_RUNNER = """
import json, shlex, sys
import kvphase.cli
for line in json.loads(sys.argv[1]):
    sys.argv = ["kvphase", *shlex.split(line, comments=True)[1:]]
    try:
        kvphase.cli.main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    if code != 0:
        print(f"`{line}` exited {code}", file=sys.stderr)
        sys.exit(code)
"""


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=page_id)
def test_runnable_blocks_run_as_written(page, tmp_path):
    """A page's runnable blocks in order, in one empty folder (a later block may use what an
    earlier one wrote), each command as a user would type it, through the `kvphase` entry point."""
    lines = [line for marked, lines in console_blocks(page) if marked for line in lines]
    for line in lines:
        assert shlex.split(line, comments=True)[0] == "kvphase", \
            f"{page_id(page)}: a runnable block runs kvphase only: `{line}`"
    done = subprocess.run([sys.executable, "-c", PAGE_RUNNER, json.dumps(lines)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"{page_id(page)}: {done.stderr[-900:]}"


def test_the_manual_index_links_every_page():
    index = REPO / "docs" / "README.md"
    linked = {(index.parent / target).resolve() for target in re.findall(r"\]\(([^)#]+)", index.read_text())}
    pages = {page.resolve() for page in (REPO / "docs").rglob("*.md")} - {index.resolve()}
    assert not pages - linked, f"docs/README.md does not link {sorted(p.name for p in pages - linked)}"


ANCHORED_LINK = re.compile(r"\]\((?!https?://)(?P<target>[^)#\s]*)#(?P<anchor>[^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered (-1, -2, ...); headings inside code blocks are none."""
    anchors: set[str] = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_to_a_section_lead_to_a_heading(page):
    """A link to `page.md#section` (or `#section` on the page itself) names a heading there: a
    renamed heading, or a term the glossary does not define, fails here, not in a reader's hands."""
    broken = []
    for m in ANCHORED_LINK.finditer(page.read_text()):
        target = (page.parent / m["target"]) if m["target"] else page
        if target.suffix == ".md" and target.is_file() and m["anchor"] not in heading_anchors(target):
            broken.append(f"{m['target']}#{m['anchor']}")
    assert not broken, f"{page_id(page)} links to sections that do not exist: {broken}"


def test_the_readme_shows_make_demo_and_make_test_first():
    """The front page's first commands are the two a newcomer runs; what kvphase is comes before them."""
    readme = REPO / "README.md"
    marked, first = console_blocks(readme)[0]
    assert [shlex.split(line, comments=True) for line in first] == [["make", "demo"], ["make", "test"]]
    before = readme.read_text().split("```console", 1)[0]
    assert "kvphase" in before and len(before.split()) > 80, "README must say what kvphase is before its commands"


def test_the_commands_page_is_what_the_commands_print():
    """docs/commands.md is generated from every command's --help; an option added, renamed or
    given another default without regenerating it fails here."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "commands_doc.py"), "--check"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-600:]


def test_the_project_papers_agree_with_the_project():
    """LICENSE is the license pyproject declares, and CITATION.cff cites the version pyproject
    gives and the paper docs/protocol.md names."""
    import tomllib

    import yaml

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and (REPO / "LICENSE").read_text().startswith("MIT License")
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["version"] == project["version"] and citation["license"] == project["license"]
    arxiv = re.search(r"arXiv[: ](\d{4}\.\d{5})", (REPO / "docs" / "protocol.md").read_text())[1]
    (paper,) = citation["references"]
    assert paper["identifiers"][0]["value"] == f"arXiv:{arxiv}" and paper["url"].endswith(arxiv)
    assert paper["title"] in (REPO / "docs" / "protocol.md").read_text().replace("\n", " ")
