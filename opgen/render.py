"""Jinja rendering shared by the emitters, and safe docstrings.

Templates are looked up first in a user's template folder (if given), then in the
`templates/` folder shipped with opgen, so a user can override one file kind at a time.
`StrictUndefined` makes a missing variable an error rather than empty text.
"""

from __future__ import annotations

from pathlib import Path

import jinja2


def default_template_dir() -> Path:
    """`templates/` beside the package in a checkout, or inside it when installed."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "op.py.j2").is_file():
            return candidate
    raise FileNotFoundError(
        f"opgen's templates are missing (looked in {here / 'templates'} and {here.parent / 'templates'})"
    )


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

    def render(self, template: str, **context: object) -> str:
        text = self.env.get_template(template).render(**context)
        # One newline at the end, no trailing spaces: stable, diff-friendly output.
        lines = [line.rstrip() for line in text.splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines) + "\n"


def docstring(lines: list[str], indent: int) -> str:
    """A triple-quoted docstring whose text cannot end it early or escape from it.

    Spec `doc` text is data: backslashes and quotes are escaped, so nothing in it can close
    the string or form an escape sequence; it reaches Jinja as a value, never as template
    source, so `{{ }}` in it stays literal text.
    """
    pad = " " * indent
    body: list[str] = []
    for line in "\n".join(lines).splitlines():
        line = line.replace("\\", "\\\\").replace('"', '\\"')
        body.append(pad + line if line.strip() else "")
    if len(body) == 1:
        return '"""' + body[0].strip() + '"""'
    return '"""' + body[0].strip() + "\n" + "\n".join(body[1:]) + "\n" + pad + '"""'
