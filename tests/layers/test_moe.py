"""The mixture-of-experts MLP against a per-token reference: a Python loop
over tokens with the top-k picked in NumPy (outputs, routing, the
load-balancing loss of transformers' formula), and gradients against the
same loop in ``jnp``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers.moe import MoE, load_balancing_loss

D, N = 12, 10
# The routers of the published models (layers/moe.py's table).
ROUTERS = {
    "qwen3_next": dict(n_experts=6, top_k=2, expert_dim=8, score="softmax",
                       normalize_topk=True, shared_dim=5, shared_gate=True),
    "kimi_deepseek": dict(n_experts=8, top_k=3, expert_dim=8,
                          score="sigmoid", selection_bias=True, n_groups=4,
                          topk_groups=2, normalize_topk=True,
                          routed_scale=2.5, shared_dim=6),
    "jamba": dict(n_experts=4, top_k=2, expert_dim=8, score="softmax"),
    "granite": dict(n_experts=5, top_k=2, expert_dim=8, score="softmax",
                    normalize_topk=True, shared_dim=4),
    "nemotron_h": dict(n_experts=8, top_k=2, expert_dim=8, activation="relu2",
                       score="sigmoid", selection_bias=True, n_groups=4,
                       topk_groups=2, normalize_topk=True, routed_scale=1.5,
                       shared_dim=6),
}


def make(name):
  layer = MoE(D, **ROUTERS[name], rngs=nnx.Rngs(3))
  if layer.selection_bias is not None:
    # A bias large enough to change the choice.
    bias = np.random.default_rng(1).normal(size=layer.n_experts) * 0.3
    layer.selection_bias[...] = jnp.asarray(bias, jnp.float32)
  return layer


def params_of(layer):
  """The layer's parameters by name (the reference's names)."""
  p = {k: getattr(layer, k)[...] for k in ("router", "gate", "up", "down")
       if getattr(layer, k) is not None}
  if layer.shared is not None:
    for k in ("gate", "up", "down"):
      if getattr(layer.shared, k) is not None:
        p["shared_" + k] = getattr(layer.shared, k).kernel[...]
  if layer.shared_gate is not None:
    p["shared_sigmoid"] = layer.shared_gate.kernel[...]
  return p


def reference_choice(layer, x):
  """NumPy, per token of ``x [N, D]``: experts ``[N, k]`` (the top-k by
  ``np.argsort``), weights ``[N, k]``, logits ``[N, E]``."""
  p = {k: np.asarray(v, np.float64) for k, v in params_of(layer).items()}
  bias = (np.zeros(layer.n_experts) if layer.selection_bias is None
          else np.asarray(layer.selection_bias[...], np.float64))
  e, g = layer.n_experts, layer.n_groups
  experts, weights, logits = [], [], []
  for xn in np.asarray(x, np.float64):
    z = xn @ p["router"]
    if layer.score == "softmax":
      scores = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    else:
      scores = 1 / (1 + np.exp(-z))
    choice = scores + bias
    if g > 1:
      best_two = np.sort(choice.reshape(g, e // g), axis=1)[:, -2:]
      kept = np.argsort(-best_two.sum(axis=1), kind="stable")[
          :layer.topk_groups]
      allowed = np.repeat(np.isin(np.arange(g), kept), e // g)
      choice = np.where(allowed, choice, -np.inf)
    top = np.argsort(-choice, kind="stable")[:layer.top_k]
    w = scores[top]
    if layer.normalize_topk:
      w = w / (w.sum() + 1e-20)
    experts.append(top)
    weights.append(w * layer.routed_scale)
    logits.append(z)
  return np.stack(experts), np.stack(weights), np.stack(logits)


def token_loop(layer, p, x, experts, np_=np):
  """``y [N, D]``: a Python loop over the tokens of ``x [N, D]`` and their
  ``experts [N, k]`` (fixed), scores recomputed from ``p`` with ``np_``
  (``np`` or ``jnp``, so that ``jax.grad`` sees the parameters). Without
  ``gate`` weights the experts are ``down(relu(up x)^2)``."""
  sigmoid = lambda z: 1 / (1 + np_.exp(-z))

  def mlp(xn, gate, up, down):
    if gate is None:
      return (np_.maximum(xn @ up, 0.0) ** 2) @ down
    g = xn @ gate
    return (g * sigmoid(g) * (xn @ up)) @ down

  rows = []
  for n in range(x.shape[0]):
    xn = x[n]
    z = xn @ p["router"]
    if layer.score == "softmax":
      scores = np_.exp(z - z.max()) / np_.sum(np_.exp(z - z.max()))
    else:
      scores = sigmoid(z)
    w = scores[np.asarray(experts[n])]
    if layer.normalize_topk:
      w = w / (np_.sum(w) + 1e-20)
    w = w * layer.routed_scale
    y = 0.0
    for i, wi in zip(np.asarray(experts[n]), w):
      gate = p["gate"][i] if "gate" in p else None
      y = y + wi * mlp(xn, gate, p["up"][i], p["down"][i])
    if "shared_up" in p:
      s = mlp(xn, p.get("shared_gate"), p["shared_up"], p["shared_down"])
      if "shared_sigmoid" in p:
        s = s * sigmoid(xn @ p["shared_sigmoid"])
      y = y + s
    rows.append(y)
  return np_.stack(rows)


def reference_aux(logits_per_layer, top_k, mask):
  """transformers' ``load_balancing_loss_func`` in NumPy (float64)."""
  e = logits_per_layer[0].shape[-1]
  assigned, probs, rows = np.zeros(e), np.zeros(e), 0.0
  for z in logits_per_layer:
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    for n in range(len(z)):
      for i in top[n]:
        assigned[i] += mask[n]
    probs += (p * mask[:, None]).sum(0)
    rows += mask.sum()
  return e * np.sum(assigned / rows * probs / rows)


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)),
                                              1e-30)


def inputs(seed=0):
  x = np.random.default_rng(seed).normal(size=(2, N // 2, D))
  return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_layer_matches_the_token_loop(name):
  layer = make(name)
  x = inputs()
  flat = np.asarray(x).reshape(N, D)
  experts, weights, logits = reference_choice(layer, flat)
  routing = layer.routing(x.reshape(N, D))
  # The same experts (as sets: top_k's order may differ) and weights.
  order = np.argsort(np.asarray(routing.experts), axis=1)
  ref_order = np.argsort(experts, axis=1)
  np.testing.assert_array_equal(
      np.take_along_axis(np.asarray(routing.experts), order, 1),
      np.take_along_axis(experts, ref_order, 1))
  assert rel(np.take_along_axis(np.asarray(routing.weights), order, 1),
             np.take_along_axis(weights, ref_order, 1)) < 1e-6
  assert rel(routing.logits, logits) < 1e-6
  p = {k: np.asarray(v, np.float64) for k, v in params_of(layer).items()}
  y_ref = token_loop(layer, p, flat, experts)
  call = nnx.jit(lambda layer, x, mask: layer(x, mask))
  y, stats = call(layer, x, None)
  assert y.shape == x.shape and y.dtype == jnp.float32
  assert rel(np.asarray(y).reshape(N, D), y_ref) < 1e-5
  mask = (np.arange(N) % 4 != 3).astype(np.float64)
  _, masked = call(layer, x, jnp.asarray(mask.reshape(2, N // 2)))
  for s, m in ((stats, np.ones(N)), (masked, mask)):
    aux = load_balancing_loss([s, s])
    assert abs(float(aux) - reference_aux([logits, logits], layer.top_k, m)
               ) < 1e-5 * abs(float(aux))
    load = np.zeros(layer.n_experts)
    for n in range(N):
      load[experts[n]] += m[n]
    np.testing.assert_allclose(s["load"], load)


@pytest.mark.parametrize("name", ["qwen3_next", pytest.param("kimi_deepseek", marks=pytest.mark.slow)])
def test_gradients_match_the_token_loop(name):
  layer = make(name)
  x = inputs(1)
  flat = x.reshape(N, D)
  experts, _, _ = reference_choice(layer, np.asarray(flat))
  cot = jnp.asarray(np.random.default_rng(2).normal(size=(N, D)),
                    jnp.float32)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

  def ours(params, x):
    y, stats = nnx.merge(graphdef, params, rest)(x.reshape(2, N // 2, D))
    return (jnp.sum(y.reshape(N, D) * cot)
            + 0.1 * load_balancing_loss([stats]))

  def reference(p, x):
    y = token_loop(layer, p, x, experts, np_=jnp)
    z = x @ p["router"]
    probs = jax.nn.softmax(z, axis=-1)
    top = jax.lax.top_k(probs, layer.top_k)[1]
    f = jnp.sum(jax.nn.one_hot(top, layer.n_experts), axis=(0, 1)) / N
    return jnp.sum(y * cot) + 0.1 * layer.n_experts * jnp.sum(
        f * jnp.mean(probs, axis=0))

  grads, dx = jax.jit(jax.grad(ours, argnums=(0, 1)))(params, flat)
  ref_grads, ref_dx = jax.jit(jax.grad(reference, argnums=(0, 1)))(
      params_of(layer), flat)
  assert rel(dx, ref_dx) < 1e-5
  flat_grads = dict(params_of(nnx.merge(graphdef, grads, rest)))
  assert set(flat_grads) == set(ref_grads)
  for k, g in flat_grads.items():
    assert rel(g, ref_grads[k]) < 1e-5, k


def test_jit_equals_eager():
  """A jitted call equals the eager one (the sort and ragged_dot traced)."""
  layer = make("jamba")
  x = inputs(2)
  graphdef, state = nnx.split(layer)
  y = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0])(state, x)
  assert rel(y, layer(x)[0]) < 1e-6


def test_balance_moves_the_bias_towards_the_idle_experts():
  layer = make("kimi_deepseek")
  before = np.asarray(layer.selection_bias[...])
  load = jnp.asarray([5.0, 0.0, 3.0, 3.0, 1.0, 9.0, 3.0, 0.0])
  layer.balance(load, 0.01)
  step = np.asarray(layer.selection_bias[...]) - before
  np.testing.assert_allclose(step, 0.01 * np.sign(3.0 - np.asarray(load)),
                             atol=1e-7)


@pytest.mark.parametrize("options, match", [
    (dict(score="relu"), "score must be one of"),
    (dict(top_k=9), "top_k = 9 exceeds n_experts = 8"),
    (dict(n_groups=3), "n_groups = 3 must divide n_experts = 8"),
    (dict(n_groups=2, topk_groups=3), "topk_groups = 3 exceeds n_groups"),
    (dict(shared_gate=True), "shared_gate needs a shared expert"),
])
def test_bad_options(options, match):
  kw = {**dict(n_experts=8, top_k=2, expert_dim=4), **options}
  with pytest.raises(ValueError, match=match):
    MoE(D, **kw, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", ["granite", "nemotron_h"])
def test_expert_parallel_forward_equals_one_device(name):
  """The grouped matmuls split over an ``expert`` axis of 8 devices (the
  ``shard_map`` dispatch), gated and non-gated experts."""
  from lin_attn_jax import sharding as shd
  layer = make(name) if name == "nemotron_h" else MoE(
      D, **{**ROUTERS[name], "n_experts": 8}, rngs=nnx.Rngs(3))
  graphdef, state = nnx.split(layer)
  x = jnp.tile(inputs(), (4, 1, 1))                             # [8, 5, D]
  call = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x)[0])
  want = call(state, x)
  mesh = shd.make_mesh("expert=8", jax.devices()[:8])
  with jax.set_mesh(mesh):
    got = call(state, x)
  assert rel(got, want) < 1e-6


def test_relu2_experts_have_no_gate():
  layer = make("nemotron_h")
  assert layer.gate is None and layer.shared.gate is None
  assert layer.up.shape == (8, D, 8) and layer.down.shape == (8, 8, D)
  with pytest.raises(ValueError, match="activation must be one of"):
    MoE(D, n_experts=4, top_k=2, expert_dim=8, activation="gelu",
        rngs=nnx.Rngs(0))
