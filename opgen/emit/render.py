"""Jinja rendering shared by the emitters.

Templates are looked up first in a user's template folder (if given), then in the
`templates/` folder shipped with opgen, so a user can override one file kind at a time.
`StrictUndefined` makes a missing variable an error rather than empty text. Outside text
reaches templates only through `opgen.spec.quote` (the `py` filter writes data as a Python
literal, the emitters pass comments and docstrings already quoted).
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from opgen.spec import quote


def default_template_dir() -> Path:
    """`templates/` beside the package in a checkout, or inside it when installed."""
    package = Path(__file__).resolve().parents[1]
    candidates = (package / "templates", package.parent / "templates")
    for candidate in candidates:
        if (candidate / "op.py.j2").is_file():
            return candidate
    raise FileNotFoundError(f"opgen's templates are missing (looked in {' and '.join(map(str, candidates))})")


class Renderer:
    def __init__(self, user_dir: Path | None = None) -> None:
        loaders: list[jinja2.BaseLoader] = []
        if user_dir is not None:
            loaders.append(jinja2.FileSystemLoader(str(user_dir)))
        loaders.append(jinja2.FileSystemLoader(str(default_template_dir())))
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(loaders),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            autoescape=False,
        )
        self.env.filters["py"] = quote.literal

    def render(self, template: str, **context: object) -> str:
        text = self.env.get_template(template).render(**context)
        # One newline at the end, no trailing spaces: stable, diff-friendly output. Split at
        # "\n" only: `splitlines` would also break at characters that do not end a line for
        # Python (Note [escaping] in opgen.spec.quote).
        lines = [line.rstrip(" \t") for line in text.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines) + "\n"
