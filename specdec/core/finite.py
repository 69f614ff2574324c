"""Non-finite logits are a broken model, never an acceptance figure.

A model whose logits hold NaN (or +inf, or a row that is all -inf) gives garbage under greedy
(``argmax`` of NaN picks an arbitrary id: the other side then "rejects" everything and acceptance reads
0.000) and a ``RuntimeError`` from ``torch.multinomial`` under sampling. Every forward pass of the
decoding core (:mod:`specdec.core.kv`, the replay's teacher-forced pass) checks its logits here and
raises :class:`NonFiniteLogits` naming the model object and the first position; the validation entry
adds which side it is and which prompt (:class:`specdec.validation.runner.BrokenModel`).
"""

from __future__ import annotations

import torch


class NonFiniteLogits(RuntimeError):
    """``model`` produced logits that are NaN, +inf, or -inf over the whole vocabulary.

    Attributes:
        model: the module whose pass it was (``is``-compared by the caller to name the side).
        position: 0-based position (prompt tokens included) of the first token whose next-token
            distribution is not finite, i.e. the token the bad logits would have produced.
        row: the batch row it happened in (0 for one sequence).
    """

    def __init__(self, model, position: int, row: int = 0) -> None:
        self.model, self.position, self.row = model, int(position), int(row)
        name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        super().__init__(f"model {name} produced non-finite logits (NaN/inf) for token position {self.position}")


def bad_rows(logits: torch.Tensor) -> torch.Tensor:
    """Bool ``logits.shape[:-1]``: rows with a NaN or +inf, or with every entry -inf."""
    return torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1) | torch.isneginf(logits).all(-1)


def check_logits(model, logits: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """Raise :class:`NonFiniteLogits` when a (valid) row of ``logits`` is not finite.

    Args:
        logits: ``[B, n, V]`` (or ``[n, V]``). positions: LongTensor of ``logits.shape[:-1]``, the
            position each row predicts. valid: Bool of the same shape (padding slots are not checked:
            their logits are meaningless, and fully masked rows may legitimately be NaN); None = all.
    Costs one reduction over the logits and one host read per pass.
    """
    bad = bad_rows(logits)
    if valid is not None:
        bad = bad & valid
    if not bool(bad.any()):
        return
    if bad.dim() == 1:
        bad, positions = bad[None], positions.reshape(1, -1)
    rows, cols = bad.nonzero(as_tuple=True)
    pos = positions[rows, cols]
    first = int(pos.argmin())
    raise NonFiniteLogits(model, int(pos[first]), int(rows[first]))


def checked_argmax(model, logits: torch.Tensor, end: int) -> list[int]:
    """``logits.argmax(-1)`` as a list (``logits [n, V]``: row i predicts position ``end - n + 1 + i``), with the finiteness check of
    :func:`check_logits` folded into the same host read (one transfer per pass: the acceptance decision's).

    Raises:
        NonFiniteLogits: a row of ``logits`` is not finite.
    """
    out = torch.cat([logits.argmax(dim=-1), bad_rows(logits).any()[None].long()]).tolist()
    if out[-1]:
        n = logits.shape[0]
        check_logits(model, logits, torch.arange(end - n + 1, end + 1, device=logits.device))
    return out[:-1]


class DeferredChecks:
    """Finiteness checks of several passes, read back once (:meth:`check_pending`) instead of once per pass.

    ``defer(model, logits, positions, valid)`` queues what :func:`check_logits` takes; :meth:`check_pending`
    does one host read for all of them and raises the first pass's :class:`NonFiniteLogits`.
    """

    def defer(self, model, logits: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        self.__dict__.setdefault("_pending", []).append((model, logits, positions, valid))

    def check_pending(self) -> None:
        """One host read for every deferred check; raises :class:`NonFiniteLogits` for the first bad pass."""
        pending, self._pending = self.__dict__.get("_pending", []), []
        if not pending:
            return
        flags = torch.stack([(bad_rows(lg) if v is None else bad_rows(lg) & v).any() for _, lg, _, v in pending])
        if bool(flags.any()):
            for model, logits, positions, valid in pending:
                check_logits(model, logits, positions, valid)


class BrokenModel(RuntimeError):
    """A validation stopped because one side's model is broken (:class:`NonFiniteLogits`): the
    target or the draft, on which prompt, at which position. Never an acceptance figure.

    Attributes:
        side: ``"target"`` or ``"draft"``. prompt_id: the held-out prompt. position: as in
        :class:`NonFiniteLogits` (prompt tokens included).
    """

    def __init__(self, side: str, prompt_id: str, err: NonFiniteLogits) -> None:
        self.side, self.prompt_id, self.position = side, prompt_id, err.position
        name = getattr(getattr(err.model, "config", None), "_name_or_path", "") or type(err.model).__name__
        super().__init__(f"the {side} model is broken: non-finite logits (NaN/inf) on prompt {prompt_id!r}, first at "
                         f"token position {err.position} (prompt included); model {name}")

    @classmethod
    def naming(cls, err: NonFiniteLogits, target, prompt_ids: list[str]) -> "BrokenModel":
        """The side (``err.model is target``) and the prompt (``prompt_ids[err.row]``) of ``err``."""
        side = "target" if err.model is target else "draft"
        return cls(side, prompt_ids[min(err.row, len(prompt_ids) - 1)], err)
