"""One rank of tests/test_torch_backend.py (run by torchrun): every ProcessGroup call DDP and FSDP make,
through torch.distributed's public API, over the backend "mrc"; prints "ok RANK" at the end."""

import sys

import torch
import torch.distributed as dist

import openmrc.torch  # noqa: F401 (registers "mrc")

dist.init_process_group("mrc")
r, n = dist.get_rank(), dist.get_world_size()
tri = n * (n + 1) / 2

x = torch.ones(1000) * (r + 1)
dist.all_reduce(x)
assert torch.all(x == tri), x[:3]
for op, want in ((dist.ReduceOp.MAX, n), (dist.ReduceOp.MIN, 1), (dist.ReduceOp.PRODUCT, 6 if n == 3 else 2)):
    y = torch.ones(10, dtype=torch.bfloat16) * (r + 1)
    dist.all_reduce(y, op=op)
    assert torch.all(y == want), (op, y)
z = torch.full((5,), r * 2 + 1, dtype=torch.int64)
dist.all_reduce(z, op=dist.ReduceOp.AVG)
assert torch.all(z == n), z  # (1 + 3 + 5) / 3, truncated
b = torch.arange(5.0) if r == 0 else torch.zeros(5)
dist.broadcast(b, 0)
assert torch.all(b == torch.arange(5.0))
red = torch.full((4,), float(r + 1))
dist.reduce(red, dst=n - 1)
if r == n - 1:
    assert torch.all(red == tri), red
outs = [torch.zeros(3) for _ in range(n)]
dist.all_gather(outs, torch.full((3,), float(r)))
assert all(torch.all(o == i) for i, o in enumerate(outs))
big = torch.zeros(n * 4)
dist.all_gather_into_tensor(big, torch.full((4,), float(r)))
assert torch.all(big.view(n, 4)[:, 0] == torch.arange(n))
rs = torch.zeros(4)
dist.reduce_scatter_tensor(rs, torch.arange(n * 4.0))
assert torch.all(rs == n * torch.arange(r * 4.0, r * 4 + 4)), rs
rl = torch.zeros(2)
dist.reduce_scatter(rl, [torch.full((2,), float(j)) for j in range(n)])
assert torch.all(rl == n * r), rl
a2a = torch.zeros(n * 2)
dist.all_to_all_single(a2a, torch.arange(n * 2.0) + 100 * r)
assert torch.all(a2a == torch.cat([torch.arange(r * 2.0, r * 2 + 2) + 100 * j for j in range(n)])), a2a
uneven_in = torch.arange(float(sum(range(1, n + 1)))) + 10 * r  # j + 1 rows to rank j
uneven_out = torch.zeros(n * (r + 1))
dist.all_to_all_single(uneven_out, uneven_in, [r + 1] * n, [j + 1 for j in range(n)])
start = sum(range(1, r + 1))
assert torch.all(uneven_out == torch.cat([torch.arange(start, start + r + 1.0) + 10 * j for j in range(n)]))
lists = [torch.zeros(1) for _ in range(n)]
dist.all_to_all(lists, [torch.full((1,), float(r * n + j)) for j in range(n)])
assert [int(t.item()) for t in lists] == [j * n + r for j in range(n)], lists
dist.barrier()
if r == 0:
    dist.send(torch.arange(7.0), 1)
elif r == 1:
    t = torch.zeros(7)
    dist.recv(t, 0)
    assert torch.all(t == torch.arange(7.0))
work = dist.all_reduce(torch.ones(3), async_op=True)
work.wait()
fut = dist.all_reduce(torch.ones(2), async_op=True).get_future()
assert torch.all(fut.wait()[0] == n)
strided = torch.ones(4, 4)[:, 1]
dist.all_reduce(strided)
assert torch.all(strided == n)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
for _ in range(3):
    ddp(torch.randn(4, 8)).sum().backward()
sub = dist.new_group([0, 1])  # a second group on the same device
if r in (0, 1):
    s = torch.ones(2) * (r + 1)
    dist.all_reduce(s, group=sub)
    assert torch.all(s == 3)
sys.stdout.write(f"ok {r}\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.destroy_process_group()
