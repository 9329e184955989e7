# Monarch's ping-pong pattern: actors that call each other, a fault hook set the Monarch way.
import monarch.actor
from monarch.actor import Actor, context, endpoint, this_host

faults = []
monarch.actor.unhandled_fault_hook = faults.append


class PingPong(Actor):
    def __init__(self):
        self.name = "Ping" if context().actor_instance.rank.rank == 0 else "Pong"
        self.count = 0

    @endpoint
    async def ping(self, message: str) -> str:
        self.count += 1
        return f"{self.name} got {message} #{self.count}"


procs = this_host().spawn_procs(per_host={"gpus": 2})
actors = procs.spawn("ping_pong", PingPong)
ping, pong = actors.slice(gpus=0), actors.slice(gpus=1)
for i in range(3):
    print(ping.ping.call_one(f"ping {i}").get())
    print(pong.ping.call_one(f"pong {i}").get())
procs.stop().get()
print("faults", len(faults))
