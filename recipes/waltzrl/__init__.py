"""WaltzRL (Zhang et al., "The Alignment Waltz", arXiv 2510.08240) on ``agentrl/Waltz-v0``: the
config (``waltzrl.yaml``), the training hooks (:mod:`.hooks`), the evaluation table
(:mod:`.evaluate`) and its command, ``agentrl waltz-table`` (:mod:`.cli`). README.md says how to run
it and what it measured."""
