import os

# Eight host devices, for tests that need several; harmless for the others.
# LLVM optimisation level 0: compiling dominates most tests (tiny shapes),
# and it takes about half as long at this level. XLA's graph passes are
# unchanged; the suite passes at this level and at the default one.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8"
                      " --xla_backend_optimization_level=0")
