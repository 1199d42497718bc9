"""The code interpreter's kernel: this file's source runs inside a live sandbox as
`python3 -u -c <source>` (interpreter.py starts it; nothing is written into the sandbox's
filesystem, so a commit does not carry it), with the image's python3 and its standard library
only: no Jupyter in the image.

One kernel is one context: one namespace kept across executions. The engine writes one JSON
request a line on the kernel's stdin ({"code", "env"}) and reads JSON messages a line on its
stdout, shaped as Jupyter's (and E2B's /execute stream) are:
    {"type": "stdout"|"stderr", "text", "timestamp"}      as the code writes (fd 1 and 2: a
                                                          subprocess's output is caught too)
    {"type": "result", "text", "html", "png", ..., "is_main_result"}
                                                          the last expression's value, display()
                                                          calls, matplotlib figures (PNG)
    {"type": "error", "name", "value", "traceback"}
    {"type": "number_of_executions", "execution_count"}
    {"type": "done"}                                      the execution is over (all its output sent)
The kernel's own channels are private duplicates of the original stdin/stdout: the code sees
/dev/null as stdin and pipes the kernel reads as fd 1 and 2. SIGINT interrupts the running code
(KeyboardInterrupt, as in Jupyter) and is ignored between executions.

Kept free of sandtree imports and of anything the image's python3 may lack (3.8's syntax)."""

import ast
import base64
import builtins
import codecs
import importlib.abc
import importlib.util
import json
import linecache
import os
import signal
import sys
import threading
import time
import traceback

_proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
_proto_in = os.fdopen(os.dup(0), "rb")
_send_lock = threading.Lock()
_running = False


def _send(msg):
    data = (json.dumps(msg) + "\n").encode("utf-8")
    with _send_lock:
        _proto_out.write(data)


class _Pump(object):
    """Reads what the code writes to one fd (a pipe in its place) and sends it as it comes; a
    sync marker written after an execution says all before it was sent."""

    def __init__(self, fd, kind):
        self.kind = kind
        self.marker = ("\x00sandtree-kernel-sync-%s\x00" % kind).encode()
        self.synced = threading.Event()
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.r = r
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        carry = b""
        while True:
            try:
                chunk = os.read(self.r, 65536)
            except InterruptedError:
                continue
            if not chunk:
                return
            data = carry + chunk
            carry = b""
            while True:
                i = data.find(self.marker)
                if i < 0:
                    break
                self.emit(data[:i], final=True)
                data = data[i + len(self.marker):]
                self.synced.set()
            # a marker cut by the read: keep its start for the next one
            for n in range(min(len(self.marker) - 1, len(data)), 0, -1):
                if self.marker.startswith(data[-n:]):
                    data, carry = data[:-n], data[-n:]
                    break
            self.emit(data)

    def emit(self, data, final=False):
        text = self.decoder.decode(data, final)
        if text:
            _send({"type": self.kind, "text": text, "timestamp": time.time_ns()})

    def sync(self, fd):
        self.synced.clear()
        os.write(fd, self.marker)
        self.synced.wait(5.0)


_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
_pumps = (_Pump(1, "stdout"), _Pump(2, "stderr"))
sys.stdin = open(0, "r", closefd=False)
sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)


def _interrupt(signum, frame):
    if _running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _interrupt)

# ---- display: IPython's formatter's MIME types, by the same _repr_*_ methods ------------------
_FORMATS = (("html", "_repr_html_"), ("markdown", "_repr_markdown_"), ("svg", "_repr_svg_"),
            ("png", "_repr_png_"), ("jpeg", "_repr_jpeg_"), ("pdf", "_repr_pdf_"), ("latex", "_repr_latex_"),
            ("json", "_repr_json_"), ("javascript", "_repr_javascript_"))
_MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
         "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
         "application/json": "json", "application/javascript": "javascript"}
_BINARY = ("png", "jpeg", "pdf")


def _value(key, data):
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[1], dict):
        data = data[0]                     # (data, metadata), as IPython's formatters allow
    if key in _BINARY and isinstance(data, (bytes, bytearray)):
        return base64.b64encode(bytes(data)).decode("ascii")
    if isinstance(data, (bytes, bytearray)):
        return bytes(data).decode("utf-8", "replace")
    return data


def _figure_png(fig):
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _is_figure(obj):
    mpl = sys.modules.get("matplotlib.figure")
    return mpl is not None and isinstance(obj, mpl.Figure)


def _bundle(obj):
    """A value's representations as E2B's result fields: text is repr (IPython's plain text)."""
    out = {}
    if not isinstance(obj, type):          # a class's _repr_*_ are unbound methods, not its display
        mime = getattr(obj, "_repr_mimebundle_", None)
        if callable(mime):
            try:
                got = mime(include=None, exclude=None)
                if isinstance(got, tuple):
                    got = got[0]
                for k, v in (got or {}).items():
                    key = _MIME.get(k)
                    if key is not None:
                        out[key] = _value(key, v)
                    else:
                        out.setdefault("extra", {})[k] = _value(k, v)
            except Exception:
                pass
        for key, meth in _FORMATS:
            if key in out:
                continue
            fn = getattr(obj, meth, None)
            if not callable(fn):
                continue
            try:
                got = fn()
            except Exception:
                continue
            if got is not None:
                out[key] = _value(key, got)
    if _is_figure(obj) and "png" not in out:
        out["png"] = _figure_png(obj)
    if "text" not in out:
        try:
            out["text"] = repr(obj)
        except Exception as e:
            out["text"] = "<repr failed: %s: %s>" % (type(e).__name__, e)
    return out


def display(*objs, **kwargs):
    """IPython's display(): each object as a result of the execution (not its main one)."""
    for obj in objs:
        _send({"type": "result", "is_main_result": False, **_bundle(obj)})


def _show_figures(*args, **kwargs):
    """plt.show() and the figures left open at an execution's end: PNG results, then closed (as
    IPython's inline backend does, and so E2B's)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        _send({"type": "result", "is_main_result": False, "text": repr(fig), "png": _figure_png(fig)})
    plt.close("all")


_BACKEND = "sandtree_inline_backend"
_BACKEND_SOURCE = """
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas
from matplotlib.backend_bases import FigureManagerBase as FigureManager
show = _show
"""


class _BackendFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """matplotlib's backend (MPLBACKEND=module://...): Agg's canvas, figures shown as results."""

    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self) if name == _BACKEND else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module._show = _show_figures
        exec(_BACKEND_SOURCE, module.__dict__)


sys.meta_path.append(_BackendFinder())
os.environ.setdefault("MPLBACKEND", "module://" + _BACKEND)

# ---- executions --------------------------------------------------------------------------------
_ns = {"__name__": "__main__", "__builtins__": builtins, "display": display}
_count = 0


def _error(e, cell):
    tb = traceback.TracebackException(type(e), e, e.__traceback__)
    # the kernel's own frames (the exec call) are not the code's
    tb.stack = traceback.StackSummary.from_list([f for f in tb.stack if f.filename.startswith("<cell")] or tb.stack)
    if isinstance(e, SyntaxError):
        tb.stack = traceback.StackSummary.from_list([])
    _send({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": "".join(tb.format())})


def _execute(code, env):
    global _count, _running
    _count += 1
    cell = "<cell-%d>" % _count
    linecache.cache[cell] = (len(code), None, code.splitlines(True), cell)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _running = True
    try:
        try:
            tree = ast.parse(code, cell, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, cell, "exec"), _ns)
            value = eval(compile(last, cell, "eval"), _ns) if last is not None else None
            _running = False
            if value is not None:
                _ns["_"] = value
                _send({"type": "result", "is_main_result": True, **_bundle(value)})
        except BaseException as e:          # SystemExit and KeyboardInterrupt end the code, not the kernel
            _running = False
            _error(e, cell)
        try:
            _show_figures()
        except Exception as e:
            _error(e, cell)
    finally:
        _running = False
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        _pumps[0].sync(1)
        _pumps[1].sync(2)
        _send({"type": "number_of_executions", "execution_count": _count})
        _send({"type": "done"})


def _main():
    _send({"type": "ready", "python": sys.version.split()[0], "pid": os.getpid()})
    while True:
        try:
            line = _proto_in.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            req = json.loads(line)
        except ValueError:
            continue
        try:
            _execute(str(req.get("code", "")), {str(k): str(v) for k, v in (req.get("env") or {}).items()})
        except KeyboardInterrupt:           # an interrupt that came as the execution ended
            _send({"type": "done"})


_main()
