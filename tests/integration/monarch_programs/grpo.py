# Monarch's GRPO actor pattern on CPU: queue and replay-buffer actors, a scorer loop
# running in the background, a learner whose weights the generators pull over RDMA.
# Endpoints that wait for another message of their own actor are concurrent endpoints
# (an actor handles one message at a time otherwise, in Monarch as here).
import asyncio
import copy
import random
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.optim as optim
from monarch.actor import Actor, concurrent_endpoint, endpoint, this_host
from monarch.rdma import RDMABuffer
from torch.distributions import Categorical, kl_divergence

G = 8
STATE_DIM = 4
ACTION_DIM = 4


@dataclass
class TrajectorySlice:
    policy_version: int
    state: torch.Tensor
    actions: torch.Tensor
    old_logps: torch.Tensor
    rewards: torch.Tensor


class TrajectoryQueue(Actor):
    def __init__(self):
        self.queue = asyncio.Queue()

    @endpoint
    async def put(self, slice: TrajectorySlice) -> None:
        await self.queue.put(slice)

    @concurrent_endpoint
    async def get(self) -> TrajectorySlice:
        return await self.queue.get()


class ReplayBuffer(Actor):
    def __init__(self):
        self.storage = []
        self.storage_event = asyncio.Event()

    @endpoint
    async def put(self, slice: TrajectorySlice) -> None:
        self.storage.append((slice.policy_version, slice))
        self.storage_event.set()

    @concurrent_endpoint
    async def sample_from(self, k: int) -> list:
        await asyncio.wait_for(self.storage_event.wait(), timeout=30.0)
        weights = [version + 1 for version, _ in self.storage]
        chosen = random.choices(range(len(self.storage)), weights=weights, k=k)
        return [self.storage[i][1] for i in chosen]


class Scorer(Actor):
    def __init__(self, trajectory_queue, replay_buffer):
        self.trajectory_queue = trajectory_queue
        self.replay_buffer = replay_buffer
        self.net = nn.Sequential(nn.Linear(STATE_DIM + 1, 8), nn.Tanh(), nn.Linear(8, 1))
        self.running = False
        self.scored = 0

    async def _score_slice(self, slice: TrajectorySlice) -> None:
        s = slice.state.unsqueeze(0).repeat(G, 1)
        a = slice.actions.float().unsqueeze(-1)
        with torch.no_grad():
            rewards = self.net(torch.cat([s, a], dim=-1)).squeeze(-1)
        scored = TrajectorySlice(
            slice.policy_version, slice.state, slice.actions, slice.old_logps, rewards
        )
        await self.replay_buffer.put.call(scored)
        self.scored += 1

    @concurrent_endpoint
    async def run(self) -> int:
        self.running = True
        while self.running:
            try:
                slice_ = await asyncio.wait_for(self.trajectory_queue.get.call_one(), 0.2)
            except TimeoutError:
                continue
            await self._score_slice(slice_)
        return self.scored

    @endpoint
    async def halt(self) -> None:  # Monarch's example names it `stop`, an ActorMesh attribute
        self.running = False


class Learner(Actor):
    def __init__(self, replay_buffer):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(STATE_DIM, 16), nn.Tanh(), nn.Linear(16, ACTION_DIM))
        self.ref_model = copy.deepcopy(self.model)
        for p in self.ref_model.parameters():
            p.requires_grad = False
        self.optim = optim.Adam(self.model.parameters(), lr=1e-3, eps=1e-5)
        self.eps = 0.2
        self.kl_coeff = 0.1
        self.policy_version = 0
        self.replay_buffer = replay_buffer
        self.batch_size = 2
        self.generators = None
        self._weights_handle = {}

    @endpoint
    async def init_generators(self, generators) -> None:
        self.generators = generators

    @endpoint
    async def weights_handle(self) -> dict:
        self._weights_handle = {
            k: (v, RDMABuffer(v.view(torch.uint8).flatten()))
            for k, v in self.model.state_dict().items()
        }
        return self._weights_handle

    @endpoint
    async def weights_sum(self) -> float:
        return float(sum(p.detach().sum() for p in self.model.parameters()))

    @endpoint
    async def step(self) -> torch.Tensor:
        if self.generators:
            await self.generators.update.call(self.policy_version)
        slices = await self.replay_buffer.sample_from.call_one(self.batch_size)
        states = torch.stack([s.state for s in slices]).repeat_interleave(G, 0)
        actions = torch.cat([s.actions for s in slices])
        old_logps = torch.cat([s.old_logps for s in slices])
        rewards = torch.cat([s.rewards for s in slices]).view(-1, G)
        advs = (rewards - rewards.mean(dim=1, keepdim=True)).reshape(-1)
        advs = (advs - advs.mean()) / (advs.std() + 1e-8)
        dist_new = Categorical(logits=self.model(states))
        ratio = (dist_new.log_prob(actions) - old_logps).exp()
        clipped = torch.clamp(ratio, 1 - self.eps, 1 + self.eps) * advs
        ppo_loss = -torch.min(ratio * advs, clipped).mean()
        with torch.no_grad():
            ref_logits = self.ref_model(states)
        kl = kl_divergence(Categorical(logits=ref_logits), dist_new).mean()
        loss = ppo_loss + self.kl_coeff * kl
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        self.policy_version += 1
        return loss.detach()


class Generator(Actor):
    def __init__(self, weight_buffers, trajectory_queue):
        self.model = nn.Sequential(nn.Linear(STATE_DIM, 16), nn.Tanh(), nn.Linear(16, ACTION_DIM))
        self.weight_buffers = weight_buffers
        self.trajectory_queue = trajectory_queue
        self.ready = True
        self.cond = asyncio.Condition()
        self.policy_version = 0

    @concurrent_endpoint
    async def generate(self, state: torch.Tensor) -> None:
        async with self.cond:
            await self.cond.wait_for(lambda: self.ready)
            with torch.no_grad():
                dist = Categorical(logits=self.model(state.unsqueeze(0).repeat(G, 1)))
                acts = dist.sample()
                logps = dist.log_prob(acts)
            slice_ = TrajectorySlice(self.policy_version, state, acts, logps, torch.zeros(G))
        await self.trajectory_queue.put.call(slice_)
        async with self.cond:
            self.ready = False
            self.cond.notify_all()

    @endpoint
    async def update(self, version: int) -> None:
        async with self.cond:
            sd = self.model.state_dict()
            for n, (_, b) in self.weight_buffers.items():
                await b.read_into(sd[n].view(torch.uint8).flatten())
            self.model.load_state_dict(sd)
            self.policy_version = version
            self.ready = True
            self.cond.notify_all()

    @endpoint
    async def weights_sum(self) -> float:
        return float(sum(p.detach().sum() for p in self.model.parameters()))


async def main():
    learner_mesh = this_host().spawn_procs(per_host={"gpus": 1})
    gen_mesh = this_host().spawn_procs(per_host={"gpus": 2})
    traj_q = learner_mesh.spawn("traj", TrajectoryQueue)
    replay_buf = learner_mesh.spawn("rb", ReplayBuffer)
    learner = learner_mesh.spawn("learner", Learner, replay_buf)
    scorer = learner_mesh.spawn("scorer", Scorer, traj_q, replay_buf)
    wb = await learner.weights_handle.call_one()
    generators = gen_mesh.spawn("generator", Generator, wb, traj_q)
    await learner.init_generators.call(generators)
    await generators.generate.call(torch.randn(STATE_DIM))
    scorer_run_future = scorer.run.call_one()
    for step in range(5):
        state = torch.randn(STATE_DIM)
        _, loss = await asyncio.gather(generators.generate.call(state), learner.step.call_one())
        print(f"[Step {step:02d}] loss={loss:.3f}")
    await generators.update.call(5)  # pull the last weights over RDMA
    want = await learner.weights_sum.call_one()
    got = (await generators.weights_sum.call()).values()
    print("weights in sync", all(abs(g - want) < 1e-5 for g in got))
    await scorer.halt.call_one()
    print("scored", await scorer_run_future)
    await learner_mesh.stop()
    await gen_mesh.stop()
    print("Training complete")


if __name__ == "__main__":
    asyncio.run(main())
