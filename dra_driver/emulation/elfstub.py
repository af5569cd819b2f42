"""Tiny real ELF shared objects for the emulated driver's libraries.

A container prepared on an emulated node must meet the same loader as on a GPU
node: ``ldconfig`` reads each library's ``DT_SONAME`` to build the ld cache and
make the SONAME links, and ``dlopen("libcuda.so.1")`` maps the file and looks
symbols up. Empty placeholder files pass neither, so the emulated driver's
libraries are the smallest shared objects both accept: an ELF header, a text
segment (symbol table, SysV hash, string table, code), a writable segment with
the dynamic section (the loader relocates its pointers in place), and a
non-executable stack note (without it glibc makes the stack executable for the
library, which hardened loaders refuse). Each exported function stores a fixed
``int`` through its first argument and returns 0, the shape of
``cuDriverGetVersion(int *version)``: a program can tell which copy it loaded
(the host driver's or an image's CUDA forward-compatibility copy).

x86-64 and AArch64 only: the machines this project runs on.
"""

from __future__ import annotations

import platform
import struct

_PAGE = 0x10000
"""Segment alignment: a multiple of every page size in use (4 KiB to 64 KiB)."""
_MACHINES = {"x86_64": 62, "aarch64": 183}
_PT_LOAD, _PT_DYNAMIC, _PT_GNU_STACK = 1, 2, 0x6474E551
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT, _DT_SONAME = (
    0, 4, 5, 6, 10, 11, 14,
)  # fmt: skip
_SYM = struct.Struct("<IBBHQQ")
_PHDR = struct.Struct("<IIQQQQQQ")


def _store_int(machine: str, value: int) -> bytes:
    """``*(int *)arg0 = value; return 0;`` in the machine's instructions."""
    if machine == "x86_64":  # mov dword [rdi], imm32; xor eax, eax; ret
        return b"\xc7\x07" + struct.pack("<i", value) + b"\x31\xc0\xc3"
    lo, hi = value & 0xFFFF, (value >> 16) & 0xFFFF
    words = (
        0x52800001 | lo << 5,  # movz w1, #lo
        0x72A00001 | hi << 5,  # movk w1, #hi, lsl #16
        0xB9000001,  # str w1, [x0]
        0x52800000,  # mov w0, #0
        0xD65F03C0,  # ret
    )
    return struct.pack("<5I", *words)


def _sysv_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = (h << 4) + c
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def _align(n: int, to: int) -> int:
    return (n + to - 1) & ~(to - 1)


def shared_object(soname: str, functions: dict[str, int], machine: str | None = None) -> bytes:
    """The bytes of a shared object named ``soname`` exporting ``functions``
    (name -> the ``int`` each stores through its first argument)."""
    machine = machine or platform.machine()
    if machine not in _MACHINES:
        raise ValueError(f"no ELF stubs for {machine!r}; known: {sorted(_MACHINES)}")
    names = sorted(functions)
    strtab = bytearray(b"\0" + soname.encode() + b"\0")
    name_at = {}
    for name in names:
        name_at[name] = len(strtab)
        strtab += name.encode() + b"\0"
    nsyms, nbucket = 1 + len(names), max(1, len(names))

    phnum = 4
    symtab_at = 64 + _PHDR.size * phnum
    strtab_at = symtab_at + _SYM.size * nsyms
    hash_at = _align(strtab_at + len(strtab), 8)
    code_at = _align(hash_at + 4 * (2 + nbucket + nsyms), 16)
    code = bytearray()
    func_at = {}
    for name in names:
        func_at[name] = code_at + len(code)
        code += _store_int(machine, functions[name]).ljust(32, b"\0")
    text_end = code_at + len(code)
    dyn_at = _align(text_end, 16)
    dyn_vaddr = dyn_at + _PAGE  # same offset within a page, one page further on
    dynamic = b"".join(
        struct.pack("<qQ", tag, value)
        for tag, value in (
            (_DT_SONAME, 1), (_DT_HASH, hash_at), (_DT_STRTAB, strtab_at),
            (_DT_SYMTAB, symtab_at), (_DT_STRSZ, len(strtab)), (_DT_SYMENT, _SYM.size),
            (_DT_NULL, 0),
        )
    )  # fmt: skip

    symtab = bytearray(_SYM.pack(0, 0, 0, 0, 0, 0))
    for name in names:  # STB_GLOBAL | STT_FUNC, defined (any section index but 0)
        symtab += _SYM.pack(name_at[name], 0x12, 0, 1, func_at[name], 32)
    buckets, chains = [0] * nbucket, [0] * nsyms
    for index, name in enumerate(names, start=1):
        bucket = _sysv_hash(name.encode()) % nbucket
        chains[index], buckets[bucket] = buckets[bucket], index
    hashtab = struct.pack(f"<{2 + nbucket + nsyms}I", nbucket, nsyms, *buckets, *chains)

    header = (
        b"\x7fELF\x02\x01\x01"
        + bytes(9)
        + struct.pack(
            "<HHIQQQIHHHHHH", 3, _MACHINES[machine], 1, 0, 64, 0, 0, 64, _PHDR.size, phnum, 64, 0, 0
        )
    )  # ET_DYN, no section headers (neither ldconfig nor the loader reads them)
    phdrs = (
        _PHDR.pack(_PT_LOAD, 5, 0, 0, 0, text_end, text_end, _PAGE)  # r-x
        + _PHDR.pack(_PT_LOAD, 6, dyn_at, dyn_vaddr, dyn_vaddr, len(dynamic), len(dynamic), _PAGE)
        + _PHDR.pack(_PT_DYNAMIC, 6, dyn_at, dyn_vaddr, dyn_vaddr, len(dynamic), len(dynamic), 8)
        + _PHDR.pack(_PT_GNU_STACK, 6, 0, 0, 0, 0, 0, 16)  # rw-: no executable stack
    )
    out = bytearray(dyn_at + len(dynamic))
    for at, part in (
        (0, header), (64, phdrs), (symtab_at, symtab), (strtab_at, strtab),
        (hash_at, hashtab), (code_at, code), (dyn_at, dynamic),
    ):  # fmt: skip
        out[at : at + len(part)] = part
    return bytes(out)
