"""A replay night whose target continuations come from a running engine, as its own process, so a test can
watch every file it opens (``strace -f -e trace=open,openat``, and Python's ``open`` audit events): what the
nightly process does when an engine serves the target (not product code).

Usage: ``python -m tests.support.engine_night SPEC.json`` where the spec names ``target_dir`` (config and
tokenizer; its weight files may be there), ``draft_dir``, ``heldout``, ``engine_url``, ``engine`` (optional, the profile: ``llamacpp``), ``cache``, ``out``,
``k``, ``max_new_tokens``, ``limit``, ``kmax``, ``opens`` (where Python-level opens are listed).
"""

from __future__ import annotations

import json
import sys

from tests.support.store import model_store


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    opened: list[str] = []
    sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" and args else None)
    import torch

    from specdec import NgramDrafter, load_causal_lm
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.config import ValidationConfig
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.engines.profile import EngineEndpoint, EngineLimits
    from specdec.validation.engine_continuations import connect_engine
    from specdec.validation.heldout import load_heldout
    from specdec.validation.served_target import served_target

    torch.set_num_threads(1)
    draft = load_causal_lm(spec["draft_dir"], store=model_store())
    cfg = ValidationConfig(num_speculative_tokens=spec["k"], max_new_tokens=spec["max_new_tokens"], limit=spec["limit"],
                           warmup=False)
    engine = connect_engine(EngineEndpoint(url=spec["engine_url"], engine=spec.get("engine", "llamacpp")), EngineLimits())
    reports = validate(ValidationRequest(served_target(spec["target_dir"]), [NgramDrafter(), draft.model],
                                         load_heldout(spec["heldout"]), cfg, method="replay", engine=engine,
                                         cache=ContinuationCache(spec["cache"]), kmax=spec["kmax"]))
    engine.close()
    json.dump([r.to_dict() for r in reports], open(spec["out"], "w"))
    json.dump(opened, open(spec["opens"], "w"))


if __name__ == "__main__":
    main(sys.argv[1])
