import os

# Eight host devices, for tests that need several; harmless for the others.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
