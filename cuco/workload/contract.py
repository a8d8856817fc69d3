"""What a workload's reference.py defines, checked when the workload loads.

The judge calls five functions of reference.py; a typo in a name or a parameter list used to surface only inside
an evaluation, as a traceback from the judge. `check_contract` reads the file's syntax (nothing of it runs) and
names the function and line that break the contract, so `load_workload` refuses the workload at once.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from cuco.errors import CucoError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RankView:
    """One rank's place in a timing of the reference (compute_alone, comm_alone): the shape's parameters, the world,
    this rank, every rank's inputs (parameters included), this rank's buffers as the candidate would get them, and
    the process group of the collective (NCCL on GPUs, gloo on CPUs; None for the compute alone)."""

    params: dict[str, int]
    world: int
    rank: int
    inputs: list[dict[str, torch.Tensor]]
    bufs: dict[str, torch.Tensor] = field(default_factory=dict)
    group: Any = None

    @property
    def mine(self) -> dict[str, torch.Tensor]:
        return self.inputs[self.rank]


@dataclass(frozen=True)
class Function:
    """One function of the contract: its parameters, and whether a workload may leave it out."""

    params: tuple[str, ...]
    required: bool
    why: str

    def signature(self, name: str) -> str:
        return f"{name}({', '.join(self.params)})"


CONTRACT: dict[str, Function] = {
    "make_inputs": Function(("p", "world", "rank", "gen", "device"), True, "a run's fresh inputs"),
    "make_parameters": Function(("p", "world", "rank", "gen", "device"), False, "the weights, drawn once per shape"),
    "reference": Function(("p", "world", "rank", "inputs"), True, "the outputs every candidate is checked against"),
    "compute_alone": Function(("view",), False, "the bound's compute, timed alone"),
    "comm_alone": Function(("view",), False, "the bound's collective, timed alone"),
}


@dataclass(frozen=True)
class Reference:
    """reference.py as the judge uses it: the two functions every workload has and the three it may leave out."""

    module: ModuleType  # the file itself, for its helpers (a workload's routing, its page table)
    make_inputs: Callable[..., dict[str, torch.Tensor]]
    reference: Callable[..., dict[str, torch.Tensor]]
    make_parameters: Callable[..., dict[str, torch.Tensor]] | None = None
    compute_alone: Callable[[RankView], Callable[[], Any]] | None = None
    comm_alone: Callable[[RankView], Callable[[], Any]] | None = None

    @classmethod
    def of(cls, module: ModuleType) -> Reference:
        return cls(module, **{name: getattr(module, name, None) for name in CONTRACT})


def _positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int | None]:
    """How many positional arguments fn accepts: (fewest, most; None for *args)."""
    args = fn.args.posonlyargs + fn.args.args
    most = None if fn.args.vararg else len(args)
    return len(args) - len(fn.args.defaults), most


def check_contract(path: Path) -> None:
    """Raises a CucoError naming reference.py's line whose function breaks the contract: a required one missing,
    or one that cannot be called with the contract's arguments. Names bound otherwise (imported, assigned) pass."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise CucoError(f"{path}:{exc.lineno or 0}", f"invalid Python: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CucoError(str(path), f"cannot read: {exc}") from None
    defined = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    bound = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    bound |= {a.asname or a.name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
              for a in node.names}
    for name, fn in CONTRACT.items():
        node = defined.get(name)
        if node is None:
            if fn.required and name not in bound:
                raise CucoError(str(path), f"defines no {fn.signature(name)} ({fn.why})")
            continue
        fewest, most = _positional(node)
        if fewest > len(fn.params) or (most is not None and most < len(fn.params)):
            raise CucoError(f"{path}:{node.lineno}", f"{name} takes {_count(fewest, most)}; the judge calls "
                                                     f"{fn.signature(name)}")


def _count(fewest: int, most: int | None) -> str:
    if most == fewest:
        return f"{fewest} argument{'s' * (fewest != 1)}"
    return f"{fewest} or more arguments" if most is None else f"{fewest} to {most} arguments"
