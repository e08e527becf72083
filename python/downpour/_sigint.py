"""_sigint: Ctrl-C (and SIGTERM) reaches a call blocked inside libdownpour.

CPython runs a signal's Python handler (for SIGINT, the default one raises
KeyboardInterrupt) only in the main thread and only between bytecodes, so
a SIGINT that arrives while the main thread waits inside the library (a
sync pull the servers hold until the other workers push, wait_all) would
wait with it, up to the call's timeout. CPython's C-level handler does run
at once, and writes the signal's number to the wakeup fd
(signal.set_wakeup_fd). A watcher thread reads that fd and calls
downpour_interrupt on every open client: the blocked call returns within
the client's 100 ms poll slice (DOWNPOUR_ERR_INTERRUPTED), and the
interpreter, back from the foreign call, runs the pending handler, which
raises KeyboardInterrupt there. A SIGINT between calls is Python's own
business, as always.

The watcher may come late: the call can return for its own reasons while
the watcher waits for the interpreter's lock, and its interrupt would then
hit the next call (the finish a with-block makes on its way out). So the
Python handler is wrapped to count the SIGINTs the main thread has taken,
the watcher counts those it has handled, and settle() (before and after
every call) waits until the watcher has caught up; a client's stale
interrupt is cleared then.

SIGTERM (a launcher's "leave", `downpour scale`, Kubernetes) is taken the
same way when the program left it at its default (which ends the process
at once, without the with-block's leave): its handler raises Terminated,
a SystemExit of status 143, so the with-block leaves as on Ctrl-C and the
process still exits 128 + SIGTERM. A program's own SIGTERM handler is left
alone.

The watcher starts with the first client made in the main thread (the fd
can only be set from there). A wakeup fd set before it (asyncio's, say) is
kept: every byte read is passed on to it. One set after it, or a SIGINT
handler set after it, replaces ours, and Ctrl-C then waits for the call
(or its settling) as before.
"""
import os
import signal
import threading
import weakref

_lock = threading.Lock()      # the watcher's interrupt against a client's clear and close
_clients = weakref.WeakSet()  # the open clients (downpour.Client)
_started = False
_caught_up = threading.Condition()
_taken = 0    # SIGINTs the main thread's handler ran for
_handled = 0  # SIGINTs the watcher interrupted the clients for
_gate = threading.Event()  # open; a test closes it to make the watcher late on purpose
_gate.set()
_ours = set()  # the signals whose handler counts (SIGINT; SIGTERM when it was the default)


class Terminated(SystemExit):
    """SIGTERM, raised where the main thread is, as SIGINT raises
    KeyboardInterrupt: a with-block leaves the servers, and the process,
    if nothing catches it, exits with status 143 (128 + SIGTERM)."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


def _terminate(signum, frame):
    raise Terminated()


def _counted(handler):
    def counted(signum, frame):
        global _taken
        with _caught_up:
            _taken += 1
        return handler(signum, frame)
    return counted


def register(client):
    """client is open: a SIGINT from now on interrupts its blocked call."""
    global _started
    with _lock:
        _clients.add(client)
        if _started or threading.current_thread() is not threading.main_thread():
            return
        _started = True
    r, w = os.pipe()
    os.set_blocking(w, False)  # set_wakeup_fd's requirement: a full pipe drops, never blocks
    try:
        previous = signal.set_wakeup_fd(w)
    except ValueError:  # not the main interpreter's main thread after all
        os.close(r), os.close(w)
        return
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # SIG_IGN: no SIGINT comes; SIG_DFL: it ends the process
        _ours.add(signal.SIGINT)
        signal.signal(signal.SIGINT, _counted(handler))
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        _ours.add(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _counted(_terminate))
    threading.Thread(target=_watch, args=(r, previous), name="downpour-sigint",
                     daemon=True).start()


def unregister(client, close):
    """close() the client's handle with no interrupt of it under way."""
    with _lock:
        _clients.discard(client)
        close()


def settle(timeout=2.0):
    """Wait (at most timeout s) until the watcher has handled every SIGINT
    the main thread has taken."""
    with _caught_up:
        _caught_up.wait_for(lambda: _handled >= _taken, timeout)


def _watch(r, previous):
    global _handled
    while True:
        got = os.read(r, 64)
        if previous >= 0:
            try:
                os.write(previous, got)
            except OSError:
                pass  # its reader's business, as a full pipe is
        n = sum(got.count(sig) for sig in _ours)
        if n:
            _gate.wait()
            with _lock:
                for c in list(_clients):
                    c._interrupt_now()
            with _caught_up:
                _handled += n
                _caught_up.notify_all()
