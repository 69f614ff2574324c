"""Tiny EAGLE-3 test pairs: a random fp32 Llama target and a head (random, or briefly trained).

Built from configs (no download). The trained head gets real acceptance on the tiny target, so
greedy/sampling/replay tests exercise accepted, rejected and bonus paths; a random head alone
would reject almost everything.
"""

from __future__ import annotations

import torch

from specdec.core.features import target_features
from specdec.models.eagle3.config import Eagle3Config
from specdec.models.eagle3.head import Eagle3Head

VOCAB = 103
EOS = 2


def tiny_target(seed: int = 0, *, num_layers: int = 4, hidden_size: int = 32, vocab_size: int = VOCAB,
                init_std: float = 0.5):
    """A random ``LlamaForCausalLM`` (fp32, eval, CPU): ``num_layers`` layers, 4 heads (2 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, initializer_range=init_std, bos_token_id=1,
                      eos_token_id=EOS, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def head_config(target, *, layer_type: str = "llama", draft_vocab_size: int | None = None,
                layer_ids=(1, 2, 4), num_layers: int = 1, **flags) -> Eagle3Config:
    """A speculators eagle3 config for ``target`` (same hidden size and vocabulary)."""
    t = target.config
    layer = {"model_type": layer_type, "hidden_size": t.hidden_size, "intermediate_size": 2 * t.hidden_size,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": t.hidden_size // 4,
             "vocab_size": t.vocab_size, "num_hidden_layers": num_layers, "rms_norm_eps": 1e-6,
             "max_position_embeddings": 512, "rope_theta": 10000.0}
    d = {"speculators_model_type": "eagle3", "transformer_layer_config": layer,
         "draft_vocab_size": draft_vocab_size or t.vocab_size,
         "eagle_aux_hidden_state_layer_ids": list(layer_ids) if layer_ids is not None else None, **flags}
    return Eagle3Config.from_dict(d)


def random_head(config: Eagle3Config, target, seed: int = 0, std: float = 0.2) -> Eagle3Head:
    """A head with random weights (norm weights random around 1), the target's embeddings, and
    (reduced vocabulary) a d2t/t2d mapping onto a random sorted subset of target ids that
    always includes the EOS id."""
    g = torch.Generator().manual_seed(seed)
    head = Eagle3Head(config)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight")
                    else std * torch.randn(p.shape, generator=g))
        head.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        if head.d2t is not None:
            V, Vd = config.target_vocab_size, config.draft_vocab_size
            rest = torch.randperm(V, generator=g)
            chosen = torch.cat([torch.tensor([EOS]), rest[rest != EOS][: Vd - 1]]).sort().values
            head.d2t.copy_(chosen - torch.arange(Vd))
            head.t2d.zero_()
            head.t2d[chosen] = True
    return head.eval()


#: the prompts the tests decode; the trained head is fitted to the target's rollouts of these
PROMPTS = ([5, 17, 33, 8, 91, 4], [60, 61, 62], [9, 99, 9, 99, 9, 99, 9], [44], [70, 12, 30, 2 + 1, 88])


def greedy_rollouts(target, prompts=PROMPTS, new_tokens: int = 40) -> list[torch.Tensor]:
    """Each prompt plus the target's greedy continuation (LongTensor ``[1, len + new_tokens]`` each)."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([list(p)])
            for _ in range(new_tokens):
                ids = torch.cat([ids, target(input_ids=ids, use_cache=False).logits[:, -1:].argmax(-1)], dim=1)
            out.append(ids)
    return out


def train_head(head: Eagle3Head, target, steps: int = 40, lr: float = 3e-2, seed: int = 0) -> Eagle3Head:
    """A few Adam steps of step-0 EAGLE training (speculators' TTT step 0: entry t reads
    ``x[t + 1]`` and the target features at t, and learns the target's argmax for ``x[t + 2]``) on
    the target's greedy rollouts of :data:`PROMPTS`. A random tiny target is not learnable in
    general, so the head is fitted to the sequences the tests decode: acceptance is high on the
    teacher-forced chain and partial beyond it (later draft steps feed the head's own state, which
    step-0 training never sees). Embeddings stay frozen. Seconds on a tiny pair."""
    torch.manual_seed(seed)
    ids = head.config.layer_ids_for(target.config.num_hidden_layers)
    data = []
    for seq in greedy_rollouts(target):
        logits, feats = target_features(target, seq, ids)
        labels = logits[:, 1:-1].argmax(-1)  # the target's choice for x[t + 2]
        if head.d2t is not None:  # in draft ids; target ids outside the draft vocabulary are ignored
            t2d_index = torch.full((head.t2d.shape[0],), -100, dtype=torch.long)
            t2d_index[head.t2d] = torch.arange(int(head.t2d.sum()))
            labels = t2d_index[labels]
        data.append((seq, feats.clone(), labels.clone()))
    opt = torch.optim.Adam([p for n, p in head.named_parameters() if not n.startswith("embed_tokens")], lr=lr)
    head.train()
    for _ in range(steps):
        loss = 0.0
        for seq, feats, labels in data:
            T = seq.shape[1]
            _, out = head(seq[:, 1:T - 1], head.combine(feats[:, :T - 2]), torch.arange(T - 2)[None], head.new_cache(1))
            loss = loss + torch.nn.functional.cross_entropy(out[0], labels[0], ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


def tiny_pair(seed: int = 0, *, trained: bool = True, **config_kwargs):
    """``(target, head)``: :func:`tiny_target` and a head for it (trained with :func:`train_head`)."""
    target = tiny_target(seed)
    head = random_head(head_config(target, **config_kwargs), target, seed=seed + 1)
    if trained:
        with torch.enable_grad():
            train_head(head, target, seed=seed)
    return target, head


#: bump when the tiny pair's recipe changes (invalidates the on-disk cache)
PAIR_VERSION = "v1"


def cached_pair(seed: int = 0, **config_kwargs):
    """:func:`tiny_pair`, with the trained head cached under ``<test cache>/test-cache`` (training costs
    seconds idle, minutes on a loaded 2-core machine); the cache goes through our own checkpoint I/O."""
    from filelock import FileLock

    from tests.support.cache import test_cache_dir

    from specdec.models.eagle3 import load_eagle3, save_eagle3

    key = "-".join([PAIR_VERSION, str(seed)] + [f"{k}={v}" for k, v in sorted(config_kwargs.items())])
    path = test_cache_dir() / "test-cache" / f"eagle3-tiny-{key}"
    target = tiny_target(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):  # pytest-xdist workers: one trains, the others wait and load
        if (path / "config.json").is_file():
            return target, load_eagle3(path)
        target, head = tiny_pair(seed, **config_kwargs)
        save_eagle3(head, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return target, head
