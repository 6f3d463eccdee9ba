from setuptools import find_packages, setup

setup(
    name="sglang-dflash",
    version="0.1.0",
    description="DFlash / DFlash 2 speculative decoding for SGLang 0.5.23, on GPU and CPU",
    package_dir={"": "python"},
    packages=find_packages("python"),
    include_package_data=True,
    package_data={
        "sglang_dflash": [
            "assets/tiny/*/*.json",
            "assets/tiny/*/*.safetensors",
            "assets/tiny/*/*.jinja",
            "assets/tiny/*/*.md",
            "assets/tiny/*.md",
            "assets/demo/*/*.json",
            "assets/demo/*/*.safetensors",
            "assets/demo/*.md",
            "assets/demo/*.json",
            "data/*.jsonl",
            "data/LICENSE.*",
            "data/README.md",
        ],
    },
    python_requires=">=3.10",
    install_requires=["sglang==0.5.23", "safetensors", "tokenizers"],
    extras_require={
        # Mooncake's non-CUDA transfer engine: the prefill-decode disaggregation test (CPU hosts).
        "test": ["pytest", "requests", "scipy", "matplotlib",
                 "mooncake-transfer-engine-non-cuda; platform_machine == 'x86_64'"],
        "bench": ["matplotlib"],
    },
    entry_points={
        "sglang.srt.plugins": ["sglang_dflash = sglang_dflash.adapter.plugin:register"],
        "console_scripts": ["sglang-dflash = sglang_dflash.cli:main"],
    },
)
