"""A CUDA client for the real-GPU tier, through the driver API (``libcuda.so.1``) by
ctypes, so it needs no CUDA toolkit and behaves as any MPS client would.

It opens a context on device 0 and prints one JSON line: ``init``/``ctx`` (CUDA
result codes), the multiprocessor count the context sees, and free/total memory.
Then it reads commands from stdin, one per line, answering each with a JSON line:
``alloc <GiB>`` (keeps the allocation; ``rc`` 0 or a CUDA error such as 2, out of
memory) and ``quit``. Run as ``python cudaclient.py``; the environment
(``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_*`` limits) says which MPS daemon it uses.
"""

from __future__ import annotations

import ctypes
import json
import sys

GIB = 1 << 30
MULTIPROCESSOR_COUNT = 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT


def main() -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    hello: dict[str, object] = {"init": cuda.cuInit(0)}
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    if hello["init"] == 0:
        rc = cuda.cuDeviceGet(ctypes.byref(dev), 0)
        hello["ctx"] = rc or cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    if hello.get("ctx") == 0:
        sms = ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(sms), MULTIPROCESSOR_COUNT, dev)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        hello.update(sms=sms.value, free_mib=free.value >> 20, total_mib=total.value >> 20)
    print(json.dumps(hello), flush=True)
    if hello.get("ctx") != 0:
        return 1
    held_gib = 0.0
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "quit":
            break
        if cmd == "alloc":
            gib = float(args[0])
            ptr = ctypes.c_uint64()
            rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), int(gib * GIB))
            held_gib += gib if rc == 0 else 0
            print(json.dumps({"alloc_gib": gib, "rc": rc, "held_gib": held_gib}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
