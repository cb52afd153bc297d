"""Builds lib@name@.so, a plain shared library (not a Python extension module), into the
package anychip_@name@, so that ``pip install .`` installs it where the entry point finds it."""
import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class build_plugin(build_ext):
    def get_ext_filename(self, ext_name):
        *package, name = ext_name.split(".")
        return os.path.join(*package, name + ".so")

    def get_export_symbols(self, ext):
        return []                       # only anychip_plugin_init is exported (no PyInit_*)


setup(
    ext_modules=[
        Extension(
            "anychip_@name@.lib@name@",
            sources=sorted(glob.glob("src/*.c")),  # each compiled on its own, linked into one library
            depends=sorted(glob.glob("src/*.h")) + ["include/anychip/plugin.h"],
            include_dirs=["include"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden"],
@{!collectives
            libraries=["pthread", "m"],
@}
@{collectives
            libraries=["pthread", "m", "rt"],     # rt: shm_open (in libc itself from glibc 2.34)
@}
        )
    ],
    cmdclass={"build_ext": build_plugin},
)
