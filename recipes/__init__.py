"""Recipes: a training run of the paper or task they are named after, built on agentrl and kept
out of it (config, training hooks, evaluation, commands, README). Each installs as
``agentrl.recipes.<name>`` and adds its commands to ``agentrl`` through an entry point."""
