"""``python -m specdec.engines.vllm_install_cli`` (``make engine``, ``.ci/run``): install (or find) vLLM under this
home's engines directory; the entry point that reads ``SPECDEC_ENGINES_DIR`` (:mod:`specdec.engines.vllm_install`
takes the directory from its caller)."""

from __future__ import annotations


def main() -> int:
    """Install (or find) vLLM under ``CoreSettings.engines_dir`` (read here); one line on error. Returns the exit
    status (0, or 1 when the install failed)."""
    from specdec.engines import vllm_install
    from specdec.settings import get_settings

    return vllm_install.main(get_settings().engines_dir)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
