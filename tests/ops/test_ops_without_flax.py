"""``lin_attn_jax.ops`` depends on JAX alone: it imports and runs with Flax
made unimportable."""

import os
import pathlib
import subprocess
import sys
import textwrap

import lin_attn_jax

_SCRIPT = textwrap.dedent("""
    import importlib.abc
    import sys

    class NoFlax(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name == "flax" or name.startswith("flax."):
          raise ImportError(f"{name} is blocked")
        return None

    sys.meta_path.insert(0, NoFlax())
    import jax.numpy as jnp
    import lin_attn_jax.ops as ops

    q = k = v = jnp.ones((1, 5, 2, 4))
    o, state = ops.chunk_gla(q, k, v, jnp.full((1, 5, 2, 4), -0.1),
                             output_final_state=True, chunk_size=2)
    assert o.shape == (1, 5, 2, 4) and state.shape == (1, 2, 4, 4)
    assert not [m for m in sys.modules if m.split(".")[0] == "flax"]
    try:
      import flax  # noqa: F401
    except ImportError:
      print("flax blocked")
""")


def _run(script):
  """Runs ``script`` in a fresh interpreter that imports this checkout's
  ``lin_attn_jax``."""
  root = str(pathlib.Path(lin_attn_jax.__file__).resolve().parents[1])
  path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
  return subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=600, check=False,
                        env={**os.environ, "PYTHONPATH": path})


def test_ops_import_and_run_without_flax():
  result = _run(_SCRIPT)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith("flax blocked"), result.stdout


def test_the_blocker_stops_a_flax_import():
  result = _run(_SCRIPT.replace("import lin_attn_jax.ops as ops",
                                "import lin_attn_jax.layers\n"
                                "import lin_attn_jax.ops as ops"))
  assert result.returncode != 0
  assert "flax is blocked" in result.stderr
