#!/usr/bin/env python3
"""Check, one line per precondition, what DeepEP's HybridEP buffer init depends on - BEFORE any
HybridEP buffer is created - so a host where `HybridEPBuffer.__init__` dies (SIGSEGV) can be told
apart from one where it works.

    python3 -m torch.distributed.run --nproc_per_node 2 scripts/gpu/hybridep_probe.py [options]

Options:
    --skip-fabric    skip the CU_MEM_HANDLE_TYPE_FABRIC create/export/import/map test (the step
                     most likely to crash on a host whose driver advertises fabric handles)
    --deep-ep        afterwards run DeepEP's own allocator probe (hybrid_ep_cpp.ExtendedMemoryAllocator
                     + detect_accessible_ranks), which HybridEPBuffer.__init__ runs first
    --create-buffer  last of all create deep_ep.HybridEPBuffer with small shapes (may crash: that is
                     the reproduction; faulthandler prints the Python stack). Run it once as is and
                     once with USE_MNNVL=0 to see whether the fabric-handle path is the cause.

What DeepEP's hybrid-ep branch (94a9f8f) does at buffer init, and what this mirrors:
  csrc/hybrid_ep/allocator/allocator.cu  ExtendedMemoryAllocator(): uses CU_MEM_HANDLE_TYPE_FABRIC
      (cuMemCreate/cuMemExportToShareableHandle/cuMemImportFromShareableHandle/cuMemMap) when every
      visible GPU reports CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, a trial
      cuMemCreate(FABRIC) succeeds and USE_MNNVL is not 0/false; otherwise cudaMalloc +
      cudaIpcGetMemHandle/cudaIpcOpenMemHandle (the path classic deep_ep.Buffer uses).
  detect_accessible_ranks(): imports every peer's handle (fabric) or compares hostnames (IPC);
      the count becomes the ranks per NVLink domain (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN
      overrides it).
  csrc/hybrid_ep/buffer/intranode.cu + extension/allgather.cu: the real buffers, through the same
      allocator; their handles are all-gathered and opened on every peer.
  It never uses multicast objects; this probe only reads CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED and
  never calls cuMulticastCreate.

Every line reads `[rN] STATUS check: detail` with STATUS one of OK, INFO, WARN, FAIL, SKIP; a line
`[rN] ....  check: starting` comes before each step that could crash the process, so the last line
printed names the step that crashed. Nothing here needs DeepEP installed unless --deep-ep or
--create-buffer is given.
"""
from __future__ import annotations

import argparse
import ctypes
import faulthandler
import glob
import os
import platform
import pwd
import socket
import sys

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))

# cuda.h (CUDA 12.x/13.x) enum values.
ATTR = {
    "COMPUTE_CAPABILITY_MAJOR": 75,
    "COMPUTE_CAPABILITY_MINOR": 76,
    "UNIFIED_ADDRESSING": 41,
    "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": 102,
    "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED": 103,
    "GPU_DIRECT_RDMA_SUPPORTED": 116,
    "DMA_BUF_SUPPORTED": 124,
    "IPC_EVENT_SUPPORTED": 125,
    "HANDLE_TYPE_FABRIC_SUPPORTED": 128,
    "MULTICAST_SUPPORTED": 132,
    "MPS_ENABLED": 133,
}
P2P_ACCESS_SUPPORTED, P2P_NATIVE_ATOMIC_SUPPORTED = 0x02, 0x03
MEM_HANDLE_TYPE_FABRIC = 0x8
MEM_ALLOCATION_TYPE_PINNED = 0x1
MEM_LOCATION_TYPE_DEVICE = 0x1
MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
MEM_ALLOC_GRANULARITY_MINIMUM = 0x0
IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1
CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED = 800, 801


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CUmemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", CUmemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", CUmemAllocFlags)]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation), ("flags", ctypes.c_int)]


class Handle64(ctypes.Structure):  # CUipcMemHandle and CUmemFabricHandle: 64 opaque bytes
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def line(status: str, check: str, detail: str = "") -> None:
    print(f"[r{RANK}] {status:<5} {check}: {detail}", flush=True)


def starting(check: str) -> None:
    line("....", check, "starting")


class Driver:
    """The few CUDA driver API calls needed, through ctypes on libcuda.so.1 (the one torch loaded)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        u64, vp, sz, ci = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        sig = {
            "cuDriverGetVersion": [ctypes.POINTER(ci)],
            "cuDeviceGetCount": [ctypes.POINTER(ci)],
            "cuDeviceGetAttribute": [ctypes.POINTER(ci), ci, ci],
            "cuDeviceGetP2PAttribute": [ctypes.POINTER(ci), ci, ci, ci],
            "cuDeviceGetPCIBusId": [ctypes.c_char_p, ci, ci],
            "cuDeviceGetName": [ctypes.c_char_p, ci, ci],
            "cuCtxGetDevice": [ctypes.POINTER(ci)],
            "cuGetErrorName": [ci, ctypes.POINTER(ctypes.c_char_p)],
            "cuMemAlloc_v2": [ctypes.POINTER(u64), sz],
            "cuMemFree_v2": [u64],
            "cuMemsetD32_v2": [u64, ctypes.c_uint, sz],
            "cuMemcpyDtoH_v2": [vp, u64, sz],
            "cuCtxSynchronize": [],
            "cuIpcGetMemHandle": [ctypes.POINTER(Handle64), u64],
            "cuIpcOpenMemHandle_v2": [ctypes.POINTER(u64), Handle64, ctypes.c_uint],
            "cuIpcCloseMemHandle": [u64],
            "cuMemGetAllocationGranularity": [ctypes.POINTER(sz), ctypes.POINTER(CUmemAllocationProp), ci],
            "cuMemCreate": [ctypes.POINTER(u64), sz, ctypes.POINTER(CUmemAllocationProp), u64],
            "cuMemRelease": [u64],
            "cuMemAddressReserve": [ctypes.POINTER(u64), sz, sz, u64, u64],
            "cuMemAddressFree": [u64, sz],
            "cuMemMap": [u64, sz, sz, u64, u64],
            "cuMemUnmap": [u64, sz],
            "cuMemSetAccess": [u64, sz, ctypes.POINTER(CUmemAccessDesc), sz],
            "cuMemExportToShareableHandle": [vp, u64, ci, u64],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), vp, ci],
        }
        for name, args in sig.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int

    def err(self, rc: int) -> str:
        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({rc})"
        return f"CUresult {rc}"

    def call(self, name: str, *args) -> int:
        return getattr(self.lib, name)(*args)

    def attr(self, attr: str, dev: int) -> int | str:
        v = ctypes.c_int(-1)
        rc = self.lib.cuDeviceGetAttribute(ctypes.byref(v), ATTR[attr], dev)
        return v.value if rc == 0 else f"error {self.err(rc)}"


def allgather_bytes(payload: bytes) -> list[bytes]:
    out: list = [None] * WORLD
    dist.all_gather_object(out, payload)
    return out


def check_env() -> None:
    keys = ["USE_MNNVL", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API",
            "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", "HYBRID_EP_CACHE_DIR", "CUDA_HOME", "CUDA_VISIBLE_DEVICES",
            "TORCH_CUDA_ARCH_LIST", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NCCL_P2P_DISABLE", "NCCL_CUMEM_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS", "NVIDIA_IMEX_CHANNELS"]
    found = " ".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ)
    line("INFO", "env", found or "(none of the HybridEP/NCCL knobs set)")
    mnnvl = os.environ.get("USE_MNNVL")
    if mnnvl is not None and mnnvl.strip().lower() in ("0", "false"):
        line("INFO", "env USE_MNNVL", "0/false: HybridEP's allocator is forced onto cudaMalloc + CUDA IPC handles")
    for k in ("NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API"):
        v = os.environ.get(k)
        if v is not None and (not v.strip().lstrip("-").isdigit() or int(v) <= 0):
            line("FAIL", f"env {k}", f"'{v}' is read with atoi(): 0 divides by zero in the buffer sizing (SIGFPE)")
    v = os.environ.get("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")
    if v is not None and (not v.isdigit() or int(v) <= 0 or WORLD % int(v)):
        line("FAIL", "env NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", f"'{v}' does not divide the group size {WORLD}")
    elif v is not None and int(v) < WORLD:
        line("WARN", "env NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
             f"{v} < {WORLD} ranks: HybridEP treats this as {WORLD // int(v)} nodes, which an intranode build "
             "aborts on (hybrid_ep.cu: 'Inter-node communication is not supported')")
    ld = os.environ.get("LD_LIBRARY_PATH", "")
    compat = [p for p in ld.split(":") if "compat" in p]
    if compat:
        line("WARN", "env LD_LIBRARY_PATH", f"CUDA forward-compat libraries on the path: {compat}")


def check_driver(drv: Driver) -> None:
    v = ctypes.c_int()
    drv.lib.cuDriverGetVersion(ctypes.byref(v))
    umd = f"{v.value // 1000}.{(v.value % 1000) // 10}"
    with open("/proc/self/maps") as maps:
        libcuda = next((row.split()[-1] for row in maps if "libcuda.so" in row), "?")
    kmd = "?"
    try:
        with open("/proc/driver/nvidia/version") as f:
            txt = f.read()
        kmd = txt.split("Kernel Module")[1].split()[0] if "Kernel Module" in txt else txt.splitlines()[0]
    except OSError:
        pass
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    line("INFO", "driver", f"libcuda API {umd} ({libcuda}); kernel module {kmd}; OS kernel {platform.release()}; "
         f"torch {torch.__version__} (CUDA {torch.version.cuda}); NCCL {nccl}")
    if "compat" in libcuda:
        line("WARN", "driver", "libcuda comes from a cuda-compat (forward compatibility) folder: the user-mode "
             "driver is newer than the kernel module; VMM/IPC/fabric behaviour is then the kernel module's")
    if v.value < 13000 and (torch.version.cuda or "").startswith("13"):
        line("FAIL", "driver", f"driver API {umd} is older than torch's CUDA {torch.version.cuda}")


def check_devices(drv: Driver) -> dict:
    n = ctypes.c_int()
    drv.lib.cuDeviceGetCount(ctypes.byref(n))
    cur = ctypes.c_int(-1)
    drv.lib.cuCtxGetDevice(ctypes.byref(cur))
    line("OK" if cur.value == LOCAL_RANK else "WARN", "devices",
         f"{n.value} visible, current {cur.value} (LOCAL_RANK {LOCAL_RANK}), torch sees {torch.cuda.device_count()}")
    facts = {}
    for d in range(n.value):
        name, bus = ctypes.create_string_buffer(128), ctypes.create_string_buffer(32)
        drv.lib.cuDeviceGetName(name, 128, d)
        drv.lib.cuDeviceGetPCIBusId(bus, 32, d)
        a = {k: drv.attr(k, d) for k in ATTR}
        facts[d] = a
        sm = f"sm_{a['COMPUTE_CAPABILITY_MAJOR']}{a['COMPUTE_CAPABILITY_MINOR']}"
        rest = " ".join(f"{k}={a[k]}" for k in ATTR if not k.startswith("COMPUTE"))
        line("INFO", f"device {d}", f"{name.value.decode()} {bus.value.decode()} {sm} {rest}")
    fabric_all = all(f["HANDLE_TYPE_FABRIC_SUPPORTED"] == 1 for f in facts.values())
    line("INFO", "fabric attribute",
         f"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED={'1 on every' if fabric_all else '0 on some'} visible "
         f"GPU: HybridEP {'will try' if fabric_all else 'will not try'} CU_MEM_HANDLE_TYPE_FABRIC "
         "(allocator.cu support_fabric())")
    mc = {d: f["MULTICAST_SUPPORTED"] for d, f in facts.items()}
    line("INFO", "multicast attribute", f"CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED per device {mc} (read only: "
         "HybridEP at 94a9f8f creates no multicast object, and this probe never calls cuMulticastCreate)")
    for d, f in facts.items():
        if f["VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"] != 1:
            line("FAIL", f"device {d}", "no virtual memory management: the fabric path (cuMemCreate/cuMemMap) "
                 "cannot work")
    return facts


def check_p2p(drv: Driver, ndev: int) -> None:
    for a in range(ndev):
        for b in range(ndev):
            if a == b:
                continue
            acc, atom = ctypes.c_int(-1), ctypes.c_int(-1)
            drv.lib.cuDeviceGetP2PAttribute(ctypes.byref(acc), P2P_ACCESS_SUPPORTED, a, b)
            drv.lib.cuDeviceGetP2PAttribute(ctypes.byref(atom), P2P_NATIVE_ATOMIC_SUPPORTED, a, b)
            ok = acc.value == 1 and atom.value == 1
            peer = torch.cuda.can_device_access_peer(a, b)
            line("OK" if ok else "FAIL", f"p2p {a}->{b}",
                 f"access={acc.value} native_atomics={atom.value} torch.can_device_access_peer={peer}"
                 + ("" if ok else " (HybridEP's kernels need both over NVLink)"))


def check_nvml(drv: Driver) -> None:
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        line("SKIP", "nvml", str(e))
        return
    if nv.nvmlInit_v2() != 0:
        line("SKIP", "nvml", "nvmlInit failed")
        return
    buf = ctypes.create_string_buffer(96)
    nv.nvmlSystemGetDriverVersion(buf, 96)
    # NVML numbers physical GPUs: find ours through its PCI bus id.
    pci = ctypes.create_string_buffer(32)
    drv.lib.cuDeviceGetPCIBusId(pci, 32, LOCAL_RANK)
    h = ctypes.c_void_p()
    rc = nv.nvmlDeviceGetHandleByPciBusId_v2(pci.value, ctypes.byref(h))
    if rc != 0:
        line("SKIP", "nvml", f"driver {buf.value.decode()}; no NVML handle for {pci.value.decode()} (rc {rc})")
        return
    active = 0
    for link in range(18):
        st = ctypes.c_int(0)
        if nv.nvmlDeviceGetNvLinkState(h, link, ctypes.byref(st)) == 0 and st.value == 1:
            active += 1

    class FabricInfo(ctypes.Structure):  # nvmlGpuFabricInfo_t
        _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                    ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte)]

    fi = FabricInfo()
    fabric = "n/a"
    if hasattr(nv, "nvmlDeviceGetGpuFabricInfo") and nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(fi)) == 0:
        state = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}.get(fi.state, fi.state)
        fabric = f"state={state} status={fi.status} clique={fi.cliqueId}"
    line("INFO", "nvml", f"driver {buf.value.decode()}; {pci.value.decode()} has {active} active NVLinks; "
         f"GPU fabric {fabric}")


def check_imex() -> None:
    major = None
    try:
        with open("/proc/devices") as f:
            for row in f:
                if "nvidia-caps-imex-channels" in row:
                    major = row.split()[0]
    except OSError:
        pass
    chans = sorted(glob.glob("/dev/nvidia-caps-imex-channels/channel*"))
    usable = [c for c in chans if os.access(c, os.R_OK | os.W_OK)]
    line("INFO", "imex", f"/proc/devices nvidia-caps-imex-channels major={major}; channel files "
         f"{chans or 'none'}; usable {usable or 'none'} (without a usable channel, cuMemCreate(FABRIC) is "
         "refused and HybridEP falls back to CUDA IPC)")


def check_hostnames() -> None:
    names = allgather_bytes(socket.gethostname().encode())
    same = len(set(names)) == 1
    line("OK" if same else "FAIL", "hostnames",
         f"{[n.decode() for n in names]}" + ("" if same else " differ: the IPC path counts only same-hostname ranks "
                                             "as one NVLink domain (allocator.cu is_accessible)"))


def check_ipc(drv: Driver) -> None:
    """cudaMalloc + CUDA IPC, as classic DeepEP and HybridEP's non-fabric path do. Every rank takes
    part in exactly one all-gather and one barrier, whatever fails locally."""
    size = 2 << 20
    ptr, h, mine = ctypes.c_uint64(), Handle64(), b""
    rc = drv.call("cuMemAlloc_v2", ctypes.byref(ptr), size)
    if rc:
        line("FAIL", "ipc alloc", drv.err(rc))
    else:
        drv.call("cuMemsetD32_v2", ptr, 0xA0 + RANK, size // 4)
        drv.call("cuCtxSynchronize")
        rc = drv.call("cuIpcGetMemHandle", ctypes.byref(h), ptr)
        line("OK" if rc == 0 else "FAIL", "ipc get handle", drv.err(rc) if rc else "cuIpcGetMemHandle")
        mine = bytes(h) if rc == 0 else b""
    for peer, hb in enumerate(allgather_bytes(mine)):
        if peer == RANK or not hb:
            continue
        starting(f"ipc open rank {peer}'s handle")
        mapped = ctypes.c_uint64()
        rc = drv.call("cuIpcOpenMemHandle_v2", ctypes.byref(mapped), Handle64.from_buffer_copy(hb),
                      IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        if rc:
            line("FAIL", f"ipc open rank {peer}", drv.err(rc))
            continue
        got = (ctypes.c_uint32 * 4)()
        rc = drv.call("cuMemcpyDtoH_v2", ctypes.cast(got, ctypes.c_void_p), mapped, ctypes.sizeof(got))
        ok = rc == 0 and all(x == 0xA0 + peer for x in got)
        line("OK" if ok else "FAIL", f"ipc read rank {peer}",
             "pattern matches" if ok else drv.err(rc) if rc else str(list(got)))
        drv.call("cuIpcCloseMemHandle", mapped)
    dist.barrier()
    if ptr.value:
        drv.call("cuMemFree_v2", ptr)


def fabric_prop(dev: int) -> CUmemAllocationProp:
    p = CUmemAllocationProp()
    p.type, p.requestedHandleTypes = MEM_ALLOCATION_TYPE_PINNED, MEM_HANDLE_TYPE_FABRIC
    p.location.type, p.location.id = MEM_LOCATION_TYPE_DEVICE, dev
    return p


def access_desc(dev: int) -> CUmemAccessDesc:
    d = CUmemAccessDesc()
    d.location.type, d.location.id, d.flags = MEM_LOCATION_TYPE_DEVICE, dev, MEM_ACCESS_FLAGS_PROT_READWRITE
    return d


def run_steps(drv: Driver, prefix: str, steps) -> bool:
    for name, fn in steps:
        starting(f"{prefix} {name}")
        rc = fn()
        line("OK" if rc == 0 else "FAIL", f"{prefix} {name}", drv.err(rc) if rc else "")
        if rc:
            return False
    return True


def fabric_local(drv: Driver, fabric_attr: bool, res: dict) -> tuple[str, bytes]:
    """This rank's half of HybridEP's fabric path (allocator.cu ExtendedMemoryAllocator() and
    allocate()/get_handle()): returns (path HybridEP picks, exported handle or b"")."""
    mnnvl_off = os.environ.get("USE_MNNVL", "").strip().lower() in ("0", "false")
    if not fabric_attr:
        line("INFO", "fabric", "attribute is 0 on some GPU: HybridEP uses CUDA IPC here")
        return "ipc", b""
    prop = fabric_prop(LOCAL_RANK)
    gran = ctypes.c_size_t()
    rc = drv.call("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop),
                  MEM_ALLOC_GRANULARITY_MINIMUM)
    line("OK" if rc == 0 else "FAIL", "fabric granularity", f"{gran.value} bytes" if rc == 0 else drv.err(rc))
    if rc:
        return "ipc?", b""
    size = res["size"] = max(gran.value, 2 << 20)
    handle = res["handle"] = ctypes.c_uint64()
    starting("fabric cuMemCreate")
    rc = drv.call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(prop), 0)
    if rc:
        why = " (this process has no IMEX channel)" if rc == CUDA_ERROR_NOT_PERMITTED else ""
        line("INFO", "fabric cuMemCreate", f"{drv.err(rc)}{why}: HybridEP's trial cuMemCreate fails the same "
             "way, so it falls back to CUDA IPC")
        res.pop("handle")
        return "ipc", b""
    picked = "ipc" if mnnvl_off else "fabric"
    line("WARN" if picked == "fabric" else "INFO", "fabric cuMemCreate",
         "permitted: HybridEP WILL use fabric handles on this host (classic deep_ep.Buffer does not)"
         if picked == "fabric" else "permitted, but USE_MNNVL=0 keeps HybridEP on CUDA IPC")
    ptr = res["ptr"] = ctypes.c_uint64()
    acc = access_desc(LOCAL_RANK)
    if not run_steps(drv, "fabric", [
            ("cuMemAddressReserve", lambda: drv.call("cuMemAddressReserve", ctypes.byref(ptr), size, gran.value, 0, 0)),
            ("cuMemMap", lambda: drv.call("cuMemMap", ptr, size, 0, handle, 0)),
            ("cuMemSetAccess", lambda: drv.call("cuMemSetAccess", ptr, size, ctypes.byref(acc), 1))]):
        return picked, b""
    res["mapped"] = True
    drv.call("cuMemsetD32_v2", ptr, 0xF0 + RANK, size // 4)
    drv.call("cuCtxSynchronize")
    fh = Handle64()
    starting("fabric cuMemExportToShareableHandle")
    rc = drv.call("cuMemExportToShareableHandle", ctypes.byref(fh), handle, MEM_HANDLE_TYPE_FABRIC, 0)
    line("OK" if rc == 0 else "FAIL", "fabric export", drv.err(rc) if rc else "CUmemFabricHandle exported")
    return picked, bytes(fh) if rc == 0 else b""


def fabric_peer(drv: Driver, peer: int, hb: bytes, size: int) -> None:
    imp, mapped = ctypes.c_uint64(), ctypes.c_uint64()
    starting(f"fabric import rank {peer}'s handle")
    rc = drv.call("cuMemImportFromShareableHandle", ctypes.byref(imp), ctypes.c_char_p(hb), MEM_HANDLE_TYPE_FABRIC)
    line("OK" if rc == 0 else "FAIL", f"fabric import rank {peer}", drv.err(rc) if rc else
         "HybridEP's detect_accessible_ranks counts this peer")
    if rc:
        return
    acc = access_desc(LOCAL_RANK)
    if run_steps(drv, f"fabric peer {peer}", [
            ("cuMemAddressReserve", lambda: drv.call("cuMemAddressReserve", ctypes.byref(mapped), size, 0, 0, 0)),
            ("cuMemMap", lambda: drv.call("cuMemMap", mapped, size, 0, imp, 0)),
            ("cuMemSetAccess", lambda: drv.call("cuMemSetAccess", mapped, size, ctypes.byref(acc), 1))]):
        got = (ctypes.c_uint32 * 4)()
        starting(f"fabric read rank {peer}")
        rc = drv.call("cuMemcpyDtoH_v2", ctypes.cast(got, ctypes.c_void_p), mapped, ctypes.sizeof(got))
        good = rc == 0 and all(x == 0xF0 + peer for x in got)
        line("OK" if good else "FAIL", f"fabric read rank {peer}",
             "pattern matches" if good else drv.err(rc) if rc else str(list(got)))
        drv.call("cuMemUnmap", mapped, size)
    if mapped.value:
        drv.call("cuMemAddressFree", mapped, size)
    drv.call("cuMemRelease", imp)


def check_fabric(drv: Driver, fabric_attr: bool) -> str:
    """HybridEP's fabric path step by step; returns the handle path HybridEP would pick on this rank.
    Every rank takes part in exactly one all-gather and one barrier."""
    res: dict = {}
    picked, mine = fabric_local(drv, fabric_attr, res)
    for peer, hb in enumerate(allgather_bytes(mine)):
        if peer != RANK and hb:
            fabric_peer(drv, peer, hb, res.get("size", 2 << 20))
    dist.barrier()
    if res.get("mapped"):
        drv.call("cuMemUnmap", res["ptr"], res["size"])
    if res.get("ptr") is not None and res["ptr"].value:
        drv.call("cuMemAddressFree", res["ptr"], res["size"])
    if "handle" in res:
        drv.call("cuMemRelease", res["handle"])
    return picked


def check_deep_ep_install() -> None:
    try:
        import deep_ep  # noqa: F401
        import hybrid_ep_cpp
    except Exception as e:  # noqa: BLE001
        line("SKIP", "deep_ep", f"not importable: {e}")
        return
    base = os.path.dirname(deep_ep.__file__)
    line("INFO", "deep_ep", f"{base}; hybrid_ep_cpp {hybrid_ep_cpp.__file__}")
    cuda_home = os.environ.get("CUDA_HOME", "")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    line("OK" if os.access(nvcc, os.X_OK) else "WARN", "hybridep jit nvcc",
         f"{nvcc} {'found' if os.access(nvcc, os.X_OK) else 'missing: the first dispatch cannot JIT-compile'}")
    # compiler.cu get_jit_dir(): $HYBRID_EP_CACHE_DIR, else the passwd home (not $HOME), else /tmp.
    cache = os.environ.get("HYBRID_EP_CACHE_DIR") or pwd.getpwuid(os.getuid()).pw_dir or "/tmp"
    ok = os.access(cache, os.W_OK)
    line("OK" if ok else "WARN", "hybridep jit cache dir", f"{cache}/.deepep/hybrid_ep/jit: "
         + ("writable" if ok else "not writable: the buffer constructor throws (create_directories)"))


def run_deep_ep_allocator() -> None:
    import hybrid_ep_cpp
    starting("deep_ep ExtendedMemoryAllocator()")
    alloc = hybrid_ep_cpp.ExtendedMemoryAllocator()
    starting("deep_ep detect_accessible_ranks")
    n = alloc.detect_accessible_ranks(dist.group.WORLD)
    line("OK" if n == WORLD else "WARN", "deep_ep detect_accessible_ranks",
         f"{n} of {WORLD} ranks in this NVLink domain" + ("" if n == WORLD else
         " - HybridEP will treat the group as several nodes (an intranode build aborts)"))
    del alloc


def create_buffer() -> None:
    import deep_ep
    starting("deep_ep.HybridEPBuffer(hidden 1024, 512 tokens/rank, 4 local experts)")
    buf = deep_ep.HybridEPBuffer(group=dist.group.WORLD, hidden_dim=1024, max_num_of_tokens_per_rank=512,
                                 num_local_experts=4)
    torch.cuda.synchronize()
    line("OK", "deep_ep.HybridEPBuffer", f"created ({os.environ.get('USE_MNNVL', 'USE_MNNVL unset')})")
    del buf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-fabric", action="store_true")
    ap.add_argument("--deep-ep", action="store_true")
    ap.add_argument("--create-buffer", action="store_true")
    args = ap.parse_args()
    faulthandler.enable(all_threads=False)
    torch.cuda.set_device(LOCAL_RANK)
    torch.zeros(1, device="cuda")  # makes torch's primary context current on this thread
    dist.init_process_group("nccl", device_id=torch.device("cuda", LOCAL_RANK))
    drv = Driver()
    check_env()
    check_driver(drv)
    facts = check_devices(drv)
    check_p2p(drv, len(facts))
    check_nvml(drv)
    check_imex()
    check_hostnames()
    check_deep_ep_install()
    check_ipc(drv)
    fabric_attr = all(f["HANDLE_TYPE_FABRIC_SUPPORTED"] == 1 for f in facts.values())
    if args.skip_fabric:
        line("SKIP", "fabric", "--skip-fabric")
        picked = "fabric?" if fabric_attr else "ipc"
    else:
        picked = check_fabric(drv, fabric_attr)
    paths = [p.decode() for p in allgather_bytes(picked.encode())]
    if RANK == 0:
        same = len(set(paths)) == 1
        note = "" if same else " - the ranks disagree, so they cannot open each other's handles"
        if any(p.startswith("fabric") for p in paths):
            note += (". Classic deep_ep.Buffer never takes the fabric path (use_fabric=False): if the buffer "
                     "crashes with this path and not with USE_MNNVL=0, the fabric path is the cause")
        line("OK" if same else "FAIL", "verdict", f"HybridEP handle path per rank {paths}{note}")
    dist.barrier()
    if args.deep_ep or args.create_buffer:
        run_deep_ep_allocator()
        dist.barrier()
    if args.create_buffer:
        create_buffer()
        dist.barrier()
    line("OK", "done", "all checks ran")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
