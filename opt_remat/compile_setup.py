"""How a ``torch.compile`` backend is set up around a partitioner: the decompositions table, inductor
with a custom partitioner, and AOTAutograd with plain FX graphs. ``api.backend`` (training),
``capture`` (recording the joint graphs) and ``verify`` (save-all reference steps) use the same
set-up, so that the graph a plan is solved on is the graph training sees."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch._inductor.compile_fx import compile_fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn
from torch._inductor.decomposition import select_decomp_table


def decompositions(name: str | Mapping | None) -> Mapping:
    """The decompositions table: ``"inductor"`` (inductor's own), ``"none"``/None, or a table."""
    if name is None or name == "none":
        return {}
    if name == "inductor":
        return select_decomp_table()
    if isinstance(name, Mapping):
        return name
    raise ValueError(f"decompositions must be 'inductor', 'none' or a table, got {name!r}")


def inductor_compile(gm: fx.GraphModule, example_inputs: Sequence[Any], partitioner: CustomPartitionerFn,
                     *, cache: bool = True) -> Any:
    """Inductor's ``compile_fx`` with ``partitioner`` as its custom partitioner. ``cache=False``:
    inductor's FX graph cache and AOTAutograd's cache off (they key on the partitioner's uuid; a
    cache hit would skip the partitioner)."""
    caches: dict[str, Any] = {} if cache else {"fx_graph_cache": False}
    autograd_caches: dict[str, Any] = {} if cache else {"enable_autograd_cache": False}
    with inductor_config.patch(custom_partitioner_fn=partitioner, **caches), functorch_config.patch(**autograd_caches):
        return compile_fx(gm, example_inputs)


def aot_graphs(partition_fn: Callable[..., Any], decomps: str | Mapping | None,
               graph_compiler: Callable[..., Any] = boxed_nop) -> Callable[..., Any]:
    """AOTAutograd with ``partition_fn``, running the partitioned FX graphs through
    ``graph_compiler`` (default: as they are, boxed, so that they free saved values after their last
    use as inductor does)."""
    return aot_autograd(fw_compiler=graph_compiler, bw_compiler=graph_compiler, partition_fn=partition_fn,
                        decompositions=decompositions(decomps), keep_inference_input_mutations=True)
