"""ctypes plumbing for llama.cpp's eval callback: read named graph tensors while a batch is computed.

1. ``ggml_lib()`` loads ``libggml-base.so`` from the installed ``llama_cpp/lib`` folder once and declares
   ``ggml_get_name``, ``ggml_nbytes`` and ``ggml_backend_tensor_get``.
2. ``Capture`` is the ``ggml_backend_sched_eval_callback``. The scheduler calls it with ``ask=True`` for every
   graph node; it answers True only for wanted names (``l_out-K``, ``kq_soft_max-L``), so the graph is split only
   there. After such a node is computed it is called again with ``ask=False``: the tensor header
   (``type``, ``ne[4]``, ``nb[4]``, the first fields of ``struct ggml_tensor``) gives the shape, the F32 data is
   copied out with ``ggml_backend_tensor_get`` (works for CPU and GPU buffers) into a numpy array of shape
   ``(ne3, ne2, ne1, ne0)``, and the wanted name's reducer turns it into what is kept (e.g. the tap rows).
3. The callback fires once per ubatch, so the kept pieces are lists, concatenated by the caller. A name that
   one graph gives to several nodes (``Qcur-L``/``Kcur-L``: the projection, its reshape, then the tensor after
   the Q/K norm and RoPE) is named in ``want(..., last=...)``: each occurrence replaces the previous raw copy, and
   ``finish()`` (after ``llama_decode``) applies the reducer to the last one only -- the one attention uses.
4. An exception
   inside the callback is recorded (never raised through C) and the computation continues; the caller checks
   ``Capture.error`` after ``llama_decode``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

import numpy as np

GGML_TYPE_F32 = 0


class TensorHead(ctypes.Structure):
    """Leading fields of ``struct ggml_tensor`` (ggml.h): stable across ggml versions."""
    _fields_ = [("type", ctypes.c_int32), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4)]


_LIB: ctypes.CDLL | None = None


def ggml_lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        import llama_cpp
        libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        names = sorted(n for n in os.listdir(libdir) if n.startswith("libggml-base"))
        if not names:
            raise OSError(f"libggml-base not found in {libdir}")
        lib = ctypes.CDLL(os.path.join(libdir, names[0]))
        lib.ggml_get_name.argtypes = [ctypes.c_void_p]
        lib.ggml_get_name.restype = ctypes.c_char_p
        lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
        lib.ggml_nbytes.restype = ctypes.c_size_t
        lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.c_size_t]
        lib.ggml_backend_tensor_get.restype = None
        _LIB = lib
    return _LIB


Reducer = Callable[[np.ndarray], np.ndarray]


class Capture:
    """Eval callback that copies out wanted tensors; set ``wanted`` before each ``llama_decode``."""

    def __init__(self) -> None:
        self.lib = ggml_lib()
        self.wanted: dict[bytes, Reducer] = {}
        self.last: set[bytes] = set()
        self.got: dict[str, list[np.ndarray]] = {}
        self.error: str | None = None
        self.calls = 0
        from llama_cpp import ggml_backend_sched_eval_callback
        self.c_callback = ggml_backend_sched_eval_callback(self._callback)  # keep a reference

    def want(self, reducers: dict[str, Reducer], last: set[str] | frozenset[str] = frozenset()) -> None:
        """``last``: names whose reducer sees only their last occurrence in the graph (see step 3)."""
        self.wanted = {k.encode(): f for k, f in reducers.items()}
        self.last = {k.encode() for k in last}
        self.got = {k: [] for k in reducers}
        self.error = None

    def finish(self) -> None:
        """Apply the reducers of the ``last`` names to their last occurrence (call after ``llama_decode``)."""
        for name in self.last:
            parts = self.got.get(name.decode())
            if parts and self.error is None:
                try:
                    parts[:] = [self.wanted[name](parts[-1])]
                except Exception as e:  # noqa: BLE001
                    self.error = f"{type(e).__name__}: {e}"

    def clear(self) -> None:
        self.wanted = {}
        self.last = set()

    def _callback(self, t: int, ask: bool, _ud: int) -> bool:
        try:
            if not self.wanted:
                return not ask
            name = self.lib.ggml_get_name(t)
            if ask:
                return name in self.wanted
            fn = self.wanted.get(name)
            if fn is None:
                return True
            self.calls += 1
            head = TensorHead.from_address(t)
            if head.type != GGML_TYPE_F32:
                raise TypeError(f"{name.decode()} has ggml type {head.type}, expected F32")
            ne = [int(head.ne[i]) for i in range(4)]
            if int(head.nb[0]) != 4 or int(head.nb[1]) != 4 * ne[0]:
                raise ValueError(f"{name.decode()} is not contiguous")
            arr = np.empty((ne[3], ne[2], ne[1], ne[0]), dtype=np.float32)
            nbytes = int(self.lib.ggml_nbytes(t))
            if nbytes != arr.nbytes:
                raise ValueError(f"{name.decode()}: {nbytes} bytes for shape {ne}")
            self.lib.ggml_backend_tensor_get(t, arr.ctypes.data, 0, nbytes)
            if name in self.last:
                self.got[name.decode()][:] = [arr]
            else:
                self.got[name.decode()].append(fn(arr))
            return True
        except Exception as e:  # noqa: BLE001 -- never raise through C
            self.error = f"{type(e).__name__}: {e}"
            return True
