"""Build and load generated code. ``cpu``: g++, a cached shared object, ctypes, numpy.

``Program.load()`` uses the runtime of the program's target; the cuda (CuPy
RawModule) and opencl (pyopencl) runtimes arrive with their backends.
"""
