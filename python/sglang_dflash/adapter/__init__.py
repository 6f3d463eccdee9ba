"""The SGLang-facing layer. Everything that imports `sglang` lives here."""

from sglang_dflash import SGLANG_VERSION


def check_sglang_version() -> None:
    import sglang

    found = getattr(sglang, "__version__", "unknown")
    if found != SGLANG_VERSION:
        raise RuntimeError(
            f"sglang-dflash is built for sglang=={SGLANG_VERSION}, found {found}; "
            f"install the pinned version: pip install sglang=={SGLANG_VERSION}"
        )
