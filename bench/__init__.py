"""Side-by-side benchmarks of constrain against xgrammar, llguidance and outlines-core."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
