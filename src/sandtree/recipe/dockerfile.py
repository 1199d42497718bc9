"""A Dockerfile as a Recipe (steps.py): the subset of Dockerfile sandtree builds, with Docker's meaning, every other
input refused with the line and the instruction named (InvalidInput(line=N)).

    FROM [image|docker://...|scratch|STAGE] [AS name]     RUN [--network=POLICY] cmd | ["exec", "form"]
    COPY/ADD [--from=STAGE|image] [--chown=U[:G]] [--chmod=OCTAL] src... dest   (ADD: a local tar unpacks)
    ENV, ARG (before FROM too), WORKDIR, USER, LABEL, ENTRYPOINT, CMD, EXPOSE

The lexer (lexer.py) gives logical lines and expands words; here each instruction becomes a step
whose `text` is the canonical instruction after expansion (docs/design.md, "Builds": the Python
builder writes the same text for the same step, so the same step has the same cache key and ID).
Docker's scoping: ARGs before the first FROM are seen only by FROM lines (a stage sees one again by
declaring `ARG NAME`); in a stage, ENV wins over ARG; RUN/CMD/ENTRYPOINT are not expanded (the
shell does it) and a RUN gets the ARGs in scope as its build-time environment (Run.env).
"""

from __future__ import annotations

import json
import posixpath
import re

from ..errors import InvalidInput
from ..network.policy import Grant, Policy
from .context import BuildContext, source_roots
from .lexer import MAX_WORD_CHARS, Line, directives_and_lines, expand, quote, split_words, word
from .steps import Configure, Copy, From, Recipe, Run, Stage

__all__ = ["parse", "SUPPORTED", "MAX_STAGES", "MAX_EXPANDED"]

SUPPORTED = ("FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "LABEL", "ENTRYPOINT", "CMD", "EXPOSE")
_DOCKER_ONLY = ("MAINTAINER", "VOLUME", "HEALTHCHECK", "SHELL", "STOPSIGNAL", "ONBUILD")
MAX_STAGES = 64
_STAGE_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,127}$")
_CHOWN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://|git@)")
_HEREDOC = re.compile(r"(^|\s)\d*<<-?\s*([\"']?)[A-Za-z_][A-Za-z0-9_]*\2(\s|$)")
_PORT = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?(?:/(tcp|udp|sctp))?$", re.I)
_MAX_PORTS = 1024
MAX_EXPANDED = 16 * MAX_WORD_CHARS   # all of a Dockerfile's expanded words together (each step keeps its text)


def _show_policy(p: Policy) -> str:
    return ",".join(str(r) for r in p.allow)


def _fail(ln: Line, what: str) -> InvalidInput:
    return InvalidInput(f"line {ln.number}: {ln.instruction}: {what}", line=ln.number, instruction=ln.instruction)


class _Stage:
    def __init__(self, index: int, name: str | None, base_env):
        self.index, self.name = index, name
        self.steps: list = []
        self._base_env = base_env        # () -> the base image's env (asked only when needed)
        self._base: dict | None = None
        self.env: dict = {}              # the stage's own ENVs
        self.args: dict = {}             # ARGs in scope: name -> value (None: declared, no value)
        self.cmd_set = False

    def base_env(self) -> dict:
        if self._base is None:
            self._base = dict(self._base_env())
        return self._base

    def scope(self) -> "_Scope":
        return _Scope(self)


class _Scope:
    """What $VAR sees in a stage: its ENVs, then the base image's env, then its ARGs (Docker: an
    image's env wins over an ARG). The base's env is asked for only when a name is not found before."""

    def __init__(self, stage: _Stage):
        self.stage = stage

    def get(self, name: str, default=None):
        st = self.stage
        if name in st.env:
            return st.env[name]
        if name in st.args and st.args[name] is not None and name not in st.base_env():
            return st.args[name]
        return st.base_env().get(name, default)


class _Parser:
    def __init__(self, context, build_args, network, escape, image_env):
        self.context: BuildContext | None = context
        self.build_args = {str(k): str(v) for k, v in (build_args or {}).items()}
        self.network = Policy.from_value(network)
        self.escape = escape
        self.image_env = image_env
        self.global_args: dict = {}
        self.stages: list[_Stage] = []
        self.expanded = 0

    # ---- helpers --------------------------------------------------------------------------------------
    def expand(self, w: str, scope, line: int) -> str:
        """expand() counted against MAX_EXPANDED: copies of a large value cannot add up either."""
        value = expand(w, scope, self.escape, line)
        self.expanded += len(value)
        if self.expanded > MAX_EXPANDED:
            raise InvalidInput(f"line {line}: the Dockerfile's words expand to over {MAX_EXPANDED} characters",
                               line=line)
        return value

    def words(self, ln: Line, text: str, scope: dict) -> list[str]:
        return [self.expand(w, scope, ln.number) for w in split_words(text, self.escape, ln.number)]

    def flags(self, ln: Line, allowed: tuple[str, ...]) -> tuple[dict, str]:
        """Leading --name=value flags (only `allowed`) and the rest of the line."""
        out, rest = {}, ln.rest
        while rest.startswith("--"):
            flag, *more = re.split(r"[ \t]", rest, maxsplit=1)
            rest = more[0].lstrip() if more else ""
            name, eq, value = flag[2:].partition("=")
            if name not in allowed:
                raise _fail(ln, f"the flag --{name} is not supported" +
                            (f" (supported: {', '.join('--' + a for a in allowed)})" if allowed else ""))
            if not eq or not value:
                raise _fail(ln, f"--{name} needs a value (--{name}=VALUE)")
            if name in out:
                raise _fail(ln, f"--{name} given twice")
            out[name] = value
        return out, rest

    def json_form(self, rest: str) -> list[str] | None:
        if not rest.startswith("["):
            return None
        try:
            v = json.loads(rest)
        except ValueError:
            return None                  # Docker reads a non-JSON '[...' as the shell form
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return v
        return None

    def stage(self, ln: Line) -> _Stage:
        if not self.stages:
            raise _fail(ln, "comes before the first FROM (only ARG may)")
        return self.stages[-1]

    def add(self, step) -> None:
        self.stages[-1].steps.append(step)

    def find_stage(self, name: str, here: int) -> str | None:
        """"stage:NAME" / "stage:N" when `name` is an earlier stage, else None (an image)."""
        low = name.lower()
        for st in self.stages[:here]:
            if st.name == low:
                return f"stage:{low}"
        if name.isdigit():
            if int(name) >= here:
                raise InvalidInput(f"stage {name} is not an earlier stage")
            return f"stage:{int(name)}"
        return None

    # ---- instructions ---------------------------------------------------------------------------------
    def do_FROM(self, ln: Line) -> None:
        flags, rest = self.flags(ln, ())
        scope = {k: v for k, v in self.global_args.items() if v is not None}
        words = self.words(ln, rest, scope)
        name = None
        if len(words) == 3 and words[1].lower() == "as":
            name = words[2].lower()
            if not _STAGE_NAME.match(name):
                raise _fail(ln, f"bad stage name {words[2]!r} (a letter, then letters, digits, _ . -)")
            if any(s.name == name for s in self.stages):
                raise _fail(ln, f"the stage name {name!r} is used twice")
        elif len(words) != 1:
            raise _fail(ln, "expected FROM IMAGE [AS NAME]")
        image = words[0]
        if not image:
            raise _fail(ln, f"names no image ({rest!r} expands to nothing: an ARG without a value?)")
        if len(self.stages) >= MAX_STAGES:
            raise _fail(ln, f"over {MAX_STAGES} stages")
        base = self.find_stage(image, len(self.stages)) if not image.isdigit() else None
        if base is not None:
            parent = next(s for s in self.stages if s.name == base[6:])
            ended = dict(parent.env)                          # that stage's env as it ended

            def base_env():
                return {**parent.base_env(), **ended}
        elif image == "scratch":
            base, base_env = "scratch", dict
        else:
            base = image
            base_env = (lambda: self.image_env(image)) if self.image_env else dict
        self.stages.append(_Stage(len(self.stages), name, base_env))
        self.add(From(base, f"FROM {word(image)}" + (f" AS {name}" if name else ""), ln.number))

    def do_ARG(self, ln: Line) -> None:
        if not ln.rest:
            raise _fail(ln, "needs a name (ARG NAME[=DEFAULT])")
        scope = self.stages[-1].scope() if self.stages else \
            {k: v for k, v in self.global_args.items() if v is not None}
        for decl in split_words(ln.rest, self.escape, ln.number):
            name, eq, default = decl.partition("=")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise _fail(ln, f"bad argument name {name!r}")
            value = self.expand(default, scope, ln.number) if eq else None
            if not self.stages:
                self.global_args[name] = self.build_args.get(name, value)
            else:
                if value is None and name in self.global_args:
                    value = self.global_args[name]          # ARG NAME in a stage: the global value
                self.stages[-1].args[name] = self.build_args.get(name, value)

    def narrowed(self, ln: Line, step: Policy | None) -> Policy | None:
        """A step's own --network within the build's (the caller's `network`): a Dockerfile is
        untrusted, so its flag may narrow what the build allows, never widen it (BuildKit asks
        for an --allow entitlement likewise). The build's deny rules stay on the step."""
        if step is None or step == self.network:
            return step
        if self.network is None:
            raise _fail(ln, f"--network={_show_policy(step)} needs the build's network: a step may only narrow "
                            "what the build allows (build with --network ...)")
        why = step.within(Grant(self.network.allow))
        if why:
            raise _fail(ln, f"--network: {why.replace('this token may ask for', 'the build allows')}")
        return Policy(step.allow, tuple(dict.fromkeys(step.deny + self.network.deny)))

    def do_RUN(self, ln: Line) -> None:
        st = self.stage(ln)
        flags, rest = self.flags(ln, ("network",))
        if not rest:
            raise _fail(ln, "needs a command")
        if _HEREDOC.search(rest):
            raise _fail(ln, "heredocs (<<EOF) are not supported: put the script in the context and COPY it")
        network = self.network
        if "network" in flags:
            value = flags["network"]
            if value == "host":
                raise _fail(ln, "--network=host is not supported: give a policy (all, or an allow-list)")
            try:
                network = self.network if value == "default" else Policy.from_value(value)
            except InvalidInput as e:
                raise _fail(ln, e.message) from None
            network = self.narrowed(ln, network)
            if network is None:
                network = False     # off as written: a build-wide network given to the build never turns it on
        argv = self.json_form(rest)
        text = "RUN " + (json.dumps(argv, ensure_ascii=False) if argv is not None else rest)
        env = tuple((k, v) for k, v in st.args.items() if v is not None and k not in st.env)   # ENV wins
        self.add(Run(tuple(argv) if argv is not None else rest, text, ln.number, network, env))

    def do_COPY(self, ln: Line) -> None:
        st = self.stage(ln)
        flags, rest = self.flags(ln, ("from", "chown", "chmod"))
        if _HEREDOC.search(rest):
            raise _fail(ln, "heredocs (<<EOF) are not supported: put the file in the context")
        scope = st.scope()
        argv = self.json_form(rest)
        words = [self.expand(w, scope, ln.number) for w in argv] if argv is not None \
            else self.words(ln, rest, scope)
        if len(words) < 2:
            raise _fail(ln, "needs a source and a destination")
        srcs, dest = words[:-1], words[-1]
        if not dest:
            raise _fail(ln, "the destination is empty")
        kw: dict = {}
        texts = []
        if "from" in flags:
            frm = self.expand(flags["from"], scope, ln.number)
            if frm.lower() == st.name:
                raise _fail(ln, f"--from={frm} is this stage itself")
            try:
                # Copy.from_stage: an earlier stage's name (lower case) or index, else an image
                # reference as written (engine/builds/builds.py reads a stage name before an image)
                found = self.find_stage(frm, st.index)
                kw["from_stage"] = found[6:] if found else frm
            except InvalidInput as e:
                raise _fail(ln, f"--from={frm}: {e.message}") from None
            texts.append(f"--from={word(frm)}")
        if "chown" in flags:
            chown = self.expand(flags["chown"], scope, ln.number)
            if not _CHOWN.match(chown):
                raise _fail(ln, f"--chown={chown!r}: expected USER[:GROUP] (names or IDs)")
            kw["chown"] = chown
            texts.append(f"--chown={chown}")
        if "chmod" in flags:
            if not re.fullmatch(r"[0-7]{3,4}", flags["chmod"]):
                raise _fail(ln, f"--chmod={flags['chmod']!r}: expected an octal mode like 755")
            kw["chmod"] = int(flags["chmod"], 8)
            texts.append(f"--chmod={kw['chmod']:04o}")
        text = " ".join([ln.instruction] + texts + [word(w) for w in words])
        dir_dest = dest.endswith("/") or dest in (".", "..") or dest.endswith("/.")
        if "from_stage" in kw:
            paths = tuple("/" + posixpath.normpath("/" + s).lstrip("/") for s in srcs)
            if len(paths) > 1 and not dir_dest:
                raise _fail(ln, "several sources need a destination ending in /")
            self.add(Copy((), dest, text, ln.number, paths=paths, dest_is_dir=dir_dest or len(paths) > 1, **kw))
            return
        for s in srcs:
            if _URL.match(s):
                raise _fail(ln, f"{s!r}: sources from URLs are not supported (download in a RUN step with "
                                "--network, so the network policy applies)")
        if self.context is None:
            raise _fail(ln, "needs a build context (sandtree build CONTEXT)")
        try:
            sources = self.context.select(srcs, line=ln.number)
        except InvalidInput as e:            # the context's error, said as this instruction's
            text = e.message.removeprefix(f"line {ln.number}: ").removeprefix("COPY ")
            raise type(e)(f"line {ln.number}: {ln.instruction}: {text}",
                          **{**e.details, "line": ln.number, "instruction": ln.instruction}) from None
        roots = source_roots(sources)
        if len(roots) > 1 and not dir_dest:
            raise _fail(ln, f"{len(roots)} sources need a destination ending in /")
        unpack = False
        if ln.instruction == "ADD":
            try:
                archives = [r for r in roots if r.kind == "file" and self.context.is_archive(r.path)]
            except InvalidInput as e:
                raise _fail(ln, e.message) from None
            if archives and len(archives) != len(roots):
                raise _fail(ln, "mixes tar archives (which ADD unpacks) with other sources: one ADD per archive")
            unpack = bool(archives)
        self.add(Copy(sources, dest, text, ln.number, unpack=unpack,
                      dest_is_dir=dir_dest or len(roots) > 1, **kw))

    do_ADD = do_COPY

    def pairs(self, ln: Line, what: str) -> list[tuple[str, str]]:
        """ENV/LABEL's `K=V K2="v 2"` (or the old `K V...` form), expanded with the scope before the line."""
        if not ln.rest:
            raise _fail(ln, f"needs {what} (K=V)")
        scope = self.stage(ln).scope()
        words = split_words(ln.rest, self.escape, ln.number)
        if "=" not in words[0]:                          # ENV K the rest of the line
            if len(words) < 2:
                raise _fail(ln, f"{words[0]!r} needs a value ({ln.instruction} K=V)")
            value = ln.rest[len(words[0]):].strip()
            return [(self.expand(words[0], scope, ln.number), self.expand(value, scope, ln.number))]
        out = []
        for w in words:
            k, eq, v = w.partition("=")
            if not eq:
                raise _fail(ln, f"{w!r} is not K=V")
            k = self.expand(k, scope, ln.number)
            if not k:
                raise _fail(ln, f"an empty name in {w!r}")
            out.append((k, self.expand(v, scope, ln.number)))
        return out

    def do_ENV(self, ln: Line) -> None:
        pairs = self.pairs(ln, "a variable")
        st = self.stages[-1]
        st.env.update(pairs)
        self.add(Configure((("env", tuple(pairs)),), "ENV " + " ".join(f"{k}={quote(v)}" for k, v in pairs),
                           ln.number))

    def do_LABEL(self, ln: Line) -> None:
        pairs = self.pairs(ln, "a label")
        self.add(Configure((("labels", tuple(pairs)),),
                           "LABEL " + " ".join(f"{quote(k)}={quote(v)}" for k, v in pairs), ln.number))

    def one_word(self, ln: Line) -> str:
        st = self.stage(ln)
        if not ln.rest:
            raise _fail(ln, "needs a value")
        value = self.expand(ln.rest, st.scope(), ln.number)
        if not value:
            raise _fail(ln, f"{ln.rest!r} expands to nothing")
        return value

    def do_WORKDIR(self, ln: Line) -> None:
        value = self.one_word(ln)
        # as written: the engine joins a relative one to the image's current WORKDIR (the base
        # image's included, which a parser cannot know), as the Python builder's workdir() does
        self.add(Configure((("cwd", value),), f"WORKDIR {word(value)}", ln.number))

    def do_USER(self, ln: Line) -> None:
        value = self.one_word(ln)
        if not _CHOWN.match(value):
            raise _fail(ln, f"{value!r}: expected USER[:GROUP] (names or IDs)")
        self.add(Configure((("user", value),), f"USER {value}", ln.number))

    def argv(self, ln: Line) -> tuple[tuple[str, ...], str]:
        self.stage(ln)
        if not ln.rest:
            raise _fail(ln, "needs a command")
        argv = self.json_form(ln.rest)
        if argv is not None:
            return tuple(argv), f"{ln.instruction} {json.dumps(argv, ensure_ascii=False)}"
        return ("/bin/sh", "-c", ln.rest), f"{ln.instruction} {ln.rest}"

    def do_CMD(self, ln: Line) -> None:
        argv, text = self.argv(ln)
        self.stages[-1].cmd_set = True
        self.add(Configure((("cmd", argv),), text, ln.number))

    def do_ENTRYPOINT(self, ln: Line) -> None:
        argv, text = self.argv(ln)
        # Docker: an ENTRYPOINT drops the CMD the base image had, unless this stage set one
        changes = (("entrypoint", argv),) + ((("cmd", None),) if not self.stages[-1].cmd_set else ())
        self.add(Configure(changes, text, ln.number))

    def do_EXPOSE(self, ln: Line) -> None:
        words = self.words(ln, ln.rest, self.stage(ln).scope())
        if not words:
            raise _fail(ln, "needs a port (EXPOSE 8080 or 8080/tcp)")
        ports: list[str] = []
        for w in words:
            m = _PORT.match(w)
            lo = int(m.group(1)) if m else 0
            hi = int(m.group(2) or lo) if m else 0
            if not m or not (1 <= lo <= hi <= 65535):
                raise _fail(ln, f"{w!r} is not a port (1-65535), a range, with /tcp, /udp or /sctp")
            if hi - lo >= _MAX_PORTS:
                raise _fail(ln, f"{w!r}: at most {_MAX_PORTS} ports in a range")
            proto = (m.group(3) or "tcp").lower()
            ports += [f"{p}/{proto}" for p in range(lo, hi + 1)]
        self.add(Configure((("expose", tuple(ports)),), "EXPOSE " + " ".join(ports), ln.number))

    # ---- the whole --------------------------------------------------------------------------------------
    def dispatch(self, ln: Line) -> None:
        if ln.instruction in SUPPORTED:
            if ln.instruction != "ARG" and not self.stages and ln.instruction != "FROM":
                raise _fail(ln, "comes before the first FROM (only ARG may)")
            getattr(self, "do_" + ln.instruction)(ln)
        elif ln.instruction in _DOCKER_ONLY:
            raise _fail(ln, f"{ln.instruction} is not supported by sandtree build "
                            f"(supported: {', '.join(SUPPORTED)})")
        else:
            raise InvalidInput(f"line {ln.number}: unknown instruction {ln.instruction[:40]!r}",
                               line=ln.number, instruction=ln.instruction[:40])

    def recipe(self, target: str | None) -> Recipe:
        if not self.stages:
            raise InvalidInput("the Dockerfile has no FROM")
        index = -1
        if target is not None:
            found = [s.index for s in self.stages if s.name == target.lower()]
            if not found:
                raise InvalidInput(f"--target {target!r}: no stage has that name "
                                   f"(stages: {', '.join(s.name or str(s.index) for s in self.stages)})")
            index = found[0]
        return Recipe(tuple(Stage(s.name, tuple(s.steps)) for s in self.stages), index,
                      self.context.root if self.context else None, tuple(sorted(self.build_args.items())))


def parse(text: str, *, context: BuildContext | None = None, build_args: dict | None = None,
          target: str | None = None, network=None, image_env=None) -> Recipe:
    """The Recipe a Dockerfile describes. `network`: the build-wide policy value of the RUN steps
    without --network (None: off). `image_env(ref) -> dict` (optional): a base image's configured
    environment, so `ENV PATH=/x:$PATH` expands as Docker would; without it a base image's env is
    unknown (empty) to expansion. Bad input: InvalidInput naming the line."""
    directives, lines = directives_and_lines(text)
    p = _Parser(context, build_args, network, directives.get("escape", "\\"), image_env)
    for ln in lines:
        p.dispatch(ln)
    return p.recipe(target)
