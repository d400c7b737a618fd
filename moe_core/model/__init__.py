"""The MoE model: ``gating`` (GShard routing by sorting), ``capacity`` (buffer sizes, no torch),
``heads`` (attention head counts, no torch), ``experts``, ``layer`` (the MoE layer),
``transformer`` (a small decoder transformer), ``activation``, ``data`` (synthetic learnable tokens)."""
