# Monarch names beyond the getting-started ones, imported the Monarch way.
from monarch.actor import (
    Actor,
    Channel,
    Extent,
    as_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    get_or_spawn_controller,
    send,
    this_host,
)
from monarch.actor.concurrent import concurrent_endpoint
from monarch.config import configured


class Registry(Actor):
    def __init__(self):
        self.names = []

    @endpoint
    def register(self, name: str) -> int:
        self.names.append(name)
        return len(self.names)


class Worker(Actor):
    def __init__(self):
        self.registry = None

    def helper(self) -> str:  # not an endpoint
        return f"helper {context().actor_instance.rank.rank}"

    @endpoint
    def join(self) -> int:
        registry = get_or_spawn_controller("registry", Registry).get()
        return registry.register.call_one(current_actor_name()).get()

    @endpoint
    def where(self) -> str:
        return f"{dict(current_rank())} of {current_size()}"


with configured(stop_actor_timeout="2s"):
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    workers = procs.spawn("workers", Worker)
    print("extent", workers.extent, workers.extent == Extent(["hosts", "gpus"], [2, 2]))
    print("joined", sorted(workers.join.call().get().values()))
    grid = workers.split(gpus=("a", "b"), b=1)
    print("where", grid.slice(hosts=1, b=0).where.call().get().values())
    port, ranked = Channel.open_ranked()
    send(workers.slice(gpus=1).where, (), {}, port=port)
    print("ranked", sorted(ranked.recv().get() for _ in range(2)))
    print("helpers", as_endpoint(workers.helper).call().get().values())
    procs.stop().get()
print("concurrent_endpoint", concurrent_endpoint.__name__)
print("done")
