"""The memory and compute planner (layer L5): what training a real model costs, by formula.

``fpsim.plan.memory`` gives bytes per parameter and per device (weights, gradients, master copy, optimizer
states, activations) for a recipe, optimizer, data-parallel degree, ZeRO stage, checkpointing mode and
flash attention on or off; ``fpsim.plan.compute_optimal`` the Chinchilla-optimal parameters and tokens
for a FLOP budget; ``fpsim.plan.training_time`` the time on a named accelerator. The formulas and the
published figures they reproduce are in docs/planner.md. The command line is ``fpsim plan``.
"""

from __future__ import annotations

from .compute import (
    ACCELERATORS,
    CHINCHILLA_TABLE3,
    PRECISIONS,
    Accelerator,
    accelerator_names,
    compute_optimal,
    get_accelerator,
    step_flops,
    training_flops,
    training_time,
)
from .memory import (
    CHECKPOINT_MODES,
    MEMORY_KEYS,
    OPTIMIZERS,
    QLORA_CONSTANT_BITS,
    MemoryPlan,
    Recipe,
    activation_bytes,
    activation_terms,
    get_recipe,
    memory,
    plot_memory,
    recipe_names,
)
from .models import ModelSpec, get_model, model_names

__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "CHECKPOINT_MODES",
    "CHINCHILLA_TABLE3",
    "MEMORY_KEYS",
    "MemoryPlan",
    "ModelSpec",
    "OPTIMIZERS",
    "PRECISIONS",
    "QLORA_CONSTANT_BITS",
    "Recipe",
    "accelerator_names",
    "activation_bytes",
    "activation_terms",
    "compute_optimal",
    "get_accelerator",
    "get_model",
    "get_recipe",
    "memory",
    "model_names",
    "plot_memory",
    "recipe_names",
    "step_flops",
    "training_flops",
    "training_time",
]
