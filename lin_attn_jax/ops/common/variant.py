"""Variants on a core: one adapter turns a core's forms into a variant's.

A variant on a core (GLA, simple GLA, RetNet and linear attention on the
gated-linear core; Gated DeltaNet and KDA on the delta rule) differs from the
core only in its leading arguments: a gate of another shape, a fixed decay, an
extra value column. A ``Variant`` says how its leading arguments become the
core's, and ``Variant.form`` builds each of its forms from the core's form of
the same name. The variant's folder holds one file per form, each one call:

    chunk_gla = GLA.form(chunk_gated_linear, __name__, doc)

The built form takes the variant's leading parameters, then every other
parameter of the core's form (options, ``state``), then the variant's own
keywords; its ``__name__``, ``__module__`` and signature are those of the
form file it is built in.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_EMPTY = inspect.Parameter.empty

FORMS = ("naive", "parallel", "chunk", "recurrent", "step")


def form_name(op: str, form: str) -> str:
  """The public name of ``op``'s ``form``: ``naive_recurrent_<op>``,
  ``parallel_<op>``, ``chunk_<op>``, ``recurrent_<op>`` or ``<op>_step``."""
  if form not in FORMS:
    raise ValueError(f"form must be one of {FORMS}, got {form!r}")
  if form == "step":
    return f"{op}_step"
  return f"{'naive_recurrent' if form == 'naive' else form}_{op}"


def _parameter(spec, kind):
  name, default = spec if isinstance(spec, tuple) else (spec, _EMPTY)
  return inspect.Parameter(name, kind, default=default)


@dataclasses.dataclass(frozen=True)
class Variant:
  """How a variant's leading arguments map onto its core's.

  Attributes:
    name: the op's name (``"gla"``); its forms are named from it.
    params: the variant's leading positional parameters, a name or a
      ``(name, default)`` pair each (``("q", "k", "v", "g")``).
    core_arity: how many leading positional parameters of the core's forms
      they replace (``4`` for ``(q, k, v, g)``).
    to_core: ``to_core(step, **leading) -> tuple``: checks the variant's
      leading arguments and returns the core's (``step`` is True for the
      decoding step, whose arrays have no time axis).
    keywords: keyword-only parameters of the variant alone, with defaults;
      they reach ``to_core`` and ``from_core``, never the core.
    step_keywords: names in ``params`` that the step takes by keyword only
      (after ``state``).
    from_core: ``from_core(outputs, **leading) -> outputs``, applied to what
      the core's form returns; None returns it unchanged.
    fixed: keyword arguments the variant always gives those of the core's
      forms that take them; they leave the built form's signature (a variant
      keyword of the same name takes the place of the core's).
  """
  name: str
  params: tuple[Any, ...]
  core_arity: int
  to_core: Callable[..., tuple]
  keywords: tuple[tuple[str, Any], ...] = ()
  step_keywords: tuple[str, ...] = ()
  from_core: Callable[..., Any] | None = None
  fixed: tuple[tuple[str, Any], ...] = ()

  def signature(self, core_form: Callable, step: bool) -> inspect.Signature:
    """The built form's signature (see the module docstring)."""
    core = list(inspect.signature(core_form).parameters.values())
    hidden = {name for name, _ in self.keywords + self.fixed}
    rest = [p for p in core[self.core_arity:] if p.name not in hidden]
    leading, late = [], []
    for spec in self.params:
      name = spec[0] if isinstance(spec, tuple) else spec
      if step and name in self.step_keywords:
        late.append(_parameter(spec, _KEYWORD))
      else:
        leading.append(_parameter(spec, _POSITIONAL))
    late += [_parameter(spec, _KEYWORD) for spec in self.keywords]
    positional = [p for p in rest if p.kind == _POSITIONAL]
    keyword = [p for p in rest if p.kind != _POSITIONAL]
    return inspect.Signature(leading + positional + late + keyword)

  def form(self, core_form: Callable, module: str, doc: str) -> Callable:
    """Builds the variant's form from the core's ``core_form``.

    Args:
      core_form: the core's form of the same kind (``chunk_gated_linear``).
      module: the form file's ``__name__``; its last part names the form
        (``lin_attn_jax.ops.gla.chunk`` builds ``chunk_gla``).
      doc: the built form's docstring.
    Returns:
      A function with the signature of ``signature(core_form, step)``.
    """
    form = module.rsplit(".", 1)[-1]
    step = form == "step"
    signature = self.signature(core_form, step)
    own = [spec[0] if isinstance(spec, tuple) else spec
           for spec in self.params] + [name for name, _ in self.keywords]
    var_keyword = [p.name for p in signature.parameters.values()
                   if p.kind == inspect.Parameter.VAR_KEYWORD]
    core_params = inspect.signature(core_form).parameters
    fixed = {name: value for name, value in self.fixed
             if name in core_params or any(
                 p.kind == inspect.Parameter.VAR_KEYWORD
                 for p in core_params.values())}

    def variant_form(*args, **kwargs):
      bound = signature.bind(*args, **kwargs)
      bound.apply_defaults()
      arguments = dict(bound.arguments)
      leading = {name: arguments.pop(name) for name in own}
      for name in var_keyword:
        arguments.update(arguments.pop(name))
      outputs = core_form(*self.to_core(step, **leading), **arguments,
                          **fixed)
      if self.from_core is None:
        return outputs
      return self.from_core(outputs, **leading)

    variant_form.__name__ = variant_form.__qualname__ = form_name(
        self.name, form)
    variant_form.__module__ = module
    variant_form.__doc__ = doc
    variant_form.__signature__ = signature
    return variant_form
