"""The drafter protocol's target features (what an EAGLE-3 head reads), B = 1 and batched.

A drafter that sets ``target_layer_ids`` gets, at every ``accept``, the target's hidden states of
the positions that pass fed and how many are verified. Chaining each step's verified positions
must give exactly the teacher-forced hidden states of ``prompt + output[:-1]`` (vLLM's index
semantics: HF ``hidden_states[i]`` for i < L, the pre-norm last-layer output for i = L; see
specdec.core.features), for every row of a left-padded batch too; greedy output stays the
target's; and a drafter that asks for nothing costs nothing (no feature hooks are installed).
"""

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate

GREEDY = SamplingConfig()
LAYER_IDS = (0, 2, 1)  # embeddings, last layer's output before the final norm, input of layer 1 (order is kept)
NEW_TOKENS = 24


class FeatureRecorder(NgramDrafter):
    """Prompt lookup that asks for target features, drafts nothing until it has received some
    (as a head does at the prefill step), and keeps every row's verified features in order."""

    target_layer_ids = LAYER_IDS

    def start(self, contexts):
        super().start(contexts)
        self.rows = list(range(len(contexts)))  # active row -> original row
        self.verified = {b: [] for b in self.rows}
        self.steps = 0

    def propose(self, contexts, limits, *args):
        limits = limits if self.steps else [0] * len(limits)
        return super().propose(contexts, limits, *args)

    def accept(self, num_accepted, next_tokens, features=None):
        assert features is not None
        self.steps += 1
        for i, b in enumerate(self.rows):
            n_fed, n_ver = int(features.num_fed[i]), int(features.num_verified[i])
            assert 0 < n_ver <= n_fed <= features.hidden.shape[1]
            self.verified[b].append(features.hidden[i, :n_ver])

    def select(self, rows):
        self.rows = [self.rows[i] for i in rows.tolist()]


def _prompt(n: int) -> list[int]:
    return ([10, 11, 12, 13, 14] * (n // 5 + 1))[:n]


def _teacher_forced(target, ids: list[int]) -> torch.Tensor:
    """HF ``hidden_states[i]`` for i < L; for i = L the pre-norm state (vLLM's), i.e. HF's
    ``hidden_states[L]`` with the final norm undone is not possible, so it is read by a hook."""
    from specdec.core.features import target_features

    out = target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    feats = target_features(target, torch.tensor([ids]), LAYER_IDS)[1][0]
    H, L = out.hidden_states[0].shape[-1], len(out.hidden_states) - 1
    for j, i in enumerate(LAYER_IDS):
        if i < L:
            assert torch.allclose(feats[:, j * H:(j + 1) * H], out.hidden_states[i][0], atol=1e-5)
    return feats


@pytest.mark.parametrize("k", [1, 4])
def test_b1_features_are_the_teacher_forced_hidden_states(target, k):
    prompt = _prompt(13)
    drafter = FeatureRecorder()
    out = speculative_generate(target, drafter, torch.tensor([prompt]), num_speculative_tokens=k,
                               max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    ref = autoregressive_generate(target, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    assert out.token_ids == ref.token_ids
    assert out.stats.num_draft_tokens > 0  # the lookup drafted after the first step
    got = torch.cat(drafter.verified[0])
    want = _teacher_forced(target, prompt + out.token_ids[:-1])
    assert got.shape == want.shape == (len(prompt) + NEW_TOKENS - 1, 3 * target.config.hidden_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_batch_features_are_each_rows_teacher_forced_hidden_states(target):
    prompts = [_prompt(n) for n in (3, 17, 8)]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    drafter = FeatureRecorder()
    out = speculative_generate(target, drafter, ids, mask, num_speculative_tokens=3, max_new_tokens=NEW_TOKENS,
                               sampling=GREEDY)
    for b, (p, row) in enumerate(zip(prompts, out.rows)):
        got = torch.cat(drafter.verified[b])
        fed = p + row.token_ids[:-1]
        torch.testing.assert_close(got, _teacher_forced(target, fed), rtol=1e-4, atol=1e-4)


def test_no_hidden_states_unless_asked(target, monkeypatch):
    import specdec.core.features as features

    captures = []  # feature hooks (specdec.core.features.capture_features) installed per target pass
    real = features.capture_features
    monkeypatch.setattr(features, "capture_features", lambda *a, **kw: (captures.append(a[1]), real(*a, **kw))[1])
    passes = []
    hook = target.register_forward_pre_hook(lambda m, a, kw: passes.append(1), with_kwargs=True)
    try:
        ids = torch.tensor([_prompt(12)])
        speculative_generate(target, NgramDrafter(), ids, num_speculative_tokens=3, max_new_tokens=8, sampling=GREEDY)
        speculative_generate(target, NgramDrafter(), ids.repeat(2, 1), num_speculative_tokens=3, max_new_tokens=8,
                             sampling=GREEDY)
        assert passes and not captures
        passes.clear()
        speculative_generate(target, FeatureRecorder(), ids, num_speculative_tokens=3, max_new_tokens=8,
                             sampling=GREEDY)
        assert passes and len(captures) == len(passes)
    finally:
        hook.remove()


def test_layer_ids_out_of_range(target):
    class Bad(FeatureRecorder):
        target_layer_ids = (target.config.num_hidden_layers + 1,)

    with pytest.raises(ValueError, match="target_layer_ids"):
        speculative_generate(target, Bad(), torch.tensor([_prompt(5)]), num_speculative_tokens=2, max_new_tokens=4,
                             sampling=GREEDY)
