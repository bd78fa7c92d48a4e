"""The one JSON document a `--json` command prints on stdout (errors included), versioned."""

from __future__ import annotations

import json
from typing import Any

# Raised when a field of any document changes meaning or goes away (new fields do not).
SCHEMA_VERSION = 1


def dumps(document: dict[str, Any]) -> str:
    """A `--json` command's one document, its schema_version first."""
    return json.dumps({"schema_version": SCHEMA_VERSION, **document}, indent=2)
