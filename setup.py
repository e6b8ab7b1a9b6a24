"""Build hook only (the metadata is in pyproject.toml): the wheel carries conf/ and launchers/.

They stay at the top level of the repository, where users edit them, and are copied into
the built package as ddp_lab/_conf and ddp_lab/_launchers (found by ddp_lab/config/resources.py).
An editable install copies nothing: the package finds the checkout's folders.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED = ("conf", "launchers")


class BuildPyWithResources(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        for name in BUNDLED:
            self.copy_tree(name, str(Path(self.build_lib) / "ddp_lab" / f"_{name}"))


setup(cmdclass={"build_py": BuildPyWithResources})
