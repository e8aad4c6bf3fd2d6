"""Build and load generated code: cpu (g++ and ctypes), cuda (CuPy RawModule), opencl.

Arrives with the backends; until then ``Program.load()`` raises
``StageNotImplemented``.
"""
