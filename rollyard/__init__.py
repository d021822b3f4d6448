"""The foundation every rollyard package stands on: the error root and the episode statuses.

It imports nothing of the project, so `sandboxes` (the bottom of the data path) can use it too.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rollyard")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
