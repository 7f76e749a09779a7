import os

# Eight host devices for the sharding tests; harmless elsewhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
