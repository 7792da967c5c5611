"""Where the benchmarks write: raw results (git-ignored) and plots (docs/img)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from localdynamo.servers import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "bench" / "results"
IMG_DIR = REPO_ROOT / "docs" / "img"


def write_results(results: dict[str, Any], path: Path | None, prefix: str) -> Path:
    """The raw results as JSON: at ``path``, or bench/results/<prefix>-<timestamp>.json."""
    json_path = path or RESULTS_DIR / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1, default=str))
    return json_path


__all__ = ["IMG_DIR", "REPO_ROOT", "RESULTS_DIR", "write_results"]
