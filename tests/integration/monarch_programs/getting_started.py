# A Monarch-style program (written for this test, in the patterns of Monarch's getting
# started guide): imports monarch.actor, nothing else changed.
import asyncio

from monarch.actor import Actor, current_rank, endpoint, this_host


class Counter(Actor):
    def __init__(self, initial_value: int):
        self.value = initial_value

    @endpoint
    def incr(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value


class Trainer(Actor):
    def __init__(self, counters):
        self.counters = counters

    @endpoint
    def step(self) -> int:
        # A sync endpoint that waits on other actors with .get(), as Monarch's guide does.
        self.counters.incr.broadcast()
        values = self.counters.get_value.call().get()
        return sum(values.values()) * 10 + current_rank().rank


procs = this_host().spawn_procs(per_host={"gpus": 2})
counters = procs.spawn("counters", Counter, 0)
trainers = procs.spawn("trainers", Trainer, counters)  # passed on right after spawn
counters.incr.call().get()
print("values", list(counters.get_value.call().get().values()))
print("one", counters.slice(gpus=1).get_value.call_one().get())

print("steps", sorted(trainers.step.call().get().values()))


async def main() -> None:
    print("async", await counters.slice(gpus=0).get_value.call_one())


asyncio.run(main())
procs.stop().get()
print("done")
