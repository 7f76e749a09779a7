"""The mesh axis names every layer of the package agrees on (JAX only).

``lin_attn_jax.sharding`` builds meshes and sharding rules over these axes;
the ops read them here, so that they import nothing from Flax.
"""

MESH_AXES = ("data", "fsdp", "tensor", "sequence")
# Mesh axes that split batch rows, and the one that splits the length.
BATCH_AXES = ("data", "fsdp")
SEQUENCE_AXIS = "sequence"
TENSOR_AXIS = "tensor"
