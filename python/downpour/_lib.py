"""_lib: libdownpour.so through ctypes — finding the library, and downpour.h's
structs and prototypes mirrored field for field (worker/lib/downpour.h is the
reference; API version 1).

Which file is loaded, first found:
  1. $DOWNPOUR_LIB, a path to the library file;
  2. libdownpour.so.1 beside this package (what `make` leaves in
     build/python/downpour, so PYTHONPATH=build/python uses that build's);
  3. the library `make install` put in the libdir it recorded (_install.py);
  4. libdownpour.so.1 on the loader's path (make deb: /usr/lib/<triplet>).
"""
import ctypes
import os

API_VERSION = 1
SONAME = "libdownpour.so.1"
NAME_LEN = 96
MAX_DIMS = 8
STATS_BINS = 1024

_c_int64_p = ctypes.POINTER(ctypes.c_int64)


class Opts(ctypes.Structure):
    _fields_ = [("api", ctypes.c_int), ("endpoints", ctypes.c_char_p),
                ("task_index", ctypes.c_int), ("timeout_s", ctypes.c_double),
                ("curve_secret", ctypes.c_char_p), ("curve_server", ctypes.c_char_p),
                ("wire", ctypes.c_char_p), ("transport", ctypes.c_char_p)]


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("ndim", ctypes.c_int), ("shape", _c_int64_p),
                ("trainable", ctypes.c_int)]


class Info(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_int), ("num_workers", ctypes.c_int),
                ("replicas", ctypes.c_int), ("staleness", ctypes.c_int),
                ("num_shards", ctypes.c_int), ("task_index", ctypes.c_int),
                ("resume_step", ctypes.c_uint64), ("local_steps", ctypes.c_long)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * NAME_LEN), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("offset", ctypes.c_size_t),
                ("count", ctypes.c_size_t), ("trainable", ctypes.c_int)]


class PushResult(ctypes.Structure):
    _fields_ = [("applied", ctypes.c_int), ("dropped", ctypes.c_int), ("rejected", ctypes.c_int),
                ("staleness_max", ctypes.c_uint64), ("staleness_mean", ctypes.c_double),
                ("version", ctypes.c_uint64), ("reason", ctypes.c_char * 160)]


class Stats(ctypes.Structure):
    _fields_ = [("applied", ctypes.c_uint64), ("dropped", ctypes.c_uint64),
                ("rejected", ctypes.c_uint64), ("version", ctypes.c_uint64),
                ("staleness_mean", ctypes.c_double), ("staleness_max", ctypes.c_uint64),
                ("staleness_hist", ctypes.c_uint64 * STATS_BINS), ("staleness_bins", ctypes.c_int)]


class EpochSamples(ctypes.Structure):
    _fields_ = [("epoch", ctypes.c_uint64), ("trained", ctypes.c_uint64), ("repeated", ctypes.c_uint64),
                ("retrained_after_death", ctypes.c_uint64), ("batches", ctypes.c_uint64)]


def find():
    """The path (or soname) of the library this package loads."""
    env = os.environ.get("DOWNPOUR_LIB")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), SONAME)
    if os.path.exists(here):
        return here
    try:
        from . import _install  # written by make install
        p = os.path.join(_install.LIBDIR, SONAME)
        if os.path.exists(p):
            return p
    except ImportError:
        pass
    return SONAME


class Dealt(ctypes.Structure):
    _fields_ = [("end", ctypes.c_int), ("step", ctypes.c_uint64), ("epoch", ctypes.c_uint64),
                ("index", ctypes.c_uint64)]


def _declare(lib):
    h = ctypes.c_void_p
    sigs = {
        "downpour_version": (ctypes.c_char_p, []),
        "downpour_api_version": (ctypes.c_int, []),
        "downpour_last_error": (ctypes.c_char_p, []),
        "downpour_last_error_code": (ctypes.c_int, []),
        "downpour_opts_init": (None, [ctypes.POINTER(Opts)]),
        "downpour_connect_table": (ctypes.c_int, [ctypes.POINTER(h), ctypes.POINTER(Tensor),
                                                  ctypes.c_int, ctypes.POINTER(Opts)]),
        "downpour_connect_table_rows": (ctypes.c_int, [ctypes.POINTER(h), ctypes.POINTER(Tensor),
                                                       ctypes.c_int, ctypes.c_int,
                                                       ctypes.POINTER(Opts)]),
        "downpour_rows_width": (ctypes.c_int, [h]),
        "downpour_rows_pull": (ctypes.c_int, [h, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
        "downpour_rows_push": (ctypes.c_int, [h, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                              ctypes.c_uint64, ctypes.POINTER(PushResult)]),
        "downpour_connect_spec": (ctypes.c_int, [ctypes.POINTER(h), ctypes.c_char_p, ctypes.c_int,
                                                 ctypes.c_int, ctypes.c_int, ctypes.POINTER(Opts)]),
        "downpour_info": (ctypes.c_int, [h, ctypes.POINTER(Info)]),
        "downpour_mode_name": (ctypes.c_char_p, [ctypes.c_int]),
        "downpour_num_floats": (ctypes.c_size_t, [h]),
        "downpour_num_tensors": (ctypes.c_int, [h]),
        "downpour_tensor": (ctypes.c_int, [h, ctypes.c_int, ctypes.POINTER(TensorInfo)]),
        "downpour_pull": (ctypes.c_int, [h, ctypes.c_void_p]),
        "downpour_pull_tensors": (ctypes.c_int, [h, ctypes.POINTER(ctypes.c_void_p)]),
        "downpour_version_pulled": (ctypes.c_uint64, [h]),
        "downpour_push": (ctypes.c_int, [h, ctypes.c_void_p, ctypes.c_float, ctypes.c_int,
                                         ctypes.c_uint64, ctypes.POINTER(PushResult)]),
        "downpour_local_auto": (ctypes.c_int, [h]),
        "downpour_round_steps": (ctypes.c_long, [h]),
        "downpour_push_round": (ctypes.c_int, [h, ctypes.c_uint32, ctypes.c_double]),
        "downpour_deal_plan": (ctypes.c_int, [h, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                                              ctypes.c_uint64]),
        "downpour_dealt": (ctypes.c_int, [h, ctypes.POINTER(Dealt)]),
        "downpour_deal_indices": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                                                 ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p]),
        "downpour_deal_permutation": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_uint64,
                                                     ctypes.c_uint64, ctypes.c_void_p]),
        "downpour_updates_lost": (ctypes.c_uint64, [h]),
        "downpour_set_compress": (ctypes.c_int, [h, ctypes.c_char_p, ctypes.c_char_p]),
        "downpour_stats": (ctypes.c_int, [h, ctypes.POINTER(Stats)]),
        "downpour_epoch_samples": (ctypes.c_int, [h, ctypes.POINTER(EpochSamples), ctypes.c_size_t,
                                                  ctypes.POINTER(ctypes.c_size_t)]),
        "downpour_finish": (ctypes.c_int, [h]),
        "downpour_leave": (ctypes.c_int, [h]),
        "downpour_wait_all": (ctypes.c_int, [h, ctypes.c_double]),
        "downpour_shutdown": (ctypes.c_int, [h]),
        "downpour_interrupt": (None, [h]),
        "downpour_interrupt_clear": (None, [h]),
        "downpour_close": (None, [h]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


_LIB = None


def load():
    """The loaded library (once per process); OSError naming the file tried."""
    global _LIB
    if _LIB is None:
        path = find()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(f"downpour: cannot load the client library {path}: {e} (set "
                          f"DOWNPOUR_LIB=FILE, or build it with make)") from None
        _declare(lib)
        if lib.downpour_api_version() != API_VERSION:
            raise OSError(f"downpour: {path} has API version {lib.downpour_api_version()}, this "
                          f"package speaks version {API_VERSION}")
        _LIB = lib
    return _LIB
