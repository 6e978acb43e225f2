"""MkDocs hook: a docs page may link a file of the repository outside docs/ (a screenshot, a
dashboard, an alerting rule) by its relative path, ``../observability/console.png``, which is
also the link that works on GitHub and in a local checkout. Such files are copied into the site
under ``repo/`` and the link points there; a link to a repository file that does not exist
still fails the strict build (mkdocs' own check). Markdown files outside docs/ are not
published (they would become pages of their own): link those as code, not as links."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

# an inline link or image target: ](../path) or ](../path#anchor "title")
_LINK = re.compile(r"\]\((\.\./[^)\s#]+)")


def on_files(files: Files, config: Any) -> Files:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    published: set[str] = set()
    for page in list(files.documentation_pages()):
        text = Path(page.abs_src_path or "").read_text(encoding="utf-8")
        base = Path(page.src_uri).parent
        for link in _LINK.findall(text):
            target = (docs / base / link).resolve()
            if root not in target.parents or docs in target.parents or target.suffix == ".md":
                continue
            if not target.is_file():
                continue  # left to mkdocs: a link to nothing fails the strict build
            rel = target.relative_to(root).as_posix()
            src_uri = Path("..", rel).as_posix()
            if rel in published:
                continue
            published.add(rel)
            files.append(
                File(src_uri, src_dir=str(docs), dest_dir=config["site_dir"],
                     use_directory_urls=config["use_directory_urls"], dest_uri=f"repo/{rel}",
                     # stated: left undefined, mkdocs would exclude it after this hook (its
                     # default exclusion of names starting with "." matches the "..")
                     inclusion=InclusionLevel.INCLUDED)
            )  # fmt: skip
    return files
