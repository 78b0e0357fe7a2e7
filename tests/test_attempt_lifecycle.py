"""The life of an attempt (timewheel/engine/attempt.py): the edges it may take, written out here
as the spec; ``Lifecycle.move`` refuses every other one, loudly, and changes nothing then; a
terminal stage leaves the books; the transitions that carry data set their fields with the
stage; no code elsewhere sets an attempt's fields; the picture is the same in the docs."""

from __future__ import annotations

import ast
import textwrap
from collections import deque
from pathlib import Path

import pytest

import timewheel
from timewheel.delivery.retry_policy import RetryDefaults
from timewheel.engine import attempt as attempt_module
from timewheel.engine.attempt import NEXT, TERMINAL, Attempt, IllegalTransition, Lifecycle, Stage
from timewheel.store.record import ClaimedTask, Started

S = Stage
# The spec: every edge an attempt may take, and no other.
EDGES = {
    (S.CLAIMED, S.WAITING_FOR_FLOW), (S.CLAIMED, S.HANDED_BACK),
    (S.WAITING_FOR_FLOW, S.ADMITTED), (S.WAITING_FOR_FLOW, S.PARKED),
    (S.WAITING_FOR_FLOW, S.SKIPPED), (S.WAITING_FOR_FLOW, S.HANDED_BACK),
    (S.ADMITTED, S.STARTED), (S.ADMITTED, S.SKIPPED), (S.ADMITTED, S.HANDED_BACK),
    (S.ADMITTED, S.WAITING_FOR_FLOW),  # a rated flow's permit went stale: it asks again
    (S.STARTED, S.SENT), (S.STARTED, S.HANDED_BACK),
    (S.STARTED, S.WAITING_FOR_FLOW),  # late for the start its rated flow logged: asks again
    (S.STARTED, S.ANSWERED),  # its record does not open here: failed, never sent
    (S.SENT, S.ANSWERED), (S.SENT, S.HANDED_BACK), (S.SENT, S.UNRECORDED),
    (S.SENT, S.WAITING_FOR_FLOW),  # held back at the write (not written): asks again, once
    (S.ANSWERED, S.RECORDED), (S.ANSWERED, S.UNRECORDED),
}
ENDS = {S.RECORDED, S.UNRECORDED, S.PARKED, S.SKIPPED, S.HANDED_BACK}
PACKAGE = Path(timewheel.__file__).parent
DESIGN = PACKAGE.parent / "docs" / "design.md"


def new_attempt(key: str = "k") -> Attempt:
    task = ClaimedTask(key=key, bucket=0, token="t", due_ms=0, execute_at_ms=0, created_ms=0,
                       attempts=0, max_attempts=5, backoff_ms=1000, timeout_ms=10_000,
                       url="http://127.0.0.1:9/", method="POST", flow="f")
    return Attempt.claimed(task, 0, batch_deadline_ms=30_000, lease_margin_ms=5000)


def path_to(stage: Stage) -> list[Stage]:
    """The stages after CLAIMED on a shortest way to ``stage`` along the spec's edges."""
    ways: dict[Stage, list[Stage]] = {S.CLAIMED: []}
    todo = deque([S.CLAIMED])
    while todo:
        here = todo.popleft()
        for a, b in sorted(EDGES, key=lambda edge: (edge[0].name, edge[1].name)):
            if a is here and b not in ways:
                ways[b] = [*ways[here], b]
                todo.append(b)
    return ways[stage]


def brought_to(stage: Stage) -> tuple[Lifecycle, Attempt]:
    lifecycle = Lifecycle()
    attempt = lifecycle.add(new_attempt())
    for step in path_to(stage):
        lifecycle.move(attempt, step)
    return lifecycle, attempt


def test_the_edges_are_the_spec() -> None:
    assert {(a, b) for a, nexts in NEXT.items() for b in nexts} == EDGES
    assert TERMINAL == ENDS


def test_every_stage_is_reached_and_every_attempt_can_end() -> None:
    assert {stage for stage in Stage if stage is S.CLAIMED or path_to(stage)} == set(Stage)
    for stage in set(Stage) - ENDS:
        assert any(b in ENDS for a, b in EDGES if a is stage), stage


def test_sent_again_only_through_waiting_for_its_flow() -> None:
    """Past SENT, the only way back is SENT -> WAITING_FOR_FLOW (held back before the write);
    from ANSWERED on (an answer came: it was written), nothing leads back to SENT or before."""
    def reachable(start: Stage, edges: set[tuple[Stage, Stage]]) -> set[Stage]:
        reached, todo = set(), [start]
        while todo:
            here = todo.pop()
            for a, b in edges:
                if a is here and b not in reached:
                    reached.add(b)
                    todo.append(b)
        return reached

    assert reachable(S.ANSWERED, EDGES) == {S.RECORDED, S.UNRECORDED}
    assert reachable(S.SENT, EDGES - {(S.SENT, S.WAITING_FOR_FLOW)}) == {
        S.ANSWERED, S.RECORDED, S.UNRECORDED, S.HANDED_BACK}
    assert [a for a, b in EDGES if b is S.SENT] == [S.STARTED]


def test_an_attempt_is_held_back_at_the_write_once() -> None:
    """``move`` counts an attempt's SENTs; Lifecycle.wait_again from a second SENT is refused
    (it is written then however long its connection takes). From STARTED it may ask again
    freely. Once in SENT, it counts as sent for good (its request may have been written)."""
    lifecycle, attempt = brought_to(S.SENT)
    assert (attempt.sends, attempt.sent, attempt.held_at_write) == (1, True, False)
    lifecycle.wait_again(attempt)
    assert (attempt.stage, attempt.sends, attempt.sent) == (S.WAITING_FOR_FLOW, 1, True)
    for step in (S.ADMITTED, S.STARTED):
        lifecycle.move(attempt, step)
    lifecycle.wait_again(attempt)  # late before the write: not a hold at the write
    for step in (S.ADMITTED, S.STARTED, S.SENT):
        lifecycle.move(attempt, step)
    assert (attempt.sends, attempt.held_at_write) == (2, True)
    with pytest.raises(IllegalTransition, match="held back at the write twice"):
        lifecycle.wait_again(attempt)
    assert attempt.stage is S.SENT


@pytest.mark.parametrize("stage", sorted(set(Stage) - ENDS, key=lambda s: s.name))
def test_a_move_along_no_edge_is_refused_and_changes_nothing(stage: Stage) -> None:
    for to in Stage:
        if (stage, to) in EDGES:
            continue
        lifecycle, attempt = brought_to(stage)
        counts = dict(lifecycle.counts)
        with pytest.raises(IllegalTransition, match=f"{stage.value} -> {to.value}"):
            lifecycle.move(attempt, to)
        assert attempt.stage is stage and attempt in lifecycle.live
        assert dict(lifecycle.counts) == counts == {**dict.fromkeys(counts, 0), stage: 1}


@pytest.mark.parametrize("stage", sorted(ENDS, key=lambda s: s.name))
def test_a_terminal_stage_leaves_the_books_for_good(stage: Stage) -> None:
    lifecycle, attempt = brought_to(stage)
    assert attempt.stage is stage
    assert len(lifecycle) == 0 and attempt not in lifecycle.live
    assert set(lifecycle.counts.values()) == {0}
    for to in Stage:
        with pytest.raises(IllegalTransition):
            lifecycle.move(attempt, to)
    with pytest.raises(IllegalTransition):
        lifecycle.add(attempt)  # nor does it come back


def test_only_an_added_attempt_moves_and_only_once_added() -> None:
    lifecycle, stranger = Lifecycle(), new_attempt()
    with pytest.raises(IllegalTransition, match="claimed -> waiting for its flow"):
        lifecycle.move(stranger, S.WAITING_FOR_FLOW)
    assert stranger.stage is S.CLAIMED and len(lifecycle) == 0
    lifecycle.add(stranger)
    with pytest.raises(IllegalTransition, match="added in stage claimed"):
        lifecycle.add(stranger)
    assert len(lifecycle) == 1 and lifecycle.counts[S.CLAIMED] == 1


def test_the_transitions_with_data_set_their_fields_with_the_stage() -> None:
    lifecycle = Lifecycle()
    attempt = lifecycle.add(new_attempt())
    retry, started = RetryDefaults(max_attempts=3), Started(1, [], b"")
    with pytest.raises(IllegalTransition):
        lifecycle.admit(attempt, "p", 7, retry, rated=True)  # not waiting: nothing changes
    assert (attempt.stage, attempt.permit, attempt.start_ms) == (S.CLAIMED, None, 0)

    lifecycle.wait_for_flow(attempt, park_by_ms=900)
    attempt.ask_for("asked")
    assert (attempt.stage, attempt.park_by_ms, attempt.permit) == (
        S.WAITING_FOR_FLOW, 900, "asked")
    lifecycle.admit(attempt, "granted", 7, retry, rated=True)
    assert (attempt.stage, attempt.permit, attempt.start_ms, attempt.retry, attempt.rated) == (
        S.ADMITTED, "granted", 7, retry, True)
    lifecycle.start(attempt, started)
    assert (attempt.stage, attempt.started) == (S.STARTED, started)
    assert attempt.drop_permit() == "granted" and attempt.drop_permit() is None


# -- no code elsewhere sets an attempt's fields --------------------------------------------------

# The fields of Attempt that change after its claim. Not ``retry`` nor ``rated``: FlowState has
# fields of those names, which flow_gate.py sets (an attempt's are set in Lifecycle.admit).
CHANGING = {"stage", "permit", "start_ms", "started", "park_by_ms", "sends"}


def assignments(source: str) -> list[str]:
    """``name.field`` for every assignment to one of CHANGING on an object other than self."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if (isinstance(part, ast.Attribute) and part.attr in CHANGING
                            and not (isinstance(part.value, ast.Name)
                                     and part.value.id == "self")):
                        found.append(ast.unparse(part))
    return found


def test_no_code_outside_attempt_py_sets_an_attempts_fields() -> None:
    home = Path(attempt_module.__file__)
    found = {str(path.relative_to(PACKAGE)): assignments(path.read_text())
             for path in PACKAGE.rglob("*.py") if path != home}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_check_sees_an_assignment() -> None:
    """Control: plain, tuple and augmented assignments are found; self's own are not."""
    source = ("attempt.stage = x\na.permit, b.other = p, q\nattempt.start_ms += 1\n"
              "self.started = True\n")
    assert assignments(source) == ["attempt.stage", "a.permit", "attempt.start_ms"]


# -- one picture ---------------------------------------------------------------------------------

def picture(text: str) -> str:
    """The indented block that starts with the line holding CLAIMED and HANDED_BACK."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines)
                 if line.startswith("    ") and "CLAIMED ─" in line and "HANDED_BACK" in line)
    block = []
    for line in lines[first:]:
        if line and not line.startswith("    "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip("\n")


def test_the_picture_is_the_same_in_the_docs() -> None:
    drawn = picture(attempt_module.__doc__ or "")
    assert drawn.count("\n") > 10 and "ANSWERED" in drawn
    assert picture(DESIGN.read_text()) == drawn
