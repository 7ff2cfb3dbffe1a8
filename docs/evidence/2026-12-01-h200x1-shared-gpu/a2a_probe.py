"""Two ranks on one GPU through tools.shared_gpu: NCCL all_to_all_single / all_reduce correctness + timing."""
import os, time, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
x = torch.arange(w * 4, device="cuda", dtype=torch.float32) + 100 * r
y = torch.empty_like(x)
dist.all_to_all_single(y, x)
exp = torch.cat([torch.arange(r * 4, r * 4 + 4, device="cuda", dtype=torch.float32) + 100 * s for s in range(w)])
ok = torch.equal(y, exp)
z = torch.full((1024,), float(r + 1), device="cuda"); dist.all_reduce(z)
ok = ok and bool((z == sum(range(1, w + 1))).all())
big = torch.randn(8 * 1024 * 1024 // 4 * 2, device="cuda"); out = torch.empty_like(big)
torch.cuda.synchronize(); t = time.time()
for _ in range(20):
    dist.all_to_all_single(out, big)
torch.cuda.synchronize(); dt = (time.time() - t) / 20
print(f"rank {r}/{w} hostid={os.environ.get('NCCL_HOSTID')} local_rank={os.environ['LOCAL_RANK']} dev={torch.cuda.current_device()} "
      f"correct={ok} a2a 64MiB: {dt*1e3:.1f} ms ({big.numel()*4/dt/1e9:.2f} GB/s)", flush=True)
dist.destroy_process_group()
