import sys
from pathlib import Path

# The fixture task directories hold tests of their own: they run inside the verifier, not here.
collect_ignore_glob = ["fixtures/*"]
# The gate tests' batch builders (tests/ has no __init__).
sys.path.insert(0, str(Path(__file__).parents[1] / "quality"))
