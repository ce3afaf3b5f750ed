"""Inductor's CPU vector instruction set, taken from the CPU's flags.

Before it compiles or loads CPU kernels, torch's Inductor checks each vector instruction
set the CPU's flags name by building and running a test program with the C++ compiler:
about 1 s in every worker that loads precompiled graphs (measured, a small CNN on this
2-core machine) and about 5 s in one loading an AOTInductor package, though nothing is
compiled. Ferry trusts the flags instead. Inductor keeps the answer for the process, so
everything the worker compiles later agrees with what it loaded; the first worker
compiles under the same answer, so the kernels it caches match. (The test programs guard
against a C++ compiler older than the CPU; the compiler Ferry's workers use compiles
every set the flags name, or the first compile fails with its error, and the model is
compiled the ordinary way.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def vector_isa_from_cpu_flags() -> Iterator[None]:
    from torch._inductor import config

    with config.patch({"cpp.vec_isa_ok": True}):
        yield
