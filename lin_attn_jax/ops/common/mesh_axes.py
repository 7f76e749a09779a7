"""The mesh axis names every layer of the package agrees on (JAX only).

``lin_attn_jax.sharding`` builds meshes and sharding rules over these axes;
the ops read them here, so that they import nothing from Flax.
"""

MESH_AXES = ("data", "fsdp", "expert", "tensor", "sequence")
# Mesh axes that split batch rows, and the one that splits the length. The
# expert axis splits batch rows outside the mixture-of-experts layers (data
# parallelism) and the experts inside them (expert parallelism).
BATCH_AXES = ("data", "fsdp", "expert")
SEQUENCE_AXIS = "sequence"
TENSOR_AXIS = "tensor"
EXPERT_AXIS = "expert"
