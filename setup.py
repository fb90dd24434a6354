"""Packaging beyond pyproject.toml: `prompts/` (task files, kept at the top level of the
checkout) ships inside the wheel as the package data `kvphase/_prompts`, where
`kvphase.defaults.prompts_dir` finds it in an installed copy."""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["kvphase", "kvphase.*"]) + ["kvphase._prompts"],
    package_dir={"kvphase._prompts": "prompts"},
    package_data={"kvphase._prompts": ["*.toml", "*.txt"]},
)
