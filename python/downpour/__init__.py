"""downpour: a worker of Downpour's parameter servers (downpour-ps) from Python.

Standard library and NumPy only, over libdownpour.so (ctypes): the C
worker's own client, so HELLO, the model check, heartbeats, restarts of a
shard, repeats (a push's step is applied once), CURVE, shared memory and
the bf16 wire behave as for downpour-worker. PyTorch: downpour.torch.

    import numpy as np, downpour
    table = [("w", (10, 784), True), ("b", (10,), True)]
    with downpour.Client(table, ps=["tcp://127.0.0.1:5555"], task_index=0) as c:
        for step in range(100):
            w = c.pull()                     # {"w": array, "b": array}
            grads = my_gradients(w)          # a dict of arrays, or one flat array
            r = c.push(grads, loss=0.3, batch=32)
            print(r.staleness, r.version)
        c.finish()

Client(table, ps=None, task_index=None, **options)
    table: a list of (name, shape, trainable) in the servers' order (the
    order of an --init file: downpour.safetensors.table(path) reads it);
    Client.from_init(path, ...) and Client.from_spec(spec, input, ...) make
    one for servers started with --init FILE or --model SPEC. ps: the
    endpoints in shard order ("tcp://h:p" strings, or one comma string);
    None: TF_CONFIG's ps job (what `downpour launch` sets). task_index:
    None takes TF_CONFIG's task, or 0 with ps given. Options: timeout (s, 30),
    curve_secret and curve_server (key files; default $DOWNPOUR_CURVE_SECRET
    and $DOWNPOUR_CURVE_SERVER, as downpour launch --curve sets them), wire ("fp32" | "bf16"),
    transport ("auto" | "shm" | "zmq"), compress ("none" | "topk:F" | "sign") and
    error_feedback ("on" | "off"), as downpour-worker's --compress and --error-feedback
    (with the servers' --local-steps, the pseudo-gradient is what is compressed).
  .tensors        [TensorInfo(name, shape, offset, count, trainable)]
  .info           Info(mode, workers, replicas, staleness, shards, task_index, resume_step,
                  local_steps)
  .num_floats     floats of the flat vector (tensors in table order)
  .step           the last step pushed (starts at info.resume_step)
  .pull(out=None) the weights: a dict name -> float32 array (new, or out's
                  arrays filled in place), or into a flat float32 array out
  .push(grads, loss=0.0, batch=0, step=None)
                  grads: a dict name -> array (trainable tensors: their
                  gradient; state tensors: their current value) or the flat
                  vector; step: .step + 1 by default. Returns a PushResult
                  (applied, dropped, rejected, staleness, staleness_max,
                  version, reason). A push the servers refuse raises Rejected
                  naming the tensor with a non-finite value.
  .deal_plan(samples, batch, epochs=1, steps=0, seed=0)
                  an elastic crew's batches dealt by shard 0: every pull then
                  is dealt the batch of the next push step, and .dealt() gives
                  its dataset indices (None: all trained)
  .stats() (the chief), .finish(), .wait_all(timeout), .shutdown() (the
  chief), .close(); a context manager (close on exit; after Ctrl-C, .leave():
  finish, then close).

Ctrl-C: a SIGINT during any blocking call (a sync pull the servers hold,
wait_all, ...) raises KeyboardInterrupt within about 0.1 s, however long the
call's timeout (downpour._sigint says how); `with Client(...)` or
`with downpour.torch.Worker(...)` then finishes this worker at the servers,
so sync and ssp go on without it, and closes. SIGTERM (a launcher's or
`downpour scale`'s leave), when the program keeps its default, raises
downpour.Terminated (a SystemExit of status 143) the same way: the worker
leaves its crew whole and exits 143.

Errors: every failure raises downpour.Error (its .code: "timeout",
"deferred", "interrupted", "refused", "args", "other", "model_mismatch");
ModelMismatch when the servers hold another model (.code "model_mismatch"),
ShapeError for an array of the wrong shape, Rejected for a refused push;
each names the tensor when one is at fault.
"""
import collections
import ctypes
import os
import sys

import numpy as np

from . import _lib
from . import _sigint
from ._sigint import Terminated  # SIGTERM, as KeyboardInterrupt is SIGINT
from . import safetensors

__all__ = ["Client", "Error", "ModelMismatch", "ShapeError", "Rejected", "TensorInfo", "Info",
           "PushResult", "safetensors", "library_path"]

_CODES = {0: "ok", 1: "timeout", 2: "deferred", 3: "interrupted", 4: "refused", 5: "args",
          6: "other", 7: "model_mismatch"}


class Error(Exception):
    """A failed call; .code says what kind of failure it was."""

    def __init__(self, msg, code="other", tensor=None):
        super().__init__(msg)
        self.code = code
        self.tensor = tensor


class ModelMismatch(Error):
    """The servers hold another model (table or spec) than this worker's."""


class ShapeError(Error, ValueError):
    """An array whose shape (or dtype) is not its tensor's."""


class Rejected(Error):
    """The servers refused a push (a non-finite value, ...); .tensor names it."""


TensorInfo = collections.namedtuple("TensorInfo", "name shape offset count trainable")
Info = collections.namedtuple("Info", "mode workers replicas staleness shards task_index resume_step "
                              "local_steps")
PushResult = collections.namedtuple(
    "PushResult", "applied dropped rejected staleness staleness_max version reason")


def library_path():
    """The library file this package loads (see downpour._lib)."""
    return _lib.find()


def _raise_last(lib, prefix=""):
    msg = lib.downpour_last_error().decode("utf-8", "replace")
    code = _CODES.get(lib.downpour_last_error_code(), "other")
    cls = ModelMismatch if code == "model_mismatch" else Error
    raise cls(prefix + msg, code)


def _b(s):
    return None if s is None else str(s).encode()


def _endpoints(ps):
    if ps is None:
        return None
    if isinstance(ps, str):
        return ps
    return ",".join(ps)


def _opts(lib, ps, task_index, timeout=30.0, curve_secret=None, curve_server=None, wire=None,
          transport=None):
    o = _lib.Opts()
    lib.downpour_opts_init(ctypes.byref(o))
    o.endpoints = _b(_endpoints(ps))
    o.task_index = -1 if task_index is None else int(task_index)
    o.timeout_s = float(timeout)
    # downpour launch --curve hands each worker its keys this way
    o.curve_secret = _b(curve_secret or os.environ.get("DOWNPOUR_CURVE_SECRET"))
    o.curve_server = _b(curve_server or os.environ.get("DOWNPOUR_CURVE_SERVER"))
    o.wire = _b(wire)
    o.transport = _b(transport)
    return o


class Client:
    """One worker of the servers, on NumPy arrays (see the module's help)."""

    def __init__(self, table, ps=None, task_index=None, *, _spec=None, **options):
        self._lib = lib = _lib.load()
        self._h = None
        if ps is None and "DOWNPOUR_LAUNCH_INIT" in os.environ and "TF_CONFIG" not in os.environ:
            raise Error("downpour launch started this worker to write the model, which "
                        "downpour.torch.Worker(module) does; with a NumPy client give downpour "
                        "launch --init FILE or --model SPEC", "args")
        compress = options.pop("compress", None), options.pop("error_feedback", None)
        rows = int(options.pop("rows", 0))  # a row table's width beside the table
        o = _opts(lib, ps, task_index, **options)
        h = ctypes.c_void_p()
        if _spec is not None:
            spec, (c, hh, w) = _spec
            rc = lib.downpour_connect_spec(ctypes.byref(h), _b(spec), c, hh, w, ctypes.byref(o))
        else:
            table = [(str(n), tuple(int(d) for d in s), bool(t)) for n, s, t in table]
            arr = (_lib.Tensor * len(table))()
            keep = []  # the shapes' buffers live until the call returns
            for i, (name, shape, trainable) in enumerate(table):
                sh = (ctypes.c_int64 * max(1, len(shape)))(*shape)
                keep.append(sh)
                arr[i] = _lib.Tensor(name.encode(), len(shape),
                                     ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64)),
                                     1 if trainable else 0)
            rc = lib.downpour_connect_table_rows(ctypes.byref(h), arr, len(table), rows,
                                                 ctypes.byref(o))
        if rc != 0:
            _raise_last(lib)
        self._h = h
        if compress != (None, None) and lib.downpour_set_compress(h, _b(compress[0]), _b(compress[1])) != 0:
            try:
                _raise_last(lib)
            finally:  # not registered yet: closed here
                lib.downpour_close(h)
                self._h = None
        self.tensors = []
        ti = _lib.TensorInfo()
        for i in range(lib.downpour_num_tensors(h)):
            lib.downpour_tensor(h, i, ctypes.byref(ti))
            self.tensors.append(TensorInfo(ti.name.decode(), tuple(ti.shape[:ti.ndim]),
                                           ti.offset, ti.count, bool(ti.trainable)))
        self.index = {t.name: i for i, t in enumerate(self.tensors)}
        self.num_floats = lib.downpour_num_floats(h)
        self.rows_width = lib.downpour_rows_width(h)  # D of the row table; 0: none
        inf = _lib.Info()
        lib.downpour_info(h, ctypes.byref(inf))
        self.info = Info(lib.downpour_mode_name(inf.mode).decode(), inf.num_workers,
                         inf.replicas, inf.staleness, inf.num_shards, inf.task_index,
                         inf.resume_step, inf.local_steps)
        self.step = inf.resume_step
        self.local_auto = bool(lib.downpour_local_auto(h))  # the servers' --local-steps auto (DyLU)
        self._res = _lib.PushResult()
        self._flat_push = None  # made on the first push of a dict: one gather buffer
        self.finished = False   # finish (or wait_all, shutdown) done
        self._sigint = False    # a SIGINT interrupted h (downpour._sigint): clear it after
        _sigint.register(self)

    @classmethod
    def from_init(cls, path, ps=None, task_index=None, **options):
        """A client of servers started with `downpour-ps --init path` (and
        its row table, when the file's metadata names one)."""
        options.setdefault("rows", safetensors.rows_width(path))
        return cls(safetensors.table(path), ps, task_index, **options)

    @classmethod
    def from_spec(cls, spec, input=(1, 28, 28), ps=None, task_index=None, **options):
        """A client of servers started with `downpour-ps --model spec --input CxHxW`."""
        return cls(None, ps, task_index, _spec=(spec, tuple(int(x) for x in input)), **options)

    # ---- the requests ----------------------------------------------------
    def _check(self, rc, prefix=""):
        if rc != 0:
            _raise_last(self._lib, prefix)

    def _handle(self):
        if self._h is None:
            raise Error("the client is closed", "args")
        return self._h

    def _call(self, fn, *args):
        """fn(h, *args): a blocking call, which a SIGINT interrupts (the
        interpreter then raises KeyboardInterrupt as it returns); a SIGINT's
        interrupt that found no call under way is dropped first."""
        h = self._handle()
        self._clear_sigint()
        try:
            return fn(h, *args)
        finally:
            self._clear_sigint()

    def _interrupt_now(self):
        """The SIGINT watcher's: interrupt the call under way (under its lock)."""
        if self._h is not None:
            self._sigint = True
            self._lib.downpour_interrupt(self._h)

    def _clear_sigint(self):
        _sigint.settle()
        with _sigint._lock:
            if self._sigint and self._h is not None:
                self._lib.downpour_interrupt_clear(self._h)
            self._sigint = False

    def pull(self, out=None):
        """The servers' weights: a new dict of arrays, out's arrays filled in
        place (a dict name -> C-contiguous float32 array), or a flat out."""
        if isinstance(out, np.ndarray):
            self._flat_ok(out, "pull: out")
            self._check(self._call(self._lib.downpour_pull, out.ctypes.data))
            return out
        if out is None:
            flat = np.empty(self.num_floats, dtype=np.float32)
            self._check(self._call(self._lib.downpour_pull, flat.ctypes.data))
            return {t.name: flat[t.offset:t.offset + t.count].reshape(t.shape)
                    for t in self.tensors}
        ptrs = (ctypes.c_void_p * len(self.tensors))()
        for name, a in out.items():
            i = self._tensor_index(name)
            self._array_ok(a, self.tensors[i], "pull")
            ptrs[i] = a.ctypes.data
        self._check(self._call(self._lib.downpour_pull_tensors, ptrs))
        return out

    def deal_plan(self, samples, batch, epochs=1, steps=0, seed=0):
        """An elastic crew's batches dealt by shard 0 (servers with --workers
        MIN:MAX): batches of `batch` from `samples` for `epochs` epochs (or,
        epochs 0, `steps` steps a worker); every pull then asks for the
        batch of the next push step, and that push acknowledges it. The
        chief's plan is the run's: a plan of another size raises
        ModelMismatch with shard 0's one line. seed: the permutation's,
        the same on every worker of the crew (downpour-worker's --seed)."""
        self._check(self._call(self._lib.downpour_deal_plan, int(samples), int(batch), int(epochs),
                               int(steps)))
        self._deal = (int(samples), int(batch), int(seed))
        self._deal_perm = None  # (epoch, that epoch's permutation)

    def dealt(self):
        """The dataset indices (int64 array) of the batch the last pull was
        dealt, to push as step .step + 1; None when the run's batches are
        all trained (finish then). After deal_plan and a pull."""
        d = _lib.Dealt()
        self._check(self._lib.downpour_dealt(self._handle(), ctypes.byref(d)))
        if d.end:
            return None
        samples, batch, seed = self._deal
        if self._deal_perm is None or self._deal_perm[0] != d.epoch:
            # drawn once an epoch (a draw is O(samples), a batch O(batch))
            perm = np.empty(samples, dtype=np.int64)
            self._check(self._lib.downpour_deal_permutation(samples, seed, d.epoch,
                                                            perm.ctypes.data))
            self._deal_perm = (d.epoch, perm)
        return self._deal_perm[1][d.index * batch:(d.index + 1) * batch].copy()

    def _pull_ptrs(self, ptrs):
        """pull_tensors into a prepared (c_void_p * n) array (downpour.torch)."""
        self._check(self._call(self._lib.downpour_pull_tensors, ptrs))

    def push(self, grads, loss=0.0, batch=0, step=None):
        """One push (see the module's help); returns a PushResult."""
        self._handle()  # closed: said before any work
        if isinstance(grads, np.ndarray):
            self._flat_ok(grads, "push: grads")
            flat = grads
        else:
            if self._flat_push is None:
                self._flat_push = np.zeros(self.num_floats, dtype=np.float32)
            flat = self._flat_push
            for name, a in grads.items():
                t = self.tensors[self._tensor_index(name)]
                a = np.asarray(a)
                if a.shape != t.shape:
                    raise ShapeError(f"push: tensor {name}: shape {list(a.shape)}, the servers' "
                                     f"is {list(t.shape)}", "args", name)
                flat[t.offset:t.offset + t.count] = a.reshape(-1)
        return self._push_flat(flat.ctypes.data, flat, loss, batch, step)

    def round_steps(self):
        """--local-steps auto (DyLU): the data steps of this worker's next
        round, by its step time against the crew's fastest (H until both are
        known); the servers' H without auto."""
        return int(self._lib.downpour_round_steps(self._handle()))

    def push_round(self, steps, round_ms):
        """--local-steps auto: the next push is a round of `steps` data steps
        at round_ms of this worker's compute a step (0: not measured)."""
        self._check(self._call(self._lib.downpour_push_round, int(steps), float(round_ms)))

    def _push_flat(self, ptr, flat, loss, batch, step):
        """Push the flat vector at ptr (flat: a NumPy view of it, to name the
        tensor of a refusal)."""
        step = self.step + 1 if step is None else int(step)
        r = self._res
        self._check(self._call(self._lib.downpour_push, ptr, float(loss), int(batch), step,
                               ctypes.byref(r)))
        self.step = step
        res = PushResult(r.applied, r.dropped, r.rejected, r.staleness_mean, r.staleness_max,
                         r.version, r.reason.decode("utf-8", "replace"))
        if r.rejected:
            raise self._rejected(res, flat)
        return res

    # ---- the row table (a sparse embedding) --------------------------------
    def _keys(self, keys, what):
        """keys as a C-contiguous uint64 array of distinct keys."""
        if self.rows_width <= 0:
            raise Error(f"{what}: the servers' model has no row table", "args")
        k = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
        if np.unique(k).size != k.size:
            raise ValueError(f"{what}: a key appears twice (give each key once)")
        return k

    def rows_pull(self, keys):
        """The rows of keys (distinct) as a new float32 array [len(keys), D]:
        after pull() in a step, in sync the rows of that step."""
        k = self._keys(keys, "rows_pull")
        out = np.empty((k.size, self.rows_width), dtype=np.float32)
        self._check(self._call(self._lib.downpour_rows_pull, k.ctypes.data, k.size, out.ctypes.data))
        return out

    def rows_push(self, keys, grads, step=None):
        """The gradients grads [len(keys), D] of the rows of keys (of the
        last rows_pull, or fewer) as step `step` (default: the next push's,
        .step + 1; push the rows before the dense gradient of the same
        step). Returns a PushResult; a refused push raises Rejected."""
        k = self._keys(keys, "rows_push")
        g = np.ascontiguousarray(grads, dtype=np.float32)
        if g.shape != (k.size, self.rows_width):
            raise ShapeError(f"rows_push: grads of shape {list(g.shape)}, want "
                             f"[{k.size}, {self.rows_width}]", "args")
        step = self.step + 1 if step is None else int(step)
        r = _lib.PushResult()
        self._check(self._call(self._lib.downpour_rows_push, k.ctypes.data, k.size, g.ctypes.data,
                               step, ctypes.byref(r)))
        res = PushResult(r.applied, r.dropped, r.rejected, r.staleness_mean, r.staleness_max,
                         r.version, r.reason.decode("utf-8", "replace"))
        if r.rejected:
            raise Rejected(f"row push of step {step} refused: {res.reason}", "refused")
        return res

    def _rejected(self, res, flat):
        """Rejected naming the first tensor with a non-finite value, when one has."""
        for t in self.tensors:
            seg = flat[t.offset:t.offset + t.count]
            if not np.isfinite(seg).all():
                bad = int(np.flatnonzero(~np.isfinite(seg))[0])
                kind = "gradient" if t.trainable else "value"
                return Rejected(f"push of step {self.step} refused: tensor {t.name}: non-finite "
                                f"{kind} {seg[bad]} at element {bad} (servers: {res.reason})",
                                "refused", t.name)
        return Rejected(f"push of step {self.step} refused: {res.reason}", "refused")

    def version(self):
        """The version (summed over shards) the last pull got."""
        return self._lib.downpour_version_pulled(self._handle())

    def updates_lost(self):
        """Updates lost to shard restarts from older checkpoints, as seen here."""
        return self._lib.downpour_updates_lost(self._handle())

    def stats(self):
        """The servers' counters (the chief only), as a dict; "epoch_samples"
        lists the epochs shard 0 dealt (deal_plan), as summary.json does:
        each {epoch, trained, repeated, retrained_after_death, batches}."""
        st = _lib.Stats()
        self._check(self._call(self._lib.downpour_stats, ctypes.byref(st)))
        return {"applied": st.applied, "dropped": st.dropped, "rejected": st.rejected,
                "version": st.version, "staleness_mean": st.staleness_mean,
                "staleness_max": st.staleness_max,
                "staleness_hist": list(st.staleness_hist[:st.staleness_bins]),
                "epoch_samples": self._epoch_samples()}

    def _epoch_samples(self):
        n = ctypes.c_size_t(0)
        self._check(self._call(self._lib.downpour_epoch_samples, None, 0, ctypes.byref(n)))
        cap = n.value
        eps = (_lib.EpochSamples * max(cap, 1))()
        self._check(self._call(self._lib.downpour_epoch_samples, eps, cap, ctypes.byref(n)))
        keys = ("epoch", "trained", "repeated", "retrained_after_death", "batches")
        return [{k: getattr(e, k) for k in keys} for e in eps[:min(cap, n.value)]]

    def finish(self):
        """This worker is done (the servers stop counting it)."""
        self._check(self._call(self._lib.downpour_finish))
        self.finished = True

    def wait_all(self, timeout=300.0):
        """The chief: wait until every worker has finished."""
        self._check(self._call(self._lib.downpour_wait_all, float(timeout)))
        self.finished = True

    def shutdown(self):
        """The chief: stop the servers (each writes its final checkpoint first)."""
        self._check(self._call(self._lib.downpour_shutdown))
        self.finished = True

    def interrupt(self):
        """Make a call blocked in another thread return (Error "interrupted")."""
        self._lib.downpour_interrupt(self._handle())

    def close(self):
        if self._h is not None:
            _sigint.unregister(self, self._close_handle)

    def _close_handle(self):
        self._lib.downpour_close(self._h)
        self._h = None

    def leave(self):
        """Ctrl-C's way out: leave if not finished (the servers log a leave
        and stop waiting for this worker: sync and ssp go on without it, an
        elastic sync crew while MIN are live), then close; a failure to
        reach the servers is no error here (they count a silent worker gone
        after their heartbeat timeout)."""
        try:
            if self._h is not None and not self.finished:
                self._check(self._call(self._lib.downpour_leave))
                self.finished = True
        except Error as e:
            print(f"downpour: leaving without a finish: {e}", file=sys.stderr)
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, _sigint.Terminated)):
            self.leave()
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- checks ------------------------------------------------------------
    def _tensor_index(self, name):
        i = self.index.get(name)
        if i is None:
            raise ShapeError(f"tensor {name}: not in the servers' table", "args", name)
        return i

    def _array_ok(self, a, t, what):
        if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous
                and a.flags.writeable):
            raise ShapeError(f"{what}: tensor {t.name}: needs a writable C-contiguous float32 "
                             f"array", "args", t.name)
        if a.shape != t.shape:
            raise ShapeError(f"{what}: tensor {t.name}: shape {list(a.shape)}, the servers' is "
                             f"{list(t.shape)}", "args", t.name)

    def _flat_ok(self, a, what):
        if a.dtype != np.float32 or not a.flags.c_contiguous or a.size != self.num_floats:
            raise ShapeError(f"{what}: a flat vector needs {self.num_floats} contiguous float32 "
                             f"values, got {a.size} {a.dtype}", "args")
