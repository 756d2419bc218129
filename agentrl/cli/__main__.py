"""``python -m agentrl.cli``: the ``agentrl`` command."""

from agentrl.cli import main

main()
