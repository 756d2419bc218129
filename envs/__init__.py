"""Built-in environments; each module registers its ids (``agentrl/<Name>-v<N>``) on import."""

# Importing a module runs its register(...) call; `import agentrl` imports this package, so the
# built-in ids are known without the user importing anything (as gymnasium's own envs are).
from agentrl.envs import (  # noqa: F401
    calculator,
    codebreaker,
    codesandbox,  # noqa: F401  (needs a sandbox backend at reset, not at import)
    countdown,
    explain,  # noqa: F401  (long-form reference answers: JEPO's measurement)
    hallway,  # noqa: F401  (multi-turn with repeated states: GiGPO's measurement)
    negotiation,  # noqa: F401  (multi-agent: agentrl.multiagent.make_multiagent)
    textarena,  # noqa: F401  (TextArena's games as textarena/<Game>, registered on first use)
    tool_arithmetic,  # noqa: F401  (the quickstart's task)
    verifiers,  # noqa: F401  (a verifiers v1 Env as verifiers/Env-v0, registered on first use)
    waltz,  # noqa: F401  (multi-agent: WaltzRL's conversation and feedback agents)
)
