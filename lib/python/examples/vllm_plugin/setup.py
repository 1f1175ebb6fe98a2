# SPDX-License-Identifier: MIT
"""Build step of kvdmabuf-vllm (metadata: pyproject.toml): the licence as
this setuptools takes it, an SPDX expression from 77 on (License-
Expression; the table form is deprecated there), the text form before
(Debian 12 has 66). The same rule as lib/python/setup.py's."""
import setuptools

_major_minor = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
setuptools.setup(**({"license_expression": "MIT"}
                    if _major_minor >= (77, 0) else {"license": "MIT"}))
