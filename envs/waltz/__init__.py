"""``agentrl/Waltz-v0``: WaltzRL's conversation and feedback agents on one prompt (see :mod:`.env`).

The parts: the built-in prompts and a user's JSONL set (:mod:`.tasks`), the judges (:mod:`.judges`),
the reward terms (:mod:`.rewards`) and the metrics of its episodes (:mod:`.metrics`). Training it is
the WaltzRL recipe's (``recipes/waltzrl``: the run's config, hooks and evaluation table).
"""

from agentrl.envs.waltz.env import WaltzEnv
from agentrl.envs.waltz.judges import Judge, make_judge
from agentrl.envs.waltz.tasks import Labels, Prompt, builtin_prompts, load_prompts
from agentrl.multiagent import register_multiagent

register_multiagent("agentrl/Waltz-v0", "agentrl.envs.waltz.env:WaltzEnv", {"max_rounds": 1})

__all__ = [
    "Judge",
    "Labels",
    "Prompt",
    "WaltzEnv",
    "builtin_prompts",
    "load_prompts",
    "make_judge",
]
