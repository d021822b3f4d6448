import sys
from pathlib import Path

# The shared batch builders live beside the tests (no package: tests/ has no __init__).
sys.path.insert(0, str(Path(__file__).parent))
