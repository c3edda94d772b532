"""Every reference to a page, a file or a numbered section resolves.

Scanned: every text file of the checkout (``git ls-files``, untracked files not ignored
included) — code, configs, docs, tests, the schema, the theory modules' formula strings that
the report's "Theory columns" table shows and the variable descriptions. Checked:

- markdown links ``[text](target)`` in ``*.md`` files: the target exists, relative to the
  citing file, and an ``#anchor`` into a markdown page names one of its headings (GitHub's
  slugs);
- a path ending in ``.md`` written out in plain text exists: in a markdown file relative to the
  file (inside a fenced code block, whose commands run from the repository root, relative to
  the root; inside an inline code span, which may name a file from either, relative to one of
  them), anywhere else relative to the repository root. A bare quoted name such as
  ``"models.md"`` is a path component built in code, not a citation, and is skipped;
- a section citation ``page.md §N`` (also ``§N–M``, ``§N and §M``, ``section N``) cites a
  section the page has: numbered sections are headings written ``## §N Title``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()

#: a path ending in .md, not part of a longer path or URL
_MD_PATH = r"(?<![\w./:-])((?:\.\.?/)*(?:[\w.-]+/)*[\w-][\w.-]*\.md)(?![\w-])"
PATH = re.compile(_MD_PATH)
#: a section citation after such a path: §3, §1–2, §0, §2, §2 and §7, section 3
CITATION = re.compile(_MD_PATH + r"(?:'s)?,?\s*((?:§|sections?\s+)\d+(?:\s*(?:–|-|,|and|or)\s*§?\d+)*)")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
SECTION_HEADING = re.compile(r"§(\d+)\b")
SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "results", ".snakemake", "build", "dist"}


def text_files(root: Path) -> list[Path]:
    """The checkout's files (git's list; a walk of the tree where git is not available)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout.decode()
        names = [root / name for name in out.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        names = [p for p in root.rglob("*") if not SKIPPED_DIRS & set(p.relative_to(root).parts)]
    return sorted(p for p in names if p.is_file())


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary or very large file."""
    data = path.read_bytes()
    if len(data) > 2_000_000 or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, only letters, digits, '_', '-' and spaces kept,
    spaces turned into '-'."""
    text = re.sub(r"`|\*\*|__", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return "".join(c for c in text if c.isalnum() or c in "_- ").replace(" ", "-")


def headings(page: str) -> list[str]:
    """The headings of a markdown page, fenced code blocks left out."""
    return [m.group(2) for m in HEADING.finditer(FENCE.sub("", page))]


def anchors(page: str) -> set[str]:
    out: set[str] = set()
    for h in headings(page):
        base, n = slug(h), 0
        while (name := base if n == 0 else f"{base}-{n}") in out:
            n += 1
        out.add(name)
    return out


def sections(page: str) -> set[int]:
    """The numbers of the page's sections, from headings ``## §N Title``."""
    return {int(m.group(1)) for h in headings(page) if (m := SECTION_HEADING.match(h.lstrip()))}


def cited_numbers(text: str) -> list[int]:
    """The section numbers of a citation's tail: '§1–2' → [1, 2], '§0, §2' → [0, 2]."""
    numbers: list[int] = []
    for m in re.finditer(r"(\d+)(?:\s*[–-]\s*§?(\d+))?", text):
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        numbers.extend(range(lo, hi + 1))
    return numbers


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _inside(pos: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in spans)


class _Pages:
    """The text of each file, read once."""

    def __init__(self) -> None:
        self._cache: dict[Path, str | None] = {}

    def __call__(self, path: Path) -> str | None:
        path = path.resolve()
        if path not in self._cache:
            self._cache[path] = read_text(path) if path.is_file() else None
        return self._cache[path]


def _check_links(path: Path, text: str, fenced: list[tuple[int, int]], pages: _Pages) -> list[tuple[int, str]]:
    """(position, problem) of every markdown link of ``text`` whose target or anchor is missing."""
    out = []
    for m in LINK.finditer(text):
        target = m.group(2)
        if _inside(m.start(), fenced) or re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            out.append((m.start(), f"link to {target}: no such file"))
        elif anchor and dest.suffix == ".md" and anchor not in anchors(pages(dest) or ""):
            out.append((m.start(), f"link to {target}: no heading with anchor #{anchor} in {dest.name}"))
    return out


def _check_file(root: Path, path: Path, text: str, pages: _Pages) -> list[tuple[int, str]]:
    """(position, problem) of every reference in one file that does not resolve."""
    markdown = path.suffix == ".md"
    fenced = [(m.start(), m.end()) for m in FENCE.finditer(text)] if markdown else []
    unfenced = FENCE.sub(lambda f: " " * len(f.group(0)), text)
    spans = [(m.start(), m.end()) for m in CODE_SPAN.finditer(unfenced)] if markdown else []

    def resolve(pos: int, name: str) -> Path:
        """Where ``name`` at ``pos`` points: the first candidate that exists, else the first."""
        if not markdown or _inside(pos, fenced):
            return root / name
        candidates = [path.parent / name] + ([root / name] if _inside(pos, spans) else [])
        return next((c for c in candidates if c.exists()), candidates[0])

    out = _check_links(path, text, fenced, pages) if markdown else []
    # link texts and targets are checked there; plain paths are what remains
    scan = LINK.sub(lambda m: " " * len(m.group(0)), text) if markdown else text
    for m in PATH.finditer(scan):
        before, after = scan[m.start() - 1:m.start()], scan[m.end():m.end() + 1]
        if not markdown and "/" not in m.group(1) and before and before in "\"'" and after == before:
            continue  # a quoted file name: a path component built in code
        dest = resolve(m.start(), m.group(1))
        if not dest.exists():
            out.append((m.start(), f"{m.group(1)}: no such file (looked for {os.path.relpath(dest, root)})"))
    for m in CITATION.finditer(text):
        target = pages(resolve(m.start(), m.group(1)))
        if target is None:
            continue  # a missing file, reported above
        have = sections(target)
        listed = (f"its sections: {', '.join(f'§{s}' for s in sorted(have))}" if have
                  else "it has no numbered sections '## §N Title'")
        out.extend((m.start(), f"{m.group(1)} {m.group(2)}: {m.group(1)} has no §{n} ({listed})")
                   for n in cited_numbers(m.group(2)) if n not in have)
    return out


def dangling(root: Path, files: list[Path]) -> list[str]:
    """Every reference in ``files`` that does not resolve, as 'file:line: what'."""
    root = root.resolve()
    pages = _Pages()
    problems: list[str] = []
    for path in (p.resolve() for p in files):
        text = pages(path)
        if text is None or path == SELF:
            continue
        problems += [f"{path.relative_to(root)}:{_line(text, pos)}: {what}"
                     for pos, what in sorted(_check_file(root, path, text, pages))]
    return problems


def test_every_reference_resolves():
    problems = dangling(ROOT, text_files(ROOT))
    assert not problems, "dangling references:\n" + "\n".join(problems)


def test_the_physics_page_numbers_its_sections_from_0():
    page = (ROOT / "docs" / "physics.md").read_text(encoding="utf-8")
    numbers = sorted(sections(page))
    assert numbers == list(range(len(numbers))) and len(numbers) >= 9, numbers


def test_a_dangling_reference_is_reported(tmp_path):
    """Each kind of reference, once resolving and once dangling: only the dangling ones are
    reported, each with its file and line."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "physics.md").write_text("# P\n\n## §0 Notation\n\n## §1 Quadratic loss\n\n"
                                                  "```bash\n# §7 a comment, not a section\n```\n")
    (tmp_path / "docs" / "other.md").write_text(
        "See [physics.md §1](physics.md#1-quadratic-loss), physics.md §0–1 and [it](physics.md).\n"
        "Dangling: physics.md §7, [gone](gone.md), [bad anchor](physics.md#2-linear), docs/physics.md.\n"
        "```bash\ncat docs/physics.md\n```\n")
    (tmp_path / "docs" / "code.md").write_text("`docs/physics.md §1` and `physics.md` name it; `docs/none.md`\n")
    (tmp_path / "README.md").write_text("[Physics](docs/physics.md), `docs/physics.md`; [x](docs/x.md); `physics.md`\n")
    (tmp_path / "code.py").write_text('"""docs/physics.md §0, §1 and §2; physics.md §1; docs/physics.md section 3."""\n'
                                      'PAGE = ROOT / "docs" / "other.md"  # docs/other.md §1\n')
    files = [tmp_path / "docs" / "physics.md", tmp_path / "docs" / "other.md", tmp_path / "docs" / "code.md",
             tmp_path / "README.md", tmp_path / "code.py"]
    problems = dangling(tmp_path, files)
    expected = [
        "docs/other.md:2: physics.md §7",
        "docs/other.md:2: link to gone.md",
        "docs/other.md:2: link to physics.md#2-linear",
        "docs/other.md:2: docs/physics.md: no such file",
        "docs/code.md:1: docs/none.md: no such file",
        "README.md:1: link to docs/x.md",
        "README.md:1: physics.md: no such file",
        "code.py:1: docs/physics.md §0, §1 and §2: docs/physics.md has no §2",
        "code.py:1: physics.md: no such file",
        "code.py:1: docs/physics.md section 3: docs/physics.md has no §3",
        "code.py:2: docs/other.md §1: docs/other.md has no §1",
    ]
    assert len(problems) == len(expected), "\n".join(problems)
    for want in expected:
        assert any(p.startswith(want) for p in problems), (want, problems)
