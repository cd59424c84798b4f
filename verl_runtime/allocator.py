"""The C allocator's settings for a process that trains on the CPU."""

import ctypes
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # the largest threshold glibc accepts on 64-bit machines
KEEP_ALL = 2**31 - 1  # a trim threshold that is never reached


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a training step frees, for the next step; True where it applied.

    By default it hands the top of its heap back to the kernel whenever enough of it is free, so each step's
    activations come back as fresh pages, every one a page fault: about 2,500 per update on the CPU preset, 2-3 ms of
    its 37. Blocks up to 32 MB then stay in the heap and the heap is never trimmed: the process keeps its peak
    memory, which the next step needs again anyway. A no-op with another C library.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and libc.mallopt(M_TRIM_THRESHOLD, KEEP_ALL))
