"""Text made safe for each report format: every CSV, HTML and Markdown report goes through here.

Student text (file names, exception messages, printed output) reaches reports, and a report is
opened by course staff in a spreadsheet, a browser or a Markdown viewer, each of which obeys
some text as an instruction:

- CSV (OWASP's CSV injection): a cell that begins with `=`, `+`, `-`, `@`, tab or carriage
  return is a formula to Excel, LibreOffice and Google Sheets. `csv_cell` prefixes such a text
  cell with a single quote (shown as text, the rest kept as written) and `to_csv` quotes every
  text cell, so no separator or quote inside can start a cell of its own. Numbers the project
  writes (scores, seconds, a negative one included) are not text and stay numbers. The
  full-width forms of the four formula characters are neutralised too (some spreadsheets, in
  some locales, read them as the ASCII ones).
- HTML: `html_text` escapes `&`, `<`, `>` and both quotes, so a text is text inside an element or
  an attribute.
- Markdown: `markdown_cell` escapes what would end a table cell or start a code span, a link,
  an image, an HTML tag or an entity (pipes, backticks, brackets, angle brackets, ampersands,
  backslashes) and writes a line break as `<br>`, so a table row stays one row.

All three first drop escape sequences and show other control characters as `\\xNN`
(harness.isolation.worker.printable), as every terminal and report of the project does.
"""

from __future__ import annotations

import csv
import html
import re
from typing import TYPE_CHECKING, Any

from harness.isolation.worker import printable

if TYPE_CHECKING:
    import pandas as pd

# OWASP's list (https://owasp.org/www-community/attacks/CSV_Injection), then the full-width
# equals, plus, minus and commercial at.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def csv_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet reads as a formula: a text that begins with a formula
    character gets a leading single quote (OWASP); anything else, numbers included, is kept."""
    if not isinstance(value, str):
        return value
    shown = printable(value)  # a carriage return is shown as \\x0d, as everywhere
    return "'" + shown if value.startswith(FORMULA_START) else shown


def to_csv(table: pd.DataFrame) -> str:
    """The one CSV writer of the project's reports: every text cell (the header's too) through
    `csv_cell` and quoted; numeric and boolean columns are written as they are."""
    import pandas as pd  # the caller has it already; here only for its dtype checks

    safe = table.copy()
    for column in safe.columns:
        values = safe[column]
        if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        safe[column] = values.map(csv_cell)
    safe.columns = [csv_cell(str(c)) for c in safe.columns]
    return safe.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC)


def html_text(value: Any) -> str:
    """A value as HTML text, safe inside an element and inside a quoted attribute."""
    return html.escape(printable(str(value)), quote=True)


# What ends a GFM table cell or starts a code span or a link (CommonMark lets any ASCII
# punctuation be backslash-escaped); the backslash too, so a student's own cannot undo ours.
_MARKDOWN = re.compile(r"([\\`|\[\]])")
_LINES = re.compile(r"\r\n|\r|\n")


def markdown_cell(value: Any) -> str:
    """A value as the text of one Markdown (GFM) table cell: shown as written, on one row."""
    text = printable(_LINES.sub("\n", str(value)))  # every line break one \n, kept by printable
    text = html.escape(text, quote=False)  # &, <, >: no tag, no entity
    return _MARKDOWN.sub(r"\\\1", text).replace("\n", "<br>")


def markdown_table(table: pd.DataFrame) -> str:
    """A DataFrame as a GFM table, every header and cell through `markdown_cell`."""
    head = [markdown_cell(c) for c in table.columns]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(markdown_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"
