"""Nothing cites what a reader cannot find, and every cross-reference resolves.

Scanned: README.md, the Makefile, mkdocs.yml and the text files (.py .md .yaml .yml .txt .toml .cfg) under gatt/,
data_gen/, recipes/, benchmarks/, tests/ and docs/ (not docs/results, a link to the committed results/). Data files
(.json, .jsonl, .csv) are measurements and model output, not prose, and are not scanned.

No citation a reader cannot follow (`test_no_untraceable_citation`):
- no issue cited: "issue N", "issues #N", "PR N", "#N" (two digits or more, where a hex colour could not be meant),
  nor one cited as "the" followed by "issue" or its possessive (an issue the reader cannot open);
- no "working" "checkout" (as one phrase: a checkout only its writer had);
- no dated changelog line: no ISO date (year-month-day) and no month-name date; a result says what was measured,
  not when, and a page says what holds, not since when (DATES_ALLOWED lists the exceptions, each with its reason);
- no note of the machine a result ran on as one on loan ("a GPU" that was lent, borrowed or loaned), nor of the
  sitting it ran in ("session N").

Cross-references (`test_cross_references_resolve`), the grammar:
- A README citation: `README, "<heading>"` (also `README: "<heading>"`, `README ("<heading>")`, README.md for
  README): the heading must be one of README.md's. An opening parenthesis, README and a comma or colon followed by
  anything but a quoted heading is a citation that cannot be checked, and fails: cite a docs page instead. (Another
  folder's README, `results/<run>/README.md`, is a file, checked below.)
- A section citation: `docs/<page>.md, "<heading>"` (also with a colon, or the heading in parentheses): the page
  must exist and the quoted heading must be one of its headings. Unquoted words after a page are prose: only the
  page is checked, so a section is cited by its heading in quotes. A quoted placeholder, `"<...>"`, cites nothing.
- A heading matches when it equals the quoted text (case, inline-code backticks, emphasis stars and runs of
  spaces aside) or its title proper does: the heading up to its first ": " or " (" (`"The GPU check"` names
  "The GPU check: `make gpu-check`").
- A path: every docs page path mentioned anywhere, and every path under gatt/, data_gen/, recipes/, benchmarks/,
  tests/ or results/ with a file extension, names an existing file; a path with a wildcard or a placeholder in it
  (`<run>`, `{name}`, `$DIR`, or an upper-case segment such as NAME or bench_X) is a pattern, not a path, and
  WRITTEN_NOT_SHIPPED names the outputs a command writes that no committed run has written.
- A markdown link in README.md and docs/ (`[text](target)`, images too; not in code): a relative target must exist
  (relative to the page); an anchor, `(page.md#anchor)` or `(#anchor)`, must be the slug of a heading of the target
  page. Slugs as MkDocs writes them (Python-Markdown's toc: lowercase, punctuation but `-` and `_` dropped, runs of
  spaces and dashes one `-`; `_1`, `_2` for repeats) or as GitHub writes them (each space a `-`, no runs merged;
  `-1`, `-2` for repeats): README.md is read on GitHub, docs/ on the site.

A failure names each offending FILE:LINE and what it cites.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gatt", "data_gen", "recipes", "benchmarks", "tests", "docs")
FILES = ("README.md", "Makefile", "mkdocs.yml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg"}

# Dates that are data, not changelog lines: {(file, date): reason}. Empty: none is needed.
DATES_ALLOWED: dict[tuple[str, str], str] = {}
# Paths a command writes that no committed run has written yet: {path: reason}.
WRITTEN_NOT_SHIPPED = {
    "results/benchmarks_gpu.json": "benchmarks/gpu_check.py writes it from a GPU run; none is committed",
}

MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
MACHINES = r"(?:GPUs?|H100s?|H200s?|A100s?|machines?|VMs?|nodes?)"
FORBIDDEN = {
    "issue cited": re.compile(
        r"\b(?:issues?|PRs?|pull\s+requests?)\s+#?\d+\b|(?<![\w&#/])#\d{2,}(?![\w-])|\bthe\s+issue(?:'s)?\b",
        re.IGNORECASE,
    ),
    "a checkout of one's own": re.compile(r"\bworking\s+checkout\b", re.IGNORECASE),
    "date": re.compile(
        rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b{MONTHS}\s+[0-3]?\d(?:st|nd|rd|th)?,?\s+(?:19|20)\d\d\b"
        rf"|\b[0-3]?\d(?:st|nd|rd|th)?\s+{MONTHS}\s+(?:19|20)\d\d\b|\b{MONTHS}\s+(?:19|20)\d\d\b"
    ),
    "a machine on loan, a sitting": re.compile(
        rf"\b(?:lent|borrowed|loaned)\s+(?:\w+\s+)?{MACHINES}\b|\b{MACHINES}\s+(?:(?:is|was|were)\s+)?"
        rf"(?:lent|borrowed|loaned)\b|\b(?:session|sitting)\s+\d+\b",
        re.IGNORECASE,
    ),
}
DATE_TEXT = re.compile(r"(?:19|20)\d\d-[01]\d-[0-3]\d")


def scanned() -> list[Path]:
    paths = [ROOT / name for name in FILES]
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] == ("docs", "results") or "__pycache__" in relative.parts:
                continue
            if path.is_file() and path.suffix in SUFFIXES:
                paths.append(path)
    return paths


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def where(path: Path, number: int) -> str:
    return f"{path.relative_to(ROOT)}:{number}"


def test_no_untraceable_citation() -> None:
    found = []
    for path in scanned():
        relative = str(path.relative_to(ROOT))
        for number, line in enumerate(lines_of(path), 1):
            for kind, pattern in FORBIDDEN.items():
                for match in pattern.finditer(line):
                    if kind == "date" and (relative, match.group()) in DATES_ALLOWED:
                        continue
                    found.append(f"{where(path, number)}: {kind}: {match.group()!r} in {line.strip()[:160]!r}")
    assert not found, f"{len(found)} citations a reader cannot follow:\n" + "\n".join(found)


# --- headings and slugs ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CUSTOM_ID = re.compile(r"\s*\{[^}]*#([\w-]+)[^}]*\}\s*$")
INLINE_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """A markdown page's lines outside fenced code, numbered from 1."""
    fenced = None
    for number, line in enumerate(lines_of(path), 1):
        fence = FENCE.match(line)
        if fence:
            fenced = None if fenced == fence.group(1) else fenced or fence.group(1)
            continue
        if fenced is None:
            yield number, line


def heading_text(raw: str) -> str:
    """A heading as it renders: links as their text, no backticks or emphasis stars."""
    return INLINE_LINK.sub(r"\1", raw).replace("`", "").replace("*", "")


def normal(text: str) -> str:
    return " ".join(heading_text(text).split()).casefold()


@cache
def headings(page: Path) -> tuple[tuple[str, ...], frozenset[str]]:
    """A markdown page's headings (as they render) and every anchor a link may use for them."""
    texts, anchors, mkdocs_seen, github_seen = [], set(), {}, {}
    for _, line in prose_lines(page):
        match = HEADING.match(line)
        if not match:
            continue
        raw = match.group(2)
        custom = CUSTOM_ID.search(raw)
        if custom:
            anchors.add(custom.group(1))
            raw = raw[: custom.start()]
        text = heading_text(raw).strip()
        texts.append(text)
        mkdocs = slugify(text, "-")
        github = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        for slug, seen, join in ((mkdocs, mkdocs_seen, "_"), (github, github_seen, "-")):
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}{join}{count}")
    return tuple(texts), frozenset(anchors)


def has_heading(page: Path, cited: str) -> bool:
    wanted = normal(cited)
    for text in headings(page)[0]:
        title = re.split(r": | \(", text, maxsplit=1)[0]
        if wanted in (normal(text), normal(title)):
            return True
    return False


# --- the references ----------------------------------------------------------------------------------------------

QUOTED = r"\"(?!<)([^\"\n]+)\""
README_CITE = re.compile(rf"(?<![\w/.-])README(?:\.md)?(?:\s*[,:]\s*|\s+\(){QUOTED}")
README_LOOSE = re.compile(r"(?:\(|[,;]\s)\s*README(?:\.md)?\s*[,:](?!\s*\")\s*([^)]{0,60})")
PAGE_CITE = re.compile(rf"(?<![\w/.-])(docs/[\w/.-]+?\.md)(?:\s*[,:]\s*|\s+\(){QUOTED}")
DOCS_PATH = re.compile(r"(?<![\w/.-])(docs/[\w/.-]+?\.md)\b")
TOP = "|".join(("gatt", "data_gen", "recipes", "benchmarks", "tests", "docs", "results"))
REPO_PATH = re.compile(rf"(?<![\w/.$~-])((?:{TOP})/[\w/.-]*\w\.[A-Za-z]\w*)(?![\w*{{<$/-])")
MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`[^`]*`")
PLACEHOLDER = re.compile(r"(?:^|[/_.-])[A-Z]+(?=[/_.-]|$)")  # NAME, bench_X, results/RUN/...


def joined(path: Path) -> Iterator[tuple[int, str, int]]:
    """Each line with the next one appended (comment marks and indentation dropped), so that a citation wrapped
    over two lines is read whole; a match is counted on the line where it starts."""
    lines = lines_of(path)
    for index, line in enumerate(lines):
        following = lines[index + 1].strip().lstrip("#").strip() if index + 1 < len(lines) else ""
        yield index + 1, f"{line} {following}", len(line)


def test_cross_references_resolve() -> None:
    readme = ROOT / "README.md"
    bad = []
    for path in scanned():
        for number, text, length in joined(path):

            def found(pattern: re.Pattern[str], text: str = text, length: int = length) -> Iterator[re.Match[str]]:
                return (match for match in pattern.finditer(text) if match.start() < length)

            for match in found(README_CITE):
                if not has_heading(readme, match.group(1)):
                    bad.append(f"{where(path, number)}: README has no heading {match.group(1)!r}")
            for match in found(README_LOOSE):
                bad.append(f"{where(path, number)}: README cited without a quoted heading: {match.group().strip()!r}")
            for match in found(PAGE_CITE):
                page = ROOT / match.group(1)
                if page.is_file() and not has_heading(page, match.group(2)):
                    bad.append(f"{where(path, number)}: {match.group(1)} has no heading {match.group(2)!r}")
            for match in found(DOCS_PATH):
                if not (ROOT / match.group(1)).is_file():
                    bad.append(f"{where(path, number)}: no page {match.group(1)}")
            for match in found(REPO_PATH):
                name = match.group(1)
                if name in WRITTEN_NOT_SHIPPED:
                    continue
                if not (name.startswith("docs/") or (ROOT / name).exists() or PLACEHOLDER.search(name)):
                    bad.append(f"{where(path, number)}: no file {name}")
    assert not bad, f"{len(bad)} references that do not resolve:\n" + "\n".join(bad)


def markdown_pages() -> list[Path]:
    return [page for page in scanned() if page.suffix == ".md" and page.parts[len(ROOT.parts)] in ("README.md", "docs")]


def test_markdown_links_resolve() -> None:
    bad = []
    for page in markdown_pages():
        for number, line in prose_lines(page):
            for match in MD_LINK.finditer(CODE_SPAN.sub("", line)):
                target = match.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                    continue  # a URL: http(s), mailto
                file, _, anchor = target.partition("#")
                linked = (page.parent / file).resolve() if file else page
                if not linked.exists():
                    bad.append(f"{where(page, number)}: no file {target!r}")
                elif anchor and linked.suffix == ".md" and anchor not in headings(linked)[1]:
                    bad.append(f"{where(page, number)}: {target!r}: no heading of {linked.name} has the anchor")
    assert not bad, f"{len(bad)} links that do not resolve:\n" + "\n".join(bad)


def test_the_grammar_reads_what_it_means() -> None:
    """The patterns on made-up lines: what counts as a citation and what does not."""
    issue, date = FORBIDDEN["issue cited"], FORBIDDEN["date"]
    assert issue.search("the second audit (issue " + "44)") and issue.search("fixed in #" + "123")
    assert (
        not issue.search("color: #ffaa00")
        and not issue.search("<<Chronicle>> #SmartLife")
        and not issue.search("&#" + "8212;")
    )
    assert date.search("ran on " + "2026-11" + "-27") and date.search("measured 27 November " + "2026")
    assert not date.search("version 2.5.1, 300 steps")
    machine = FORBIDDEN["a machine on loan, a sitting"]
    assert machine.search("on the H200 " + "lent for it") and machine.search("a lent " + "GPU")
    assert machine.search("in session " + "2") and not machine.search("the GPU rows were not measured")
    assert not machine.search('@pytest.fixture(scope="session")')
    assert README_CITE.search('(README, "The result")') and README_LOOSE.search("(README" + ": the gate audit)")
    assert not README_LOOSE.search("results/x/" + "README.md, the command") and not README_LOOSE.search("README's")
    assert not README_LOOSE.search("the commands of README.md, docs/ and the Makefile")
    assert README_LOOSE.search("(gatt/model/numerics.py, README" + ": measured)")
    assert issue.search("sized as in the " + "issue's table") and not issue.search("an issuer, tissue 12")
    assert PAGE_CITE.search('(docs/data.md, "Formats")').groups() == ("docs/data.md", "Formats")
    assert not PAGE_CITE.search("(docs/data.md, the formats)")
    assert has_heading(ROOT / "docs" / "data.md", "formats") and not has_heading(ROOT / "docs" / "data.md", "Form")
    assert REPO_PATH.search("see results/demo/seeds.md.").group(1) == "results/demo/seeds.md"
    assert not REPO_PATH.search("results/<run>/report.md") and not REPO_PATH.search("recipes/configs/*.yaml")
    assert PLACEHOLDER.search("benchmarks/bench_X.py") and not PLACEHOLDER.search("results/demo/seeds.md")
