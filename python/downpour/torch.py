"""downpour.torch: a PyTorch module trained as a worker of downpour-ps.

    downpour.torch.save_init(model, "model.safetensors")
    #   downpour-ps --init model.safetensors --workers 2 --mode async ...
    with downpour.torch.Worker(model, ps=["tcp://host:5555"], task_index=0) as w:
        for x, y in batches:
            w.pull()                      # the servers' weights, into model in place
            loss = loss_fn(model(x), y)
            loss.backward()               # into the Worker's gradient buffer
            w.push(loss=loss, batch=len(x))
            model.zero_grad()

save_init(module, path) writes module.state_dict() in its order as float32
(integer buffers such as num_batches_tracked converted), with the metadata
"downpour.state" naming every buffer: the servers step the parameters with
gradients and take the buffers' values (sync: their mean over a step's
pushes; async / ssp: the value pushed).

Worker(module, ps=None, task_index=None, *, spec=None, input=(1, 28, 28),
init=None, **options): ps and task_index as downpour.Client's (None, None:
TF_CONFIG's, as `downpour launch` sets it; under `downpour launch` with
neither --init nor --model, this first call in the chief writes the
servers' --init file from the module, and the servers start from it); the
module's state_dict as the servers' table
(names, shapes, order; parameters trainable, buffers state). spec: the
servers run `--model SPEC --input CxHxW` instead (the module's names and
shapes must be the spec's: tests/torch_net.py builds such a module). init:
the --init file the servers were started from, so that a module that
differs from it is refused before connecting, naming the tensor. Options
as downpour.Client's: timeout, curve_secret, curve_server, wire, transport,
compress, error_feedback.

  pull()   the weights into the module's parameters and buffers in place:
           one copy from what arrived, no allocation (the pointers are
           taken once; a buffer that is not float32, or not on the CPU, goes
           through a float32 copy of its own made at the start).
  push(loss=0.0, batch=0)
           the parameters' .grad (each a view into one flat buffer the
           Worker owns, so nothing is gathered; a .grad set to None or
           replaced, as zero_grad(set_to_none=True) does, is zero or copied
           in) and the buffers' current values, as step .step + 1 (kept by
           the Worker: a push repeated after a restart is applied once).
           Returns downpour.PushResult; a refused push raises
           downpour.Rejected naming the tensor with the non-finite value.
  stats(), finish(), wait_all(timeout), shutdown(), close(); .client (the
  downpour.Client), .info, .step; a context manager (finish, close; on
  Ctrl-C, which interrupts a blocked pull or push at once, the same).

A sparse embedding (one nn.Embedding or nn.EmbeddingBag built with
sparse=True) is a row table on the servers, not a tensor of the table:
save_init leaves its weight out of the file and names its width D in the
metadata ("downpour.rows"), the servers hold a row per key (the input
indices, 64-bit) made on its first push, with their --row-optimizer, and
the Worker moves only the rows a batch touches:

  pull(keys)  the dense weights, then the rows of the distinct keys in keys
           (the indices the next batch looks up) into those rows of the
           embedding's weight (the others keep what they held: they are not
           this batch's);
  push()   the embedding's sparse .grad summed per key (coalesced) as the
           rows' gradients, then the dense push, as one step. The keys
           pushed must be among those pulled (the servers refuse the rest).

Local steps (DiLoCo, local SGD): when the servers run --local-steps H, the
Worker reads H (.local_steps) and the loop keeps its own optimizer:

    opt = torch.optim.AdamW(model.parameters())     # the inner optimizer
    for x, y in batches:
        w.pull()
        loss_fn(model(x), y).backward()
        opt.step()                                  # as usual
        w.push(loss=loss, batch=len(x))             # counts a step of the round
        opt.zero_grad()

  pull() at a round's start fetches the weights (and keeps them as the
  round's start); inside a round, and right after a round's push (which
  pulls itself), it does nothing: the weights are this worker's own.
  push() counts the round's steps; at the H-th it pushes the
  pseudo-gradient (the weights the round started from minus those reached;
  the buffers as values, the loss the round's mean) as one step, pulls the
  servers' new weights and returns the PushResult; before that it returns
  None. finish(), wait_all() and a with-block's end push a round cut short
  first; after them pull() fetches the servers' weights again (the chief's
  final score). The servers' outer optimizer (--outer-optimizer
  sgd|nesterov|delayed-nesterov) steps by the pseudo-gradients. With the
  servers' --local-steps auto[:H] (DyLU; Worker(..., local_steps="auto")
  checks they run it) each round's H is this worker's own: H while its
  speed is unknown, then H x the crew's fastest step time / its own (at
  least 1), its step time timed from a round's start to its last push()
  and sent with the round's push (.local_auto; the round's steps go with
  it, so a replay repeats it). With compress= (topk:F, sign) the
  pseudo-gradient is what is compressed, error feedback carrying what a
  round did not send into the next round's push, as for downpour-worker.
"""
import ctypes
import os
import time

import torch

import downpour
from downpour import _sigint
from downpour import safetensors as _st

__all__ = ["save_init", "Worker", "DealtSampler", "table_of", "rows_of"]


def _buffer_names(module):
    return set(name for name, _ in module.named_buffers())


def rows_of(module):
    """The module's sparse embedding: (weight's state_dict name, the
    embedding module, D), or None. Two of them are refused (the servers hold
    one row table)."""
    found = [(name, m) for name, m in module.named_modules()
             if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse]
    if len(found) > 1:
        raise downpour.ModelMismatch(
            f"sparse embeddings {found[0][0]} and {found[1][0]}: the servers hold one row table; "
            f"build one of them with sparse=False (a dense tensor) or merge their keys", "args",
            found[1][0])
    if not found:
        return None
    name, m = found[0]
    return (f"{name}.weight" if name else "weight", m, int(m.embedding_dim))


def table_of(module):
    """The servers' table for module: [(name, shape, trainable)] in
    state_dict order, buffers as state, a sparse embedding's weight left out
    (rows_of: the servers' row table). Tied tensors (two names, one
    storage: a weight shared by two layers) are refused, naming both: the
    servers would hold and step two copies that drift apart."""
    rows = rows_of(module)
    skip = rows[0] if rows else None
    buffers = _buffer_names(module)
    seen = {}
    for name, t in module.state_dict(keep_vars=True).items():
        if t.numel() == 0:
            continue
        st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()  # 1.13: storage()
        key = (t.device, st.data_ptr())
        if key in seen:
            raise downpour.ModelMismatch(
                f"tensors {seen[key]} and {name} share their storage (tied parameters): the "
                f"servers hold each name as its own tensor, so the two would drift apart; untie "
                f"them (give {name} its own nn.Parameter) or share it in forward() instead",
                "args", name)
        seen[key] = name
    return [(name, tuple(t.shape), name not in buffers)
            for name, t in module.state_dict().items() if name != skip]


def save_init(module, path):
    """Write the --init file of module (see the module's help)."""
    keep = set(name for name, _, _ in table_of(module))  # tied tensors refused first
    rows = rows_of(module)
    buffers = _buffer_names(module)
    tensors, state = [], []
    for name, t in module.state_dict().items():
        if name not in keep:
            continue  # the sparse embedding: rows on the servers
        tensors.append((name, t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()))
        if name in buffers:
            state.append(name)
    meta = {"format": "pt"}
    if state:
        meta[_st.STATE_KEY] = ",".join(state)
    if rows:
        meta[_st.ROWS_KEY] = str(rows[2])
    _st.write(path, tensors, meta)


def _check_against(table, expected, where):
    """ModelMismatch naming the first tensor of table that differs from expected."""
    for i in range(max(len(table), len(expected))):
        if i >= len(expected):
            raise downpour.ModelMismatch(
                f"tensor {table[i][0]}: the module has it, {where} has no tensor {i + 1}",
                "args", table[i][0])
        if i >= len(table):
            raise downpour.ModelMismatch(
                f"tensor {expected[i][0]}: {where} has it, the module does not", "args",
                expected[i][0])
        (n, s, t), (en, es, et) = table[i], expected[i]
        if n != en:
            raise downpour.ModelMismatch(
                f"tensor {i + 1}: the module's is {n}, {where}'s is {en}", "args", n)
        if tuple(s) != tuple(es):
            raise downpour.ShapeError(
                f"tensor {n}: the module's shape is {list(s)}, {where}'s is {list(es)}",
                "args", n)
        if bool(t) != bool(et):
            what = lambda x: "trained by gradients" if x else "state (a buffer)"  # noqa: E731
            raise downpour.ModelMismatch(
                f"tensor {n}: {what(t)} in the module, {what(et)} in {where}", "args", n)


def _launch_servers(module, timeout):
    """Under `downpour launch` with neither --init nor --model, the chief is
    started before the servers (DOWNPOUR_LAUNCH_INIT set, no TF_CONFIG): it
    writes their --init file from its module, then waits for the launcher
    to write where the shards listen (DOWNPOUR_LAUNCH_PS). Their endpoints."""
    init, ps_file = os.environ["DOWNPOUR_LAUNCH_INIT"], os.environ["DOWNPOUR_LAUNCH_PS"]
    save_init(module, init + ".tmp")
    os.replace(init + ".tmp", init)  # whole or not there: the launcher waits for the name
    deadline = time.monotonic() + timeout
    while not os.path.exists(ps_file):
        if time.monotonic() > deadline:
            raise downpour.Error(f"downpour launch did not start the servers within {timeout:.0f} s "
                                 f"({ps_file} missing)", "timeout")
        time.sleep(0.02)
    with open(ps_file) as f:
        return f.read().strip()


class Worker:
    """A PyTorch module as worker task_index of the servers (see the module's help)."""

    def __init__(self, module, ps=None, task_index=None, *, spec=None, input=(1, 28, 28), init=None,
                 local_steps=None, **options):
        self.module = module
        table = table_of(module)
        if ps is None and spec is None and "DOWNPOUR_LAUNCH_INIT" in os.environ \
                and "TF_CONFIG" not in os.environ:
            ps = _launch_servers(module, max(60.0, float(options.get("timeout", 30.0))))
        self._rows = rows_of(module)  # (name, embedding, D) or None
        width = self._rows[2] if self._rows else 0
        if init is not None:
            _check_against(table, _st.table(init), init)
            if _st.rows_width(init) != width:
                raise downpour.ModelMismatch(
                    f"{init} names a row table of width {_st.rows_width(init)}, the module's "
                    f"sparse embedding is {width} wide", "args", self._rows[0] if self._rows else None)
        if spec is not None and self._rows:
            raise downpour.Error("a module with a sparse embedding trains from a table (no spec=: "
                                 "save_init writes the servers' --init file)", "args")
        if spec is not None:
            self.client = downpour.Client.from_spec(spec, input, ps, task_index, **options)
            spec_table = [(t.name, t.shape, t.trainable) for t in self.client.tensors]
            try:
                _check_against(table, spec_table, f"the spec '{spec}'")
            except downpour.Error:
                self.client.close()
                raise
        else:
            try:
                self.client = downpour.Client(table, ps, task_index, rows=width, **options)
            except downpour.ModelMismatch as e:
                first = table[0]
                raise downpour.ModelMismatch(
                    f"model mismatch: the servers hold another model than this module's table "
                    f"({len(table)} tensors, the first {first[0]} {list(first[1])}); give "
                    f"init='FILE.safetensors' (the servers' --init file) to name the tensor that "
                    f"differs (servers: {e})", e.code) from None
        self.info = self.client.info
        self._bind()
        self.local_steps = max(1, int(self.info.local_steps))  # H, the servers' --local-steps
        self.local_auto = self.client.local_auto  # DyLU: each round's H by this worker's speed
        if local_steps is not None and (str(local_steps) == "auto") != self.local_auto:
            self.client.close()
            raise downpour.Error(f"local_steps={local_steps!r}: the servers run --local-steps "
                                 f"{'auto:' if self.local_auto else ''}{self.local_steps}: give "
                                 f"both the same", "args")
        if self._rows and self.local_steps > 1:
            self.client.close()
            raise downpour.Error("a sparse embedding's rows are pushed every step: the servers' "
                                 "--local-steps is for modules without one", "args")
        self._keys = None       # the distinct keys of the last pull(keys), as a LongTensor
        self._round = 0         # data steps of the round under way
        self._round_loss = 0.0
        self._round_batch = 0
        self._fresh = False     # a round's push pulled the weights: the next pull() has them
        self._w0 = None         # the round's start (flat, trainable tensors' places)
        self._pseudo = None     # the pseudo-gradient pushed (flat)
        self._rounds_over = False  # finish() / wait_all(): pull() fetches again
        self._round_h = self.local_steps  # this round's H (DyLU: set at its start)
        self._round_t0 = 0.0      # DyLU: when the round's steps began (perf_counter)

    # ---- where each tensor lives -------------------------------------------
    def _bind(self):
        """Take each tensor's pointer once; give each parameter's .grad a view
        into one flat buffer."""
        c = self.client
        sd = self.module.state_dict(keep_vars=True)
        params = dict(self.module.named_parameters())
        n = len(c.tensors)
        self._ptrs = (ctypes.c_void_p * n)()
        self._direct = []   # (tensor, ptr): pulled straight into the tensor's storage
        self._staged = []   # (tensor, float32 staging): pulled there, then copied in
        self._grads = []    # (param, flat view, shape)
        self._state = []    # (buffer, flat view)
        self._flat = torch.zeros(c.num_floats, dtype=torch.float32)
        self._flat_np = self._flat.numpy()
        for i, t in enumerate(c.tensors):
            v = sd.get(t.name)
            if v is None:
                raise downpour.ModelMismatch(f"tensor {t.name}: the servers' table has it, the "
                                             f"module no longer does", "args", t.name)
            data = v.data if isinstance(v, torch.nn.Parameter) else v
            if tuple(data.shape) != t.shape:
                raise downpour.ShapeError(f"tensor {t.name}: the module's shape is now "
                                          f"{list(data.shape)}, the servers' is {list(t.shape)}",
                                          "args", t.name)
            if data.dtype == torch.float32 and data.device.type == "cpu" and data.is_contiguous():
                self._ptrs[i] = data.data_ptr()
                self._direct.append((v, data.data_ptr()))  # v: a .data replaced shows
            else:
                stage = torch.empty(t.shape, dtype=torch.float32)
                self._ptrs[i] = stage.data_ptr()
                self._staged.append((v, stage))
            view = self._flat[t.offset:t.offset + t.count]
            if t.trainable:
                p = params.get(t.name)
                if p is None:  # a table's trainable tensor that is no Parameter
                    raise downpour.ModelMismatch(f"tensor {t.name}: trained by gradients on the "
                                                 f"servers, not a parameter of the module", "args",
                                                 t.name)
                g = view.view(t.shape)
                if p.device.type == "cpu" and p.dtype == torch.float32:
                    if p.grad is not None:
                        g.copy_(p.grad)
                    p.grad = g
                self._grads.append((p, g, t))
            else:
                self._state.append((v, view.view(t.shape), t))

    def pull(self, keys=None):
        """The servers' weights into the module, and with a sparse embedding
        the rows of keys (see the module's help)."""
        if self.local_steps > 1 and not self._rounds_over and (self._round or self._fresh):
            return  # local steps: the weights are this worker's own until the round's push
        if self._rows and keys is None:
            raise downpour.Error(f"pull(keys): the indices the next batch looks up in "
                                 f"{self._rows[0]}, a row table on the servers", "args")
        self._pull_now()
        if self._rows:
            self._pull_rows(keys)
        if self.local_steps > 1:
            self._keep_round_start()

    def _pull_rows(self, keys):
        """The rows of keys' distinct values into the embedding's weight."""
        k = torch.as_tensor(keys).reshape(-1).to(dtype=torch.int64, device="cpu")
        k = torch.unique(k)  # sorted, distinct
        if k.numel() and int(k[0]) < 0:
            raise ValueError(f"pull(keys): key {int(k[0])} is negative")
        self._keys = k
        if not k.numel():
            return
        rows = self.client.rows_pull(k.numpy().astype("uint64"))
        weight = self._rows[1].weight
        with torch.no_grad():
            weight.index_copy_(0, k.to(weight.device), torch.from_numpy(rows).to(weight))

    def _push_rows(self):
        """The embedding's sparse .grad, summed per key, as the rows' push
        of the coming step; nothing when it has none."""
        weight = self._rows[1].weight
        g = weight.grad
        if g is None:
            return
        if not g.is_sparse:
            g = g.to_sparse()
        g = g.coalesce()
        idx = g.indices()[0].to(dtype=torch.int64, device="cpu")
        vals = g.values().detach().to(dtype=torch.float32, device="cpu").contiguous()
        if idx.numel():
            self.client.rows_push(idx.numpy().astype("uint64"), vals.numpy())

    def _pull_now(self):
        for data, ptr in self._direct:
            if data.data_ptr() != ptr:  # the module was moved or reallocated
                self._bind()
                break
        self.client._pull_ptrs(self._ptrs)
        if self._staged:
            with torch.no_grad():
                for data, stage in self._staged:
                    data.copy_(stage)

    def push(self, loss=0.0, batch=0):
        """The gradients (and the buffers' values) as the next step; with
        local steps, one step of the round (see the module's help)."""
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach())
        if self.local_steps > 1:
            return self._local_step(loss, batch)
        if self._rows:
            self._push_rows()  # before the dense push: in sync the step takes them with it
        with torch.no_grad():
            for p, g, t in self._grads:
                pg = p.grad
                if pg is None:
                    g.zero_()
                elif pg.data_ptr() != g.data_ptr():
                    if tuple(pg.shape) != t.shape:
                        raise downpour.ShapeError(f"push: tensor {t.name}: .grad has shape "
                                                  f"{list(pg.shape)}, the parameter's is "
                                                  f"{list(t.shape)}", "args", t.name)
                    g.copy_(pg)
                    if p.device.type == "cpu" and p.dtype == torch.float32:
                        p.grad = g  # the next backward accumulates into the flat buffer
            for data, v, _ in self._state:
                v.copy_(data)
        return self.client._push_flat(self._flat.data_ptr(), self._flat_np, loss, batch, None)

    # ---- local steps --------------------------------------------------------
    def _keep_round_start(self):
        if self._w0 is None:
            self._w0 = torch.zeros(self.client.num_floats, dtype=torch.float32)
            self._pseudo = torch.zeros(self.client.num_floats, dtype=torch.float32)
            self._pseudo_np = self._pseudo.numpy()
        with torch.no_grad():
            for p, _, t in self._grads:
                self._w0[t.offset:t.offset + t.count].copy_(p.detach().reshape(-1))
        if self.local_auto:  # DyLU: the round's H now, its clock from here to its last push()
            self._round_h = self.client.round_steps()
            self._round_t0 = time.perf_counter()

    def _local_step(self, loss, batch):
        if self._w0 is None:  # no pull() came first: the round starts from the servers' weights
            self.pull()
        self._fresh = False
        self._round += 1
        self._round_loss += loss
        self._round_batch = batch
        return self._end_round() if self._round == self._round_h else None

    def _end_round(self):
        """Push the round's pseudo-gradient (one step), then pull; None when
        no step was taken since the last round."""
        if self.local_steps == 1 or self._round == 0:
            return None
        with torch.no_grad():
            for p, _, t in self._grads:
                sl = slice(t.offset, t.offset + t.count)
                torch.sub(self._w0[sl], p.detach().reshape(-1), out=self._pseudo[sl])
            for data, _, t in self._state:
                self._pseudo[t.offset:t.offset + t.count].copy_(data.reshape(-1))
        loss = self._round_loss / self._round
        if self.local_auto:  # the round's steps and this worker's ms a step go with the push
            ms = (time.perf_counter() - self._round_t0) * 1000.0 / self._round
            self.client.push_round(self._round, ms)
        self._round, self._round_loss = 0, 0.0
        r = self.client._push_flat(self._pseudo.data_ptr(), self._pseudo_np, loss,
                                   self._round_batch, None)
        self._pull_now()
        self._keep_round_start()
        self._fresh = True
        return r

    @property
    def step(self):
        return self.client.step

    def sampler(self, dataset, batch_size, epochs=1, steps=0, seed=0):
        """A DealtSampler: the batches shard 0 deals this worker (servers with
        --workers MIN:MAX), for DataLoader(dataset, batch_sampler=...)."""
        return DealtSampler(self, len(dataset), batch_size, epochs, steps, seed)

    def stats(self):
        return self.client.stats()

    def finish(self):
        self._end_round()
        self._rounds_over = True
        self.client.finish()

    def wait_all(self, timeout=300.0):
        self._end_round()
        self._rounds_over = True
        self.client.wait_all(timeout)

    def shutdown(self):
        self.client.shutdown()

    def close(self):
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, _sigint.Terminated)):
            self.client.leave()  # Ctrl-C: the servers stop waiting for this worker
            return
        try:
            if exc_type is None and not self.client.finished:
                self.finish()
        finally:
            self.client.close()


class DealtSampler:
    """The batches shard 0 of an elastic crew deals this worker, as a
    torch.utils.data batch sampler (Worker.sampler(dataset, batch_size)):

        loader = DataLoader(ds, batch_sampler=w.sampler(ds, batch_size=32))
        for x, y in loader:
            w.pull()          # optional: the same batch, fresher weights
            loss = loss_fn(model(x), y); loss.backward()
            w.push(loss=loss, batch=len(x))   # acknowledges the batch
            model.zero_grad()

    Each step of __iter__ pulls the weights (into the module) with the
    batch of the worker's next push step and yields its dataset indices; it
    ends when shard 0 says every batch of the run is trained. Every worker
    of the crew gives the same dataset size, batch, epochs and seed: the
    chief's plan is the run's, another raises downpour.ModelMismatch here
    with shard 0's one line. A batch is acknowledged by the next push, so
    a loop must push once per batch; DataLoader's num_workers 0 (its
    workers would prefetch the sampler's pulls ahead of the pushes).
    __len__ is approximate: the run's batches over the servers' workers."""

    def __init__(self, worker, samples, batch_size, epochs=1, steps=0, seed=0):
        self.worker = worker
        self.samples, self.batch_size = int(samples), int(batch_size)
        self.epochs, self.steps = int(epochs), int(steps)
        worker.client.deal_plan(self.samples, self.batch_size, self.epochs, self.steps, seed)

    def __iter__(self):
        while True:
            self.worker.pull()
            idx = self.worker.client.dealt()
            if idx is None:
                return
            yield idx.tolist()

    def __len__(self):
        if not self.epochs:
            return self.steps
        return self.samples // self.batch_size * self.epochs // max(1, self.worker.client.info.workers)
