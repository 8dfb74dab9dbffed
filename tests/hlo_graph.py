"""A small reader of HLO text: instructions per computation, their operands and control edges.

Enough to ask "does this collective depend on that custom call, and feed that one?" of the
text `jax.jit(...).lower(...).compile().as_text()` or `lowered.as_text(dialect="hlo")` prints.
"""

from __future__ import annotations

import re

COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "all-reduce-start",
    "all-gather-start",
    "collective-permute-start",
    "ragged-all-to-all",
)
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_NAME = re.compile(r"%?([\w.\-]+)")


def _skip_type(rest: str) -> str:
    """`rest` after the instruction's result type (a shape or a parenthesized tuple)."""
    rest = rest.lstrip()
    if rest.startswith("("):
        depth = 0
        for i, c in enumerate(rest):
            depth += c == "("
            depth -= c == ")"
            if depth == 0:
                return rest[i + 1 :].lstrip()
    return rest.split(" ", 1)[1] if " " in rest else ""


def _call_args(rest: str) -> tuple[str, str, str]:
    """`(opcode, operand text, attribute text)` of `opcode(operands), attrs`."""
    m = re.match(r"([\w\-]+)\(", rest)
    if not m:
        return "", "", rest
    depth, start = 0, m.end() - 1
    for i in range(start, len(rest)):
        depth += rest[i] == "("
        depth -= rest[i] == ")"
        if depth == 0:
            return m.group(1), rest[start + 1 : i], rest[i + 1 :]
    return m.group(1), rest[start + 1 :], ""


def parse(text: str) -> dict[str, dict[str, dict]]:
    """`{computation: {instruction: {"op", "target", "deps"}}}` (deps: operands + control)."""
    comps: dict[str, dict[str, dict]] = {}
    cur = None
    for line in text.splitlines():
        if cur is None or line.startswith(("ENTRY", "%")) and line.rstrip().endswith("{"):
            m = _COMP.match(line)
            if m and "=" not in line.split("(")[0]:
                cur = comps.setdefault(m.group(2), {})
                continue
        if line.strip() == "}":
            cur = None
            continue
        if cur is None:
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, rest = m.group(2), _skip_type(m.group(3))
        op, operands, attrs = _call_args(rest)
        deps = {t for t in _NAME.findall(operands)}
        ctrl = re.search(r"control-predecessors=\{([^}]*)\}", attrs)
        if ctrl:
            deps |= set(_NAME.findall(ctrl.group(1)))
        target = re.search(r'custom_call_target="([^"]+)"', attrs)
        calls = set(re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", attrs))
        for group in re.findall(r"branch_computations=\{([^}]*)\}", attrs):
            calls |= set(_NAME.findall(group))
        cur[name] = {
            "op": op,
            "target": target.group(1) if target else None,
            "deps": deps,
            "calls": calls,
        }
    for comp in comps.values():
        for ins in comp.values():
            ins["deps"] &= comp.keys()
    return comps


def _closure(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        n = todo.pop()
        for d in edges[n]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def _holds(comps: dict, cname: str, target: str, seen: set[str]) -> bool:
    """Whether computation `cname` (or one it calls) holds a custom call to `target`."""
    if cname in seen or cname not in comps:
        return False
    seen.add(cname)
    return any(
        ins["target"] == target or any(_holds(comps, c, target, seen) for c in ins["calls"])
        for ins in comps[cname].values()
    )


def _is(comps: dict, ins: dict, target: str) -> bool:
    """The instruction is a custom call to `target`, or calls a computation that makes one
    (e.g. a `conditional` whose branch holds a host callback)."""
    return ins["target"] == target or any(_holds(comps, c, target, set()) for c in ins["calls"])


def check_bracketed(text: str, arrive: str, done: str) -> tuple[int, list[str]]:
    """`(collectives seen, problems)`: each collective must follow an `arrive` custom call
    and precede a `done` one in its computation (through data or control edges)."""
    problems, seen = [], 0
    comps = parse(text)
    for cname, comp in comps.items():
        deps = {n: ins["deps"] for n, ins in comp.items()}
        users: dict[str, set[str]] = {n: set() for n in comp}
        for n, ins in comp.items():
            for d in ins["deps"]:
                users[d].add(n)
        for n, ins in comp.items():
            if ins["op"] not in COLLECTIVES:
                continue
            seen += 1
            before = _closure(deps, n)
            after = _closure(users, n)
            if not any(_is(comps, comp[k], arrive) for k in before):
                problems.append(f"{cname}/{n} ({ins['op']}) does not depend on {arrive}")
            if not any(_is(comps, comp[k], done) for k in after):
                problems.append(f"{cname}/{n} ({ins['op']}) does not feed {done}")
    return seen, problems


def entry_name(text: str) -> str:
    """The name of the module's entry computation."""
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and m.group(1):
            return m.group(2)
    raise ValueError("no ENTRY computation in this HLO text")


def entry_ops(text: str) -> dict[str, int]:
    """How many instructions of each opcode the module's entry computation holds."""
    out: dict[str, int] = {}
    for ins in parse(text)[entry_name(text)].values():
        out[ins["op"]] = out.get(ins["op"], 0) + 1
    return out


def count_collectives(text: str) -> dict[str, int]:
    """How many instructions of each collective opcode the module holds."""
    out: dict[str, int] = {}
    for comp in parse(text).values():
        for ins in comp.values():
            if ins["op"] in COLLECTIVES:
                out[ins["op"]] = out.get(ins["op"], 0) + 1
    return out
