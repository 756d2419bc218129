"""A verifiers v1 taskset and a two-seat env, for tests/envs/test_verifiers.py (written on verifiers'
public v1 API, as a user's env package would be; the tests put this folder on sys.path).

``SumTaskset``: four sums; a reply is scored ``exact`` (the sum, weight 1) and ``brief`` (at most
three characters, weight 0.1). ``DuoEnv``: the solver answers, the critic (``trainable=False``)
critiques, the solver answers again; the critic is rewarded when the solver ends right.
"""

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.1)
    async def brief(self, task, trace) -> float:
        return float(len(trace.last_reply.strip()) <= 3)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(2, 2), (3, 3), (4, 5), (6, 1)]:
            data = SumData(prompt=f"{a}+{b}?", system_prompt="Answer with a number.", answer=str(a + b))
            yield SumTask(data, self.config.task)


class DuoConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig(max_turns=3)
    critic: vf.AgentConfig = vf.AgentConfig(max_turns=3)
    rounds: int = 2


class DuoEnv(vf.Env[DuoConfig]):
    async def setup(self, agents):
        agents.critic.trainable = False

    async def run(self, task, agents):
        critic_task = vf.Task(vf.TaskData(idx=task.data.idx, prompt=None, system_prompt="You critique answers."))
        async with agents.solver.interaction(task) as solver, agents.critic.interaction(critic_task) as critic:
            segment = await solver.turn()
            for _ in range(self.config.rounds - 1):
                if segment.terminated:
                    break
                critique = await critic.turn(f"Critique this answer: {segment.last_reply}")
                if critique.terminated:
                    break
                segment = await solver.turn(critique.last_reply)

    async def finalize(self, task, episode):
        solver = episode.by_agent["solver"][0]
        episode.by_agent["critic"][0].record_reward("solver_right", float(solver.reward >= 1))


__all__ = ["SumTaskset", "DuoEnv"]
