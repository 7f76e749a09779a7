"""lm-evaluation-harness's ``LM`` interface over a workdir's model, without
torch (the ``lm_eval`` extra: ``pip install -e '.[lm_eval]'``).

  import lm_eval
  from experiments.lm_eval_model import LinAttnLM
  results = lm_eval.simple_evaluate(model=LinAttnLM("runs/tiny"),
                                    tasks=["lambada_openai"])

or, once this module is imported, the registry name ``lin_attn_jax``:
``lm_eval.simple_evaluate(model="lin_attn_jax",
model_args="workdir=runs/tiny")``. The workdir is one of
``experiments.train`` or ``experiments.convert`` (``config.json`` +
``params/``, with its tokenizer files, else bytes).

lm-eval's ``lm_eval.api.model.LM`` imports no torch (its ``hf`` extra
does), so the three request types map onto this repository's own pieces:

- ``loglikelihood``: ``experiments.evaluate.score_requests`` (the requests
  encoded as lm-eval's ``TemplateLM`` encodes them, ``(logprob,
  is_greedy)`` per request), the context cut on the left to
  ``max_length`` tokens;
- ``loglikelihood_rolling``: a document's tokens after the bos (else eos)
  id in lm-eval's disjoint rolling windows of ``max_length``
  (``lm_eval.utils.get_rolling_token_windows``), each token scored once;
- ``generate_until``: ``experiments.generate.continue_prompts`` (batched,
  left-padded prompts; stops at the tokenizer's eos and at ``until``),
  greedy unless the request samples (``do_sample``, ``temperature``,
  ``top_k``, ``top_p``).

Nothing here is imported by the library or the other entry points.
"""

from __future__ import annotations

import jax
from lm_eval import utils as harness_utils
from lm_eval.api.model import LM as HarnessLM
from lm_eval.api.registry import register_model

from experiments import evaluate, generate
from lin_attn_jax.ops.common import checks

# generate_until's keyword arguments that sampling reads; lm-eval's
# do_sample=False (its default) is greedy whatever the others say.
SAMPLING = {"temperature": float, "top_k": int, "top_p": float}


def _batch_size(value) -> int:
  """lm-eval passes ints, digit strings, ``"auto"`` or None."""
  if isinstance(value, str) and value.isdigit():
    value = int(value)
  if value is None or isinstance(value, str):
    return 8
  return checks.positive_int("batch_size", value)


@register_model("lin_attn_jax")
class LinAttnLM(HarnessLM):
  """A workdir's model behind lm-eval's ``LM`` (see the module docstring).

  Args:
    workdir: ``config.json`` + ``params/`` (and tokenizer files).
    tokenizer: None (the workdir's, else bytes), ``"bytes"`` or a path
      (``lin_attn_jax.data.load_tokenizer``).
    batch_size: requests per forward pass (``"auto"`` or None: 8).
    max_length: tokens of context a scored token sees at most.
    max_gen_toks: new tokens of ``generate_until`` unless a request says.
    seed: of the sampling keys, when a request samples.
    max_batch_size, device: lm-eval's, accepted and unused (JAX places the
      arrays).
  """

  def __init__(self, workdir: str, tokenizer: str | None = None,
               batch_size: int | str | None = 8, max_length: int = 2048,
               max_gen_toks: int = 256, seed: int = 0,
               max_batch_size=None, device=None):
    super().__init__()
    del max_batch_size, device
    self.lm = generate.load_workdir(workdir)
    self.tokenizer = generate.load_tokenizer(tokenizer, workdir)
    self.batch_size = _batch_size(batch_size)
    self.max_length = checks.positive_int("max_length", int(max_length))
    self.max_gen_toks = checks.positive_int("max_gen_toks", int(max_gen_toks))
    self.rng = jax.random.key(int(seed))

  @property
  def prefix_id(self) -> int:
    """The id a document's first token is scored after: bos, else eos."""
    for value in (self.tokenizer.bos_id, self.tokenizer.eos_id):
      if value is not None:
        return value
    raise ValueError("scoring a text from its first token needs a bos or eos "
                     f"id; the tokenizer has neither ({self.tokenizer!r})")

  def loglikelihood(self, requests, disable_tqdm: bool = False
                    ) -> list[tuple[float, bool]]:
    del disable_tqdm
    pairs = [req.args for req in requests]
    encoded = [(ids[-(self.max_length + 1):], n) for ids, n in
               evaluate.encode_requests(self.tokenizer, pairs)]
    results = evaluate.score_tokens(self.lm, encoded, self.batch_size)
    for pair, result in zip(pairs, results):
      self.cache_hook.add_partial("loglikelihood", pair, result)
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False
                            ) -> list[float]:
    del disable_tqdm
    windows, owners = [], []
    for number, req in enumerate(requests):
      tokens = self.tokenizer.encode(req.args[0])
      for context, predicted in map(
          harness_utils.make_disjoint_window,
          harness_utils.get_rolling_token_windows(
              token_list=tokens, prefix_token=self.prefix_id,
              max_seq_len=self.max_length, context_len=1)):
        windows.append((context + predicted, len(predicted)))
        owners.append(number)
    totals = [0.0] * len(requests)
    for owner, (score, _) in zip(owners, evaluate.score_tokens(
        self.lm, windows, self.batch_size)):
      totals[owner] += score
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
    return totals

  def generate_until(self, requests, disable_tqdm: bool = False
                     ) -> list[str]:
    del disable_tqdm
    groups: dict[tuple, list[int]] = {}
    for number, req in enumerate(requests):
      groups.setdefault(self._generation_key(req.args[1]), []).append(number)
    out = [""] * len(requests)
    for (until, max_new, sampling), numbers in groups.items():
      options = dict(sampling)
      for start in range(0, len(numbers), self.batch_size):
        chunk = numbers[start:start + self.batch_size]
        if options:
          self.rng, options["rng"] = jax.random.split(self.rng)
        texts = generate.continue_prompts(
            self.lm, self.tokenizer, [requests[i].args[0] for i in chunk],
            max_new_tokens=max_new, stops=list(until), **options)
        for number, text in zip(chunk, texts):
          out[number] = text
          self.cache_hook.add_partial("generate_until", requests[number].args,
                                      text)
    return out

  def _generation_key(self, kwargs) -> tuple:
    """``(stop strings, max new tokens, sampling options)`` of a request's
    ``gen_kwargs``; raises ``ValueError`` naming an unknown one."""
    kwargs = dict(kwargs or {})
    until = kwargs.pop("until", None) or []
    if isinstance(until, str):
      until = [until]
    max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
    do_sample = bool(kwargs.pop("do_sample", False))
    sampling = {k: kind(kwargs.pop(k)) for k, kind in SAMPLING.items()
                if kwargs.get(k) is not None}
    for k in SAMPLING:
      kwargs.pop(k, None)
    if kwargs:
      raise ValueError(f"generate_until: unknown gen_kwargs "
                       f"{sorted(kwargs)}; known: until, max_gen_toks, "
                       f"do_sample, {', '.join(SAMPLING)}")
    if not do_sample or not sampling.get("temperature", 1.0):
      sampling = {}
    else:
      sampling.setdefault("temperature", 1.0)
    return (tuple(until), max_new, tuple(sorted(sampling.items())))
