"""Runs INSIDE the speculators venv (speculators 0.9.0, transformers <= 5.19): never imports specdec.

Usage:
    python speculators_side.py load DIR INPUTS OUT      # load DIR with speculators' own classes
    python speculators_side.py create DIR INPUTS OUT LAYER_TYPE  # random head, save_pretrained to DIR

INPUTS (torch.save dict): ``input_ids`` LongTensor [1, T] (the target ids x[1..T]),
``hidden_states`` float32 [1, T, 3 * hidden] (target features of positions 0..T-1), ``ttt_steps``,
and for ``create`` the sizes (``hidden``, ``vocab``, ``draft_vocab``, ``layer_ids``, ``seed``).
OUT (torch.save): ``logits`` float32 [ttt_steps, T, draft_vocab]: the logits of every TTT step of
``Eagle3DraftModel.forward`` (captured from its ``lm_head``), and ``versions``.
"""

from __future__ import annotations

import sys
from importlib.metadata import version

import torch


def _logits(model, inputs) -> torch.Tensor:
    """Every TTT step's lm_head output of speculators' own forward (it returns only argmax tokens)."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, a, out: seen.append(out.detach().float()))
    T = inputs["input_ids"].shape[1]
    with torch.no_grad():
        model.forward(hidden_states=inputs["hidden_states"], input_ids=inputs["input_ids"],
                      document_ids=torch.zeros(1, T, dtype=torch.long), ttt_steps=inputs["ttt_steps"])
    hook.remove()
    return torch.stack([s[0] for s in seen])


def load(path: str):
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(path)
    config.transformer_layer_config._attn_implementation = "eager"  # CPU; flex attention needs a GPU compile
    return Eagle3DraftModel.from_pretrained(path, config=config).eval()


def create(path: str, inputs: dict, layer_type: str):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig, Qwen3Config

    H, V, Vd = inputs["hidden"], inputs["vocab"], inputs["draft_vocab"]
    cls = Qwen3Config if layer_type == "qwen3" else LlamaConfig
    layer = cls(hidden_size=H, intermediate_size=2 * H, num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4,
                vocab_size=V, num_hidden_layers=1, rms_norm_eps=1e-6, max_position_embeddings=512)
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=Vd, norm_before_residual=layer_type == "qwen3",
        eagle_aux_hidden_state_layer_ids=inputs["layer_ids"],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])))
    torch.manual_seed(inputs["seed"])
    model = Eagle3DraftModel(config).eval()
    with torch.no_grad():  # embeddings and LM head come from the verifier in training; random here
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(0.2 * torch.randn(p.shape))
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[torch.randperm(V)[:Vd]] = True
        d2t = t2d.nonzero().flatten() - torch.arange(Vd)
        model.load_vocab_mappings(t2d, d2t)
    model.save_pretrained(path)
    return model


def main(argv: list[str]) -> None:
    mode, path, inputs_path, out_path = argv[:4]
    inputs = torch.load(inputs_path)
    model = load(path) if mode == "load" else create(path, inputs, argv[4])
    torch.save({"logits": _logits(model, inputs),
                "versions": {p: version(p) for p in ("speculators", "transformers", "torch")}}, out_path)


if __name__ == "__main__":
    main(sys.argv[1:])
