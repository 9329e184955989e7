"""A Monarch program in the pattern of Monarch's distributed_tensors example, on CPU:
tensors on a mesh, inspect and show, a failure and recovery, reductions, renamed and
split meshes, a pipeline of nn.Linear stages across slices, and data-parallel training."""

import monarch
import torch
import torch.nn as nn
from monarch.actor import this_host

torch.manual_seed(0)
mesh = this_host().spawn_procs({"gpu": 2})
print(mesh.to_table().splitlines()[0])

with mesh.activate():
    t = torch.rand(3, 4)
print("inspect", tuple(monarch.inspect(t, gpu=0).shape))
monarch.show(t, gpu=1)

with mesh.activate():
    obj = t @ t.T
print("obj", tuple(monarch.inspect(obj, gpu=1).shape))

try:
    with mesh.activate():
        huge = torch.ones(1 << 62, dtype=torch.uint8)  # no worker can hold it
    monarch.inspect(huge.sum(), gpu=0)
except Exception as e:
    print("failed as expected:", type(e).__name__)
print("RECOVERED!")

with mesh.activate():
    a = torch.rand(3, 4)
    r = a.reduce("gpu", "sum")
expected = monarch.inspect(a, gpu=0) + monarch.inspect(a, gpu=1)
print("reduce ok", torch.allclose(monarch.inspect(r, gpu=0), expected))

remote_mesh = this_host().spawn_procs({"host": 2, "gpu": 2})
print("2d", remote_mesh.rename(host="dp", gpu="tp").sizes)
print("3d", remote_mesh.split(host=("dp", "pp"), gpu=("tp",), pp=2).sizes)

pipeline_mesh = remote_mesh.rename(host="pp")
meshes = [pipeline_mesh.slice(pp=i) for i in range(pipeline_mesh.size("pp"))]
stages = []
for stage_mesh in meshes:
    with stage_mesh.activate():
        stages.append(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU()))


def forward_pipeline(x):
    with torch.no_grad():
        for stage_mesh, stage in zip(meshes, stages, strict=True):
            x = x.to_mesh(stage_mesh)
            with stage_mesh.activate():
                x = stage(x)
        return x


with meshes[0].activate():
    batch = torch.rand(3, 4)
output = forward_pipeline(batch)
print("pipeline", tuple(monarch.inspect(output, gpu=0).shape))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x, target):
        return nn.functional.cross_entropy(self.layers(x), target)


dp = mesh.rename(gpu="dp")
with dp.activate():
    model = Net()
    x, target = torch.rand(16, 4), torch.full((16,), 1, dtype=torch.int64)
    losses = []
    for _ in range(30):
        loss = model(x, target)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.grad.reduce_("dp", "avg")
                p -= 0.5 * p.grad
                p.grad = None
        losses.append(loss)
first, last = monarch.inspect(losses[0], dp=0), monarch.inspect(losses[-1], dp=0)
print("trained", bool(last < first))


# The simulator: the same DDP step on a mesh that records and times instead of
# computing, its gradients reduced on a comms stream while the backward pass goes on.
comms = monarch.Stream("comms")


def give_back(param, grad, borrow):
    borrow.drop()  # from here the main stream waits for the reduction
    param -= 0.5 * grad


def simulated_step(drop_late):
    simulator = monarch.Simulator(hosts=1, gpus=4, trace_mode="stream_only", trace_path=None)
    with simulator.mesh.rename(gpu="dp").activate():
        model = Net()
        loss = model(torch.rand(64, 4), torch.full((64,), 1, dtype=torch.int64))
        params = list(reversed(list(model.parameters())))
        lent_before = None
        with torch.no_grad():
            for param, grad in zip(params, monarch.grad_generator(loss, params), strict=True):
                if lent_before is not None:  # after the next backward step was issued
                    give_back(*lent_before)
                    lent_before = None
                on_comms, borrow = comms.borrow(grad, mutable=True)
                with comms.activate():
                    on_comms.reduce_("dp", "sum")
                if drop_late:
                    lent_before = (param, grad, borrow)
                else:
                    give_back(param, grad, borrow)
            if lent_before is not None:
                give_back(*lent_before)
        simulator.display()
        [summary] = simulator.summary()["meshes"]
    return summary


early, late = simulated_step(False), simulated_step(True)
print("simulated", early["workers"], sorted(early["streams"]), early["collectives"])
print("overlap helps", late["span_s"] < early["span_s"])
remote_mesh.stop().get()
mesh.stop().get()
print("done")
