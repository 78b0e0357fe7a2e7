"""``python -m timewheel serve``: the same as the ``timewheel`` console script."""

from timewheel.cli import main

main()
