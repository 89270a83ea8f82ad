"""Refresh the generated swish listing that docs/tutorial.md shows (tests/test_cli.py checks it).

.venv/bin/python scripts/refresh_listing.py
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
page = ROOT / "docs" / "tutorial.md"
text = page.read_text(encoding="utf-8")
source = (ROOT / "generated" / "ops" / "swish.py").read_text(encoding="utf-8")
listing = source[re.search(r"^(from|import) ", source, re.M).start() :].rstrip()  # from the imports on
start = text.index("```python\n", text.index("generated/ops/swish.py"))
end = text.index("\n```", start + 10)
page.write_text(text[:start] + f"```python\n{listing}" + text[end:], encoding="utf-8")
