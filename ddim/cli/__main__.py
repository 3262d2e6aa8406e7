"""``python -m ddim.cli``: the ``ddim`` command."""

from ddim.cli import main

main()
