"""The study's scenarios computed straight from the replica model, beside its numbers.

Scenarios (each on fresh replicas, like the study's restart blocks; one request at a time):

- cross-replica at ``N`` tokens: replica A serves a document of ``round(N / chunk)`` whole
  chunks plus a ``question_tokens`` question (cold); then replica B gets the same document
  with a new question of the same length. Pool off, B recomputes everything (a cold
  prefill); pool on, B loads the document from the pool and prefills only the question.
  Reported: B's TTFT (the study's median TTFT).
- six-turn session: turn 1's prompt is ``start_tokens``; each later turn's prompt is the
  previous one plus the previous reply (``output_tokens``) plus a new user message
  (``added_tokens``). Turn ``k+1`` is sent when turn ``k`` has finished (no think time).
  ``fixed`` sends every turn to replica A, ``alternating`` to A, B, A, ... Reported: the
  session's wall time, first request sent to last token received: the study's numbers are
  totals over the six turns (a mean per turn could not exceed a cold 128k prefill).

``compare(profile)`` returns ours vs the study's with the relative error; ``main()`` prints
it (``python -m sim.experiments.study``). The simulator issue scales the same scenarios up.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from sim.replica.model import ReplicaModel, ReplicaRequest
from sim.replica.profiles import STUDY_27B, Profile


@dataclass(frozen=True, slots=True)
class SessionShape:
    """How a study session grows: see the module docstring."""

    start_tokens: int
    added_tokens: int
    output_tokens: int
    turns: int = 6


# The fitted session shape (docs/model.md): each turn adds a 2,048-token user message and
# gets an 8-token reply. The totals leave room for little decode: with 16-token replies
# the 32k pool-on session comes out 9 % over, with 32-token ones 26 % over.
STUDY_ADDED_TOKENS = 2048
STUDY_OUTPUT_TOKENS = 8
STUDY_QUESTION_TOKENS = 64


def study_shape(start_tokens: int) -> SessionShape:
    return SessionShape(start_tokens, STUDY_ADDED_TOKENS, STUDY_OUTPUT_TOKENS)


def _keys(base: int) -> Iterator[int]:
    # Distinct, deterministic block keys per scenario stream; real keys are xxh3 hashes.
    return itertools.count(base)


def _pair(profile: Profile, pool_on: bool) -> tuple[ReplicaModel, ReplicaModel]:
    pool = profile.make_pool(enabled=pool_on)
    return ReplicaModel("a", profile, pool), ReplicaModel("b", profile, pool)


def cross_replica_ttft(
    profile: Profile, tokens: int, pool_on: bool, question_tokens: int = STUDY_QUESTION_TOKENS
) -> float:
    """TTFT on replica B for a document replica A has just served (see module docstring)."""
    a, b = _pair(profile, pool_on)
    blocks = max(1, round(tokens / profile.chunk_tokens))
    doc = tuple(itertools.islice(_keys(1 << 32), blocks))
    prompt = blocks * profile.chunk_tokens + question_tokens
    first = a.admit(ReplicaRequest(doc, prompt, 1, 0.0, "a"))
    second = b.admit(ReplicaRequest(doc, prompt, 1, first.finish_at, "b"))
    return second.ttft_s


def session_total(
    profile: Profile, shape: SessionShape, alternating: bool, pool_on: bool
) -> float:
    """Wall time of one session, first request to last token (see module docstring)."""
    a, b = _pair(profile, pool_on)
    stream = tuple(
        itertools.islice(
            _keys(2 << 32),
            (shape.start_tokens + shape.turns * (shape.added_tokens + shape.output_tokens))
            // profile.chunk_tokens,
        )
    )
    now = 0.0
    prompt = shape.start_tokens
    for turn in range(shape.turns):
        replica = b if alternating and turn % 2 else a
        chain = stream[: prompt // profile.chunk_tokens]
        plan = replica.admit(ReplicaRequest(chain, prompt, shape.output_tokens, now, str(turn)))
        now = plan.finish_at
        prompt += shape.output_tokens + shape.added_tokens
    return now


@dataclass(frozen=True, slots=True)
class Row:
    """One comparison: what, the study's value, ours, and the relative error."""

    scenario: str
    study: float
    ours: float
    unit: str = "s"

    @property
    def error(self) -> float:
        """Relative error for times; for percentages, the difference in points."""
        if self.unit == "%":
            return self.ours - self.study
        return (self.ours - self.study) / self.study


# The study's medians: TTFT and session totals in seconds; the fixed change in %.
STUDY_CROSS = {131072: (31.715, 0.605), 262144: (92.047, 0.790)}
STUDY_SESSIONS = {32768: (16.708, 10.821, 0.36), 131072: (73.220, 40.553, 0.34)}


def compare(profile: Profile = STUDY_27B) -> list[Row]:
    """Every study number beside the model's."""
    rows: list[Row] = []
    for tokens, (off, on) in STUDY_CROSS.items():
        k = tokens // 1024
        rows.append(Row(f"cross-replica {k}k, pool off", off,
                        cross_replica_ttft(profile, tokens, False)))
        rows.append(Row(f"cross-replica {k}k, pool on", on,
                        cross_replica_ttft(profile, tokens, True)))
    for start, (off, on, fixed_pct) in STUDY_SESSIONS.items():
        k = start // 1024
        shape = study_shape(start)
        alt_off = session_total(profile, shape, True, False)
        alt_on = session_total(profile, shape, True, True)
        rows.append(Row(f"session {k}k alternating, pool off", off, alt_off))
        rows.append(Row(f"session {k}k alternating, pool on", on, alt_on))
        rows.append(Row(f"session {k}k alternating, change", 100 * (on - off) / off,
                        100 * (alt_on - alt_off) / alt_off, "%"))
        fixed_off = session_total(profile, shape, False, False)
        fixed_on = session_total(profile, shape, False, True)
        rows.append(Row(f"session {k}k fixed, change", fixed_pct,
                        100 * (fixed_on - fixed_off) / fixed_off, "%"))
    return rows


def format_table(rows: list[Row]) -> str:
    """A plain-text table: scenario, study, ours, error (relative, or points for %)."""
    lines = [f"{'scenario':40} {'study':>9} {'ours':>9} {'error':>9}"]
    for r in rows:
        err = f"{r.error:+.2f} pt" if r.unit == "%" else f"{100 * r.error:+.2f} %"
        lines.append(f"{r.scenario:40} {r.study:9.3f} {r.ours:9.3f} {err:>9}")
    return "\n".join(lines)


def main() -> None:
    print(format_table(compare()))


if __name__ == "__main__":
    main()
