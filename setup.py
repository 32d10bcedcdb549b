"""Build the Cython extension; all metadata lives in pyproject.toml.

Set FLASHMARL_LINETRACE=1 to compile with line tracing so coverage can see inside the .pyx.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

linetrace = os.environ.get("FLASHMARL_LINETRACE") == "1"
macros = [("CYTHON_TRACE_NOGIL", "1")] if linetrace else []
extensions = [
    Extension(
        "buffers.segment_tree",
        ["buffers/segment_tree.pyx"],
        define_macros=macros,
        extra_compile_args=["-O3"],
    )
]
setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "linetrace": linetrace},
    )
)
