"""Gemma 4 on WebGPU, driven from Python (Pyodide in the browser, CPython natively).

Everything in this package except `pyapp.reference` (numpy) and `pyapp.gpu.native`
(wgpu-py) is standard-library only, so it runs unchanged inside Pyodide.
"""

__version__ = "0.1.0"
