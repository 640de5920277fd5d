"""What the planner's searches share: the one budget, and the genome vocabulary of the hybrid that its screen
reads too (blocks, owners, scored candidates).

The budget is made once, by `make_plan`, from `--budget` and `--max-evals`; every stage (the ILP's tables and
MILPs, the hybrid, its screen) takes it or a part of it (`first`, `from_now`, `at_least`, `for_search`) and
asks it (`remaining_s`, `spent`, `within`) instead of carrying seconds or deadlines of its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hetrl_cli.artifacts.rl import TaskName

if TYPE_CHECKING:
    from hetrl_cli.planner.space import DeviceClass
    from hetrl_cli.planner.tables import GroupOption, Tables

Subset = tuple[TaskName, ...]
IDLE = -1
"""The owner of a block no group takes."""
STEP_RESERVE_SHARE = 0.05
"""Budget: the reserve is at most this share of the budget (one slow outlier step cannot stop the search)."""
MIN_STAGE_S = 0.1
"""The least a stage gets when the budget is already spent, so it can still answer."""


class Budget:
    """Evaluations and/or wall-clock seconds from `start`; `spent()` says when a search stops. A step that
    starts is finished, so the seconds stop one step early: `spent()` is true once the longest step so far
    (the gaps between `count()` calls) would cross the deadline. The longest, not a recent one: on 1024
    devices most evaluations take 0.1-0.3 s, but one that meets a new device set builds its tables for up to
    a second. Each budget counts its own evaluations; the parts made from it start at 0."""

    def __init__(self, budget_s: float | None, max_evals: int | None = None, *, start: float | None = None) -> None:
        now = time.monotonic()
        self.start = now if start is None else start
        self.budget_s = budget_s
        self.deadline = None if budget_s is None else self.start + budget_s
        self.max_evals = max_evals
        self.evals = 0
        self._last = now
        self.longest_step = 0.0
        self.cap: int | None = None
        """A hard stop on evaluations below `max_evals`: a stage of an anytime search sizes its shares by its
        nominal `max_evals` and stops at the cap, so a smaller cap runs a prefix of the same steps."""
        self.found: Callable[[], bool] | None = None
        """A search that must find a plan past its budget stops once this says it has one."""

    # --- questions ---------------------------------------------------------------------------------

    def remaining_s(self) -> float:
        """Seconds to the deadline (negative once past it; inf without one)."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def count(self) -> None:
        """One evaluation starts: count it and remember how long the step since the last one took."""
        now = time.monotonic()
        self.longest_step = max(self.longest_step, now - self._last)
        self._last = now
        self.evals += 1

    def spent(self) -> bool:
        """Whether a search stops: the evaluations are used up, or the next step would cross the deadline."""
        if self.max_evals is not None and self.evals >= self.max_evals:
            return True
        if self.cap is not None and self.evals >= self.cap:
            return True
        if self.found is not None and self.found():
            return True
        if self.deadline is None:
            return False
        step = min(self.longest_step, STEP_RESERVE_SHARE * self.budget_s)
        return time.monotonic() + step >= self.deadline

    def within(self, share: float) -> bool:
        """Whether less than `share` of the budget (evaluations and seconds) is spent, and neither the cap nor
        the deadline is reached (a stage's deadline can be earlier than its nominal seconds)."""
        if self.max_evals is not None and self.evals >= share * self.max_evals:
            return False
        if self.cap is not None and self.evals >= self.cap:
            return False
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return False
        return self.budget_s is None or time.monotonic() - self.start < share * self.budget_s

    def used(self) -> float:
        """The share of the budget spent so far (the larger of evaluations and seconds; 0 when unbounded)."""
        evals = self.evals / self.max_evals if self.max_evals else 0.0
        seconds = (time.monotonic() - self.start) / self.budget_s if self.budget_s else 0.0
        return max(evals, seconds)

    # --- parts -------------------------------------------------------------------------------------

    def first(self, share: float) -> Budget:
        """The first `share` of the seconds, from the same start (the rest is kept for what follows)."""
        if self.budget_s is None:
            return Budget(None, self.max_evals, start=self.start)
        return Budget(self.budget_s * share, self.max_evals, start=self.start)

    def from_now(self) -> Budget:
        """What is left, as a budget starting now (at least MIN_STAGE_S seconds), so a stage's shares are of
        its own time."""
        out = Budget(
            None if self.deadline is None else max(MIN_STAGE_S, self.deadline - time.monotonic()), self.max_evals
        )
        out.cap = None if self.cap is None else max(0, self.cap - self.evals)
        return out

    def at_least(self, seconds: float) -> Budget:
        """This budget, its deadline moved to `seconds` from now where that is later (a fallback that must
        get a chance even when the budget is spent)."""
        if self.deadline is None:
            return self
        out = Budget(self.budget_s, self.max_evals, start=self.start)
        out.deadline = max(self.deadline, time.monotonic() + seconds)
        out.budget_s = out.deadline - out.start
        return out

    def for_search(self) -> Budget:
        """A search's own budget from now: its evaluations where they are counted (then only they count, so
        a seeded search gives the same plan on any machine), else the seconds left (`from_now`)."""
        if self.max_evals is not None:
            return Budget(None, self.max_evals)
        return self.from_now()


# --- genomes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """The unit a genome gives an owner: `size` devices from `start` of one sub-host of a device class."""

    cls: int
    host: int
    """Sub-host index within its class."""
    start: int
    size: int


@dataclass
class Candidate:
    """A scored genome (every block's owner group, or IDLE) with its groups' options (None: does not fit)."""

    genome: tuple[int, ...]
    score: float
    options: list[GroupOption] | None
    allowed: bool = True
    """False for a plan over --max-cost-per-hour: the search ranks it as any other, it is never the answer."""
    answer: float | None = None
    """The answer's value where the search is steered by another (`score`): seconds, under a cap, steered by
    $/iteration (api.run_hybrid)."""


class GenomeSearch(Protocol):
    """What the screen reads of the hybrid search: its classes, blocks and tables, and how it scores a genome."""

    tables: Tables
    classes: list[DeviceClass]
    blocks: list[Block]

    def devices_of(self, genome: Sequence[int], group: int) -> tuple[tuple[str, ...], tuple[str, ...]]: ...

    def evaluate(self, grouping: tuple[Subset, ...], genome: Sequence[int], budget: Budget) -> Candidate: ...
