"""mkdocs hooks for the documentation site (``mkdocs.yml``, ``hooks:``), run by ``mkdocs build --strict``.

The Markdown files are written to be read on GitHub as well as in the site, so their links point at files of the
repository. Three things make the site from them without a second copy of any text:

- the home pages are README.md and README.ko.md themselves (``index.md``, ``ko/index.md``);
- a link that leaves docs/ is rewritten: to a module of src/attnkit, to its section of the API reference; to any
  other file of the repository (a recipe in configs/, benchmarks/README.md, CHANGELOG.md), to a copy of that file
  in the site under ``_repo/`` (a Markdown file there is a page, its own links rewritten the same way);
- the API reference is generated: one page per layer of the package, a section per module, from the docstrings
  (mkdocstrings). Every module under src/attnkit has one, except the command line (``attnkit.cli``), whose
  reference is docs/reference/cli.md, generated from the argument parser.

Strict mode then checks every link and anchor that results, so a broken one fails the build.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "src" / "attnkit"
HOMES = {"index.md": ROOT / "README.md", "ko/index.md": ROOT / "README.ko.md"}
ALWAYS_COPIED = ("CHANGELOG.md",)  # in the nav, though no page links to it
REPO = "_repo"

LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)

# The API reference: one page per layer (tests/test_layering.py) or package; the small top-level modules share one.
API_GROUPS = {
    "core": "The package, its configs and the layer-0 modules everything may use",
    "model": "The paper's model (§3)",
    "tokenization": "Tokenizers",
    "data": "Reading and batching data",
    "inference": "The inference engine: fused and int8 modules swapped in, decoding programs",
    "decoding": "Greedy and beam search (§6.1)",
    "evaluation": "Metrics",
    "training": "The training loop and its parts (§5)",
    "runs": "The run directory",
    "tasks": "The tasks: classify, translate, pretrain, embed",
    "analysis": "Parameter accounting, attention, plots, ablations",
    "interop": "Weights in and out",
    "serving": "attnkit serve",
    "bench": "The benchmark suites (attnkit bench)",
}


def public_modules() -> list[str]:
    """Every module of the package that gets an API section: all but the command line and ``__main__``."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["attnkit", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] == "__main__" or parts[1:2] == ["cli"]:
            continue
        modules.append(".".join(parts))
    return modules


def api_group(module: str) -> str:
    parts = module.split(".")
    is_package = (PACKAGE.joinpath(*parts[1:]) / "__init__.py").is_file()
    if len(parts) == 1 or (len(parts) == 2 and not is_package) or parts[1] == "config":
        return "core"  # attnkit itself, its top-level modules (errors, atomic, ...) and the configs (attnkit.config.*)
    return parts[1]


def api_page(group: str) -> str:
    return f"reference/api/{group}.md"


def api_pages() -> dict[str, str]:
    """src_uri -> Markdown of each generated API page, the index included."""
    by_group: dict[str, list[str]] = {group: [] for group in API_GROUPS}
    for module in public_modules():
        by_group[api_group(module)].append(module)  # a new layer without a title is a KeyError: add it above
    pages = {}
    index = [
        "# Python API reference",
        "",
        "Generated from the docstrings of every module of the package (the command line is in the",
        "[command line reference](../cli.md)). The names most programs need are importable from `attnkit` itself",
        "(`attnkit.ClassifierRun`, `attnkit.train_classifier`, ...: the first section of",
        "[the package](core.md)); the layers below import only downward (`tests/test_layering.py`).",
        "",
    ]
    for group, title in API_GROUPS.items():
        modules = by_group[group]
        index.append(f"- [{title}]({group}.md): " + ", ".join(f"`{m}`" for m in modules))
        blocks = [f"# {title}", ""]
        for module in modules:
            blocks.append(f"::: {module}")
            if module == "attnkit":  # its names are documented where they are defined
                blocks.append("    options:\n      members: false")
            blocks.append("")
        pages[api_page(group)] = "\n".join(blocks)
    pages["reference/api/index.md"] = "\n".join(index) + "\n"
    return pages


def real_path(src_uri: str) -> Path:
    """Where a page's Markdown lives in the repository: its links are relative to that."""
    if src_uri in HOMES:
        return HOMES[src_uri]
    if src_uri.startswith(REPO + "/"):
        return ROOT / src_uri[len(REPO) + 1 :]
    return DOCS / src_uri


def link_targets(markdown: str, where: Path) -> list[tuple[str, Path | None]]:
    """(link as written, the repository path it names, or None for a URL or an anchor in the same page)."""
    out = []
    for _, target, _ in LINK.findall(FENCE.sub("", markdown)):
        path = target.split("#")[0]
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or not path:
            out.append((target, None))
        else:
            out.append((target, (where.parent / path).resolve()))
    return out


def site_uri(path: Path) -> str:
    """The site's file for a repository path."""
    if path.is_relative_to(DOCS):
        return path.relative_to(DOCS).as_posix()
    for uri, home in HOMES.items():
        if path == home:
            return uri
    if path.suffix == ".py" and path.is_relative_to(PACKAGE):
        parts = ["attnkit", *path.relative_to(PACKAGE).with_suffix("").parts]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module in public_modules():
            return f"{api_page(api_group(module))}#{module}"
    return f"{REPO}/{path.relative_to(ROOT).as_posix()}"


def on_config(config):
    """Heading anchors as GitHub writes them (lower case, Unicode letters kept, each space a hyphen), so that a link
    to a section works on GitHub and in the site alike. Python-Markdown's default slugify drops every non-ASCII
    letter: the Korean pages' headings got anchors such as ``_1`` and ``31``. Set here rather than in mkdocs.yml,
    whose ``!!python`` tag would make the file unreadable to ``yaml.safe_load`` (tests/test_reference.py)."""
    from pymdownx.slugs import slugify

    config["mdx_configs"].setdefault("toc", {})["slugify"] = slugify(case="lower")
    return config


def on_files(files: Files, config) -> Files:
    for uri, home in HOMES.items():
        if home.is_file() and files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(home)))
    for uri, content in api_pages().items():
        files.append(File.generated(config, uri, content=content))
    # Copies of the repository files the pages link to, and of those their Markdown links to in turn.
    pending = [real_path(f.src_uri) for f in files if f.src_uri.endswith(".md")]
    pending += [ROOT / name for name in ALWAYS_COPIED]
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        uri = site_uri(path).split("#")[0]
        if uri.startswith(REPO + "/") and path.is_file() and files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
        if path.suffix == ".md" and path.is_file():
            text = path.read_text(encoding="utf-8")
            pending += [target for _, target in link_targets(text, path) if target is not None]
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    src_uri = page.file.src_uri
    where = real_path(src_uri)

    def rewrite(match: re.Match) -> str:
        before, target, after = match.groups()
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or not path:
            return match.group(0)  # a URL, or an anchor in this page
        uri = site_uri((where.parent / path).resolve())
        uri, _, module_anchor = uri.partition("#")
        new = posixpath.relpath(uri, posixpath.dirname(src_uri) or ".")
        anchor = anchor or module_anchor
        return f"{before}{new}{'#' + anchor if anchor else ''}{after}"

    # Rewrite outside fenced code blocks only: a code sample may contain text shaped like a link.
    pieces, last = [], 0
    for fence in FENCE.finditer(markdown):
        pieces.append(LINK.sub(rewrite, markdown[last : fence.start()]))
        pieces.append(fence.group(0))
        last = fence.end()
    pieces.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(pieces)
