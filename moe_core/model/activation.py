"""The FFN activations the model offers and the width of their input projection.

Torch-free, so that config validation (moe_core.config.load) and memory estimates read the same names
and widths as the model (moe_core.model.experts.ffn_activation applies them).
"""

FFN_ACTIVATIONS = ("relu", "swiglu")


def in_width(activation: str) -> int:
    """How many hidden-wide outputs an FFN's input projection has: SwiGLU's gate and up (2), ReLU's one."""
    return 2 if activation == "swiglu" else 1
