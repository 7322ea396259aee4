"""What reaches the operator's terminal from a node: text without anything a terminal acts on.

A node's answers (log lines, os-release fields, `ibdev2netdev` names, Docker's container and
image names) are untrusted: an escape sequence in one could retitle the window, hide text,
move the cursor or plant a hyperlink on the operator's terminal. `spark-vllm logs` prints
every log line through `sanitize`; `init` and `recon` print what the nodes said through
`sanitize_lines` (issue 46); `status` and the recon table escape node values with
inspection.recon.printable.
"""

from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor moves)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC (window titles, hyperlinks)
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"  # any other escape
    r"|\x9b[0-?]*[ -/]*[@-~]"  # CSI as one C1 character
)
# C0 but tab, DEL, C1, and the bidirectional overrides that make text read other than it is
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")

def sanitize(text: str) -> str:
    """`text` without anything a terminal would act on: escape sequences and control
    characters go; of carriage-return-separated updates (progress bars) the last one stays,
    what a terminal would have shown; a tab stays."""
    text = _ESCAPES.sub("", text)
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    return _CONTROLS.sub("", text)


def sanitize_lines(text: str) -> str:
    """`sanitize` of every line of `text`, the line breaks kept (a finding per line)."""
    return "\n".join(sanitize(line) for line in text.split("\n"))
